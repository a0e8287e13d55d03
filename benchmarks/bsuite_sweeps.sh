#!/usr/bin/env bash
# Issue 22 acceptance: bsuite's credit-assignment experiments, scored by bsuite's own analysis (algorithms.suite).
#   benchmarks/bsuite_sweeps.sh [OUT_DIR] [WORKERS]
# 1. Tabular VCBM on umbrella_length under bsuite's full protocol (23 chain lengths x 10,000 episodes).
# 2. The short protocol (algorithms/suite.py SHORT_PROTOCOL: umbrella chains 1, 3, 6, 10 at 1,000 episodes;
#    discounting_chain settings 0 and 1 at 200 episodes), 3 seeds: PPO, PPO + rudder / ircr / rrd /
#    vcbm_bookmark, and DQN. Every algo sees bsuite's integer observation view (vcbm_bookmark's causal test
#    needs integer components); vcbm_bookmark is left out of discounting_chain, whose five actions its
#    two-action test cannot compare.
# Finished runs in OUT_DIR are reused. The outputs (not the runs) are copied to benchmarks/results/ for
# benchmarks/make_results.py.
set -euo pipefail
out="${1:-runs/bsuite_sweeps}"
workers="${2:-2}"
cd "$(dirname "$0")/.."
view=(--hyperparams "env_kwargs={integer_observations: true}")
publish() {  # results dir -> benchmarks/results/<name>
    mkdir -p "benchmarks/results/$2"
    cp "$1"/{results.json,run.json,table.md} "benchmarks/results/$2/"
    find "$1" -maxdepth 1 -name '*.png' -exec cp {} "benchmarks/results/$2/" \;
}
nice -n 10 python -m algorithms.suite --experiment umbrella_length --algos vcbm --workers "$workers" --out "$out/vcbm_umbrella_length"
publish "$out/vcbm_umbrella_length" bsuite_vcbm_umbrella_length
nice -n 10 python -m algorithms.suite --short --experiment umbrella_length --seeds 3 --workers "$workers" \
    --algos ppo ppo+rudder ppo+ircr ppo+rrd ppo+vcbm_bookmark dqn --out "$out/short_umbrella_length" "${view[@]}"
publish "$out/short_umbrella_length" bsuite_short_umbrella_length
nice -n 10 python -m algorithms.suite --short --experiment discounting_chain --seeds 3 --workers "$workers" \
    --algos ppo ppo+rudder ppo+ircr ppo+rrd dqn --out "$out/short_discounting_chain" "${view[@]}"
publish "$out/short_discounting_chain" bsuite_short_discounting_chain
python benchmarks/make_results.py
