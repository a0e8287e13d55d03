#!/usr/bin/env bash
# bsuite's credit-assignment experiments, scored by bsuite's own analysis (algorithms.suite).
#   benchmarks/bsuite_sweeps.sh [OUT_DIR] [WORKERS] [PART...]
# PART: vcbm_full, umbrella_length, umbrella_distract, discounting_chain (default: all four, in that order), e.g.
#   benchmarks/bsuite_sweeps.sh runs/bsuite_sweeps 2 umbrella_length discounting_chain
# 1. Tabular VCBM on umbrella_length under bsuite's full protocol (23 chain lengths x 10,000 episodes).
# 2. The short protocol (algorithms/suite.py SHORT_PROTOCOL: umbrella_length chains 1, 3, 6, 10 and umbrella_distract
#    1 to 17 distractor bits at 1,000 episodes; discounting_chain settings 0 and 1 at 200 episodes), 3 seeds: ppo and
#    dqn, each alone and with every reward rule (rudder, ircr, rrd, vcbm_bookmark: the rule's rewards in PPO's GAE and
#    in DQN's relabelled replay buffer), and vcbm. The SB3 baselines take their bsuite zoo entries
#    (zoo_configs/ppo.yml, dqn.yml: chosen by benchmarks/bsuite_baselines_pilot.py outside these settings and seeds).
#    Every algo sees bsuite's integer observation view (vcbm_bookmark's causal test needs integer components);
#    vcbm_bookmark and vcbm are left out of discounting_chain, whose five actions their two-action test cannot compare.
# Finished runs in OUT_DIR are reused. The outputs (not the runs) are copied to benchmarks/results/ for
# benchmarks/make_results.py.
set -euo pipefail
out="${1:-runs/bsuite_sweeps}"
workers="${2:-2}"
parts=("${@:3}")
[ "${#parts[@]}" -gt 0 ] || parts=(vcbm_full umbrella_length umbrella_distract discounting_chain)
for part in "${parts[@]}"; do
    case "$part" in
        vcbm_full | umbrella_length | umbrella_distract | discounting_chain) ;;
        *) echo "bsuite_sweeps.sh: part $part: expected vcbm_full, umbrella_length, umbrella_distract or discounting_chain" >&2; exit 2 ;;
    esac
done
wanted() { [[ " ${parts[*]} " == *" $1 "* ]]; }
cd "$(dirname "$0")/.."
view=(--hyperparams "env_kwargs={integer_observations: true}")
publish() {  # results dir -> benchmarks/results/<name>
    mkdir -p "benchmarks/results/$2"
    cp "$1"/{results.json,run.json,table.md} "benchmarks/results/$2/"
    find "$1" -maxdepth 1 -name '*.png' -exec cp {} "benchmarks/results/$2/" \;
}
rules=(rudder ircr rrd vcbm_bookmark)
with_rules() {  # RULE... -> ppo+RULE dqn+RULE ... (rule by rule, both learners, so that a stopped sweep's finished
    # runs cover whole rules; the runs are reused by a later invocation)
    for rule in "$@"; do echo "ppo+$rule dqn+$rule"; done
}
if wanted vcbm_full; then
    nice -n 10 python -m algorithms.suite --experiment umbrella_length --algos vcbm --workers "$workers" --out "$out/vcbm_umbrella_length"
    publish "$out/vcbm_umbrella_length" bsuite_vcbm_umbrella_length
fi
for experiment in umbrella_length umbrella_distract; do
    wanted "$experiment" || continue
    # shellcheck disable=SC2046
    nice -n 10 python -m algorithms.suite --short --experiment "$experiment" --seeds 3 --workers "$workers" \
        --algos ppo dqn vcbm $(with_rules "${rules[@]}") --out "$out/short_$experiment" "${view[@]}"
    publish "$out/short_$experiment" "bsuite_short_$experiment"
done
if wanted discounting_chain; then
    # shellcheck disable=SC2046
    nice -n 10 python -m algorithms.suite --short --experiment discounting_chain --seeds 3 --workers "$workers" \
        --algos ppo dqn $(with_rules rudder ircr rrd) --out "$out/short_discounting_chain" "${view[@]}"
    publish "$out/short_discounting_chain" bsuite_short_discounting_chain
fi
python benchmarks/make_results.py
