"""Pilot for the SB3 baselines' bsuite zoo entries: candidate settings of ppo, a2c and dqn on umbrella_length, chosen on
settings and seeds outside the scored sweeps (chain lengths 2, 5 and 8, seeds 100-101 in rounds 1-2; chains 2 and 5,
seeds 100-102 in round 3; the short protocol scores chains 1, 3, 6 and 10 on seeds 0-2, the chains 1-4 check chains
1-4 on seeds 0-2), at the short protocol's budget (1,000 episodes per setting).

    python benchmarks/bsuite_baselines_pilot.py --round N [--out runs/bsuite_pilot] [--workers 2]

The measure: the rate of optimal first decisions (`final_correct_rate`, the env's `first_decision_optimal`) over
the last 200 episodes (round 1) or over the whole run (round 2: what bsuite's regret, averaged over every episode,
rewards), mean over settings and seeds, and the worst setting's mean. Writes
benchmarks/results/bsuite_baselines_pilot_round<N>.json; the candidate chosen for each algo (the best mean) goes to
zoo_configs/<algo>.yml by hand, with this file named there (round 3: `chosen`, by the rule below).

Round 1's choices learned (0.76 ppo, 0.87 dqn over the last 200 episodes) but too slowly for bsuite's regret: the
short sweep of umbrella_length then gave regret 0.65-1.0 (ppo) and 0.54-0.72 (dqn). Round 2 measures the whole run
and tries settings that update more often, still on the same held-out settings and seeds.

Round 2's choices gave, on chains 1-4 (seeds 0-2), regret 0.25/0.28/0.43/0.52 (ppo) and 0.12/0.34/0.42/0.61 (dqn):
chain 4 above bsuite's 0.5 line, i.e. more than a quarter of all first decisions wrong. bsuite's regret averages
every episode, so round 3 aims at learning in few episodes: PPO with shorter rollouts, GAE lambda 1 or lower,
larger steps and smaller nets; DQN with a short warm-up, little exploration (a 2-action bandit at the first step
corrects a wrong greedy choice by itself), larger batches and steps. Round 3 plays held-out chains 2 and 5 (settings
1 and 4; chain 5 is the closest held-out proxy for chain 4) on seeds 100-102, and picks per algo the best
worst-setting mean (the longer chain decides whether the chains 1-4 check passes), ties to the best mean. Budget,
fixed from round 2's timings before any round-3 result: 11 candidates x 2 settings x 3 seeds = 66 runs, about 1,300
s of run time (PPO 5-20 s, DQN 15-35 s per run at chain 5 per unit of gradient steps), ~20 minutes on 2 workers
while another benchmark shares the cores.

Round 4 (PPO only, same settings, seeds and rule): round 3's best PPO (32-step rollouts in minibatches of 8, GAE
lambda 1) still chose right on only 0.67 of chain 5's first decisions, short of the 0.75 that bsuite's 0.5 regret line
asks for, while more gradient steps per sample had helped (minibatches of 8 beat 32). Round 4 varies those steps
(20 epochs, minibatches of 4, 64-step rollouts), GAE lambda 0.5 and unnormalised advantages around round 3's choice.
Budget, fixed from round 3's timings: 6 candidates x 2 settings x 3 seeds = 36 runs, about 1,300 s of run time
(10-25 s at chain 2, 40-90 s at chain 5), ~12 minutes on 2 workers.

Round 5 (DQN only, same settings, seeds and rule): with round 3's DQN the chains 1-4 check left chain 4 at regret
0.507, just above the line. Round 5 varies round 3's choice (batch 128, target updates every 25 steps, learning rate
5e-3). Budget, fixed from round 3's timings (20 s at chain 2, 50-65 s at chain 5 under load): 4 candidates x 2
settings x 3 seeds = 24 runs, about 1,000 s of run time, ~9 minutes on 2 workers.

Outcome (benchmarks/results/bsuite_baselines_pilot_round3.json to _round5.json; the zoo entries name them): ppo keeps
round 3's "n32-b8-e10-lr1e-3-l1" (0.84 at chain 2, 0.67 at chain 5), dqn round 3's "ls32-tu50-e0.02-lr3e-3-gs2-b64-a64"
(0.85, 0.75). The chains 1-4 check with them (seeds 0-2,
benchmarks/results/bsuite_umbrella_length_chains_1_to_4_sb3_baselines) gave regret 0.22/0.30/0.44/0.64 (ppo) and
0.05/0.28/0.42/0.51 (dqn): chain 4 still above 0.5 for both, ppo's worse than round 2's 0.52 although its held-out
chain-5 rate was higher (0.67 against 0.63): three seeds separate these candidates less than they differ.

Round 6 (ppo and dqn): chain 4 of the check is the one that fails, so round 6 tunes on chains 4 and 5 (settings 3
and 4) with seeds 100-105: other seeds than the check's 0-2, and six of them, since three separated rounds 3-5's
candidates less than they differed. Each algo's reference is its current zoo entry. DQN: SB3 2.9.2's `n_steps`
(n-step returns through its NStepReplayBuffer): with n at least the chain length (n = 10 covers every chain of the
short protocol) the first decision's target is the episode's whole return in one update instead of a bootstrap that
needs chain-length target updates to carry the final reward back; n = 3 is the middle ground (less distractor noise
in the target, some bootstrapping left); n = 10 with 4 gradient steps per step asks whether more updates help once
the target is direct. PPO: its defaults already have no entropy bonus and separate policy and value nets, and rounds
3-4 tried shorter rollouts, smaller nets and unnormalised advantages, so round 6 varies what bounds each update's
step: a clip range of 0.5, a learning rate of 3e-3, and both. Rule as in rounds 3-5: per algo the best worst-setting
mean, ties to the best mean; the zoo entry changes only where that is not the reference. Budget, fixed from two
timing runs at chain 5 on seed 200 (not a round-6 seed; PPO 29 s, DQN n = 10 33 s with another helper's job on the
cores): 8 candidates x 2 settings x 6 seeds = 96 runs, about 3,300 s of run time (DQN with 4 gradient steps about
twice as long), ~30 minutes on 2 workers. Caveat fixed before the results: under a reward rule (`dqn+RULE`) the
runner's own replay buffer replaces SB3's, and SB3 then ignores `n_steps` with a warning, so an n-step entry would
make the plain baseline n-step and its credit-rule runs one-step.

Round 6's outcome (benchmarks/results/bsuite_baselines_pilot_round6.json; 2,632 s of wall time, the cores shared
with other jobs at a load of 5-7): rates at chains 4 / 5, mean over seeds 100-105. PPO keeps its entry (0.705 /
0.623); a clip range of 0.5 (0.635 / 0.554), a learning rate of 3e-3 (0.652 / 0.589) and both (0.568 / 0.544) did
worse. DQN takes n = 10 (0.834 / 0.773, against the entry's 0.760 / 0.713; n = 3 0.771 / 0.740; n = 10 with 4
gradient steps 0.808 / 0.736): its zoo entry gains `n_steps: 10`. The chains 1-4 check rerun with it
(seeds 0-2, benchmarks/results/bsuite_umbrella_length_chains_1_to_4_sb3_baselines, no run reused) gave regret
0.05/0.15/0.22/0.38 (dqn, below 0.5 on every chain; 0.05/0.28/0.42/0.51 before) and, with ppo's entry unchanged,
the same 0.22/0.30/0.44/0.64 (ppo) as before: chain 4 still fails for ppo.

Round 7 (PPO on discounting_chain): the shared bsuite entry's 32-step rollouts never hold a whole 100-step
discounting_chain episode, so under a credit rule no episode reached the rule (such runs are now refused). Round 7
picks a discounting_chain entry whose rollouts hold whole episodes, on settings 2-4 (the short protocol scores 0 and
1) with seeds 100-102, at the short protocol's 200 episodes, by the rule of rounds 3-6 on the rate of optimal first
actions over the whole run: 100-step rollouts in minibatches of 10 (the umbrella entry's steps per sample) or 25,
200-step rollouts in minibatches of 25, and the first with a learning rate of 3e-4. Budget, from the
discounting_chain sweep's 47 s a run: 4 candidates x 3 settings x 3 seeds = 36 runs, ~15 minutes on 2 workers.
Outcome (bsuite_baselines_pilot_round7.json, 12 minutes): n200-b25 0.698 (worst setting 0.617), n100-b10 0.356,
n100-b25 0.247, n100-b10 at lr 3e-4 0.412; zoo_configs/ppo.yml's discounting_chain entry takes n200-b25.

Round 8 (PPO on umbrella_length, round 6's chains 4-5 and seeds 100-105): SB3 clips the joint norm of the policy's
and the critic's gradients at 0.5; early on the critic's error dominates that norm, most where the return (and so
the advantage) is far from V, so the clip shrinks the policy's steps on the most informative minibatches. Round 8
lifts the clip (max_grad_norm 100), alone, with 5 epochs, and with a learning rate of 5e-4, against round 6's
reference runs (same settings, seeds and deterministic code; read from round 6's JSON, not rerun). Budget, from
round 6's timings: 3 candidates x 2 settings x 6 seeds = 36 runs, ~16 minutes on 2 workers.
Outcome (bsuite_baselines_pilot_round8.json, 4 minutes on idle cores): rates at chains 4 / 5, mean over seeds
100-105: max_grad_norm 100 0.764 / 0.667 (mean 0.715), with 5 epochs 0.780 / 0.646, with lr 5e-4 0.758 / 0.626,
round 6's reference 0.705 / 0.623: the umbrella entry takes max_grad_norm 100 (discounting_chain's entry keeps 0.5).
The chains 1-4 check with it (seeds 0-2, benchmarks/results/bsuite_umbrella_length_chains_1_to_4_sb3_baselines, no
run reused) gave ppo regret 0.18/0.28/0.48/0.60 (0.22/0.30/0.44/0.64 before): better at chains 1, 2 and 4, chain 4
still above 0.5; dqn reproduced 0.05/0.15/0.22/0.38 exactly.

Round 9 (PPO on umbrella_length, round 6's chains 4-5 and seeds 100-105): the check's bsuite logs show PPO's regret
per 100 episodes levelling off at chain 4 (0.4-0.6 from episode 300 on: about three first decisions in four right)
rather than falling slowly, so round 9 aims at what keeps the first decision noisy once the signal is found. With the
joint clip lifted, two choices that round 4 judged under the 0.5 clip are tried again: unnormalised advantages
(SB3 normalises within each minibatch of 8 steps, so the mean and spread it divides by are themselves noisy) and
minibatches of 16. And a linear policy (net_arch pi [], the critic's 64-64 kept): the best first decision is a
linear function of the observation (take the umbrella iff the need bit is set), while the 64-64 policy net gives the
20 distractor bits and the random has-umbrella bit many more weights to pick up the reward noise with; alone and
with unnormalised advantages. The reference is round 8's choice, read from round 8's JSON (same settings, seeds and
deterministic code). Rule of rounds 3-8. Budget, from round 8's timings: 4 candidates x 2 settings x 6 seeds = 48
runs, ~6 minutes on 2 idle workers.
Outcome (bsuite_baselines_pilot_round9.json, 7.4 minutes): rates at chains 4 / 5, mean over seeds 100-105:
unnormalised 0.763 / 0.643, minibatches of 16 0.788 / 0.642, the linear policy 0.658 / 0.592 and unnormalised 0.683 /
0.634, against the reference's 0.764 / 0.667. None has a better worst setting: the entry stays round 8's, and the
chains 1-4 check is not rerun (its runs would be the same).

Round 10 (PPO on umbrella_length, round 6's chains 4-5 and seeds 100-105): the plateau that round 9 aimed at looks
like a constant step size's noise floor (every update moves the first decision's logit by noise of the same size,
however well it is already set), which PPO's usual remedy, a linear decay of the step to 0 over the run, lowers late
in the run. The SB3 arm now takes rl-zoo3's `lin_<start>` schedules. Candidates on round 8's entry: the learning rate
decaying from 1e-3 (half the mean step) or from 2e-3 (the same mean step as the entry's constant 1e-3), and the
clip range decaying from 0.2 at the entry's constant learning rate. Reference, rule and budget as in round 9 (3
candidates x 2 settings x 6 seeds = 36 runs; one worker beside the umbrella_distract sweep, ~15 minutes).
Outcome (bsuite_baselines_pilot_round10.json, 13.4 minutes): rates at chains 4 / 5, mean over seeds 100-105: the
learning rate decaying from 1e-3 0.714 / 0.652, from 2e-3 0.650 / 0.635, the clip range from 0.2 0.755 / 0.644,
against the reference's 0.764 / 0.667. The decays did worse (so the plateau is not a step size's noise floor that a
decay lowers within this budget); the entry stays round 8's.

Round 11 (PPO on umbrella_length, round 6's chains 4-5 and seeds 100-105): a diagnosis outside the pilot's and the
check's seeds (plain SB3 PPO with the entry's settings, chain 4, seeds 200-201; not committed) found what holds PPO
back: with umbrella_length's 20 distractor bits zeroed in the observation, the same PPO chose right on 0.875 and 0.889
of all first decisions, against 0.622 and 0.731 with them. Each update fits its 32 steps' noisy advantages for 10
epochs, and the random distractor bits let the nets fit each step's noise on its own (the critic's baseline as much as
the policy), so the part of an update that carries over to new episodes, the need bit's, is small. More steps per
update average that fitted noise out; the same diagnosis gave 0.746 and 0.795 with 128-step rollouts in minibatches of
32, and 0.746 and 0.758 with a linear critic (net_arch vf []). Round 11's candidates on round 8's entry: 128-step
rollouts in minibatches of 32 (the entry's four minibatches per rollout), 64-step rollouts in minibatches of 16, and
the linear critic. Reference, rule and seeds as in rounds 9-10. Budget, from the diagnosis's timings (about 50 s of
one core per run at chain 4): 3 candidates x 2 settings x 6 seeds = 36 runs, ~18 minutes on 2 workers.
Outcome (bsuite_baselines_pilot_round11.json, 4.6 minutes on idle cores): rates at chains 4 / 5, mean over seeds
100-105: 128-step rollouts in minibatches of 32 0.774 / 0.703, 64 in 16 0.778 / 0.678, the linear critic 0.773 /
0.676, against the reference's 0.764 / 0.667: every candidate did better at both chains, and umbrella_length's entry
takes the best worst setting, 128-step rollouts in minibatches of 32 (umbrella_distract keeps round 8's, with which its
sweep ran). benchmarks/bsuite_distractor_diagnosis.py repeats the diagnosis as a committed benchmark (single-threaded, so
a seed's rate differs from the diagnosis's; seeds 200-203): round 8's entry 0.686 as bsuite draws the observation and
0.841 with the distractor bits zeroed, round 11's 0.753 and 0.884. That the distractor bits cost PPO this much is
measured; how (the per-step fitting above) is a reading that neither the diagnosis nor round 11 measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from algorithms.common import cli, provenance  # noqa: E402
from algorithms.experiment.jobs import seed_jobs, train_jobs  # noqa: E402
from algorithms.train import resolve_spec  # noqa: E402

# round -> umbrella_length indices (1, 4, 7: chain lengths 2, 5, 8; 3: chain 4; the short protocol scores 0, 2, 5, 9 on seeds 0-2,
# the chains 1-4 check 0-3 on seeds 0-2) and seeds
# (round 7: discounting_chain settings 2-4; the short protocol scores settings 0 and 1)
SETTINGS = {
    1: (1, 4, 7),
    2: (1, 4, 7),
    3: (1, 4),
    4: (1, 4),
    5: (1, 4),
    6: (3, 4),
    7: (2, 3, 4),
    8: (3, 4),
    9: (3, 4),
    10: (3, 4),
    11: (3, 4),
}
SEEDS = {
    1: range(100, 102), 2: range(100, 102), 3: range(100, 103), 4: range(100, 103), 5: range(100, 103),
    6: range(100, 106), 7: range(100, 103), 8: range(100, 106), 9: range(100, 106),
    10: range(100, 106), 11: range(100, 106),
}  # fmt: skip
EXPERIMENTS = {7: "discounting_chain"}  # round -> bsuite experiment (umbrella_length where not named)
EPISODES = {7: 200}  # round -> episodes per run (the short protocol's budget): 1,000 where not named
WINDOWS = {1: 200}  # round -> the episodes the measured rate covers: the whole run where not named
ROUND_1: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n32-lr1e-3": {"n_steps": 32, "batch_size": 32, "n_epochs": 4, "learning_rate": 1e-3, "ent_coef": 0.01},
        "n128-lr3e-4": {"n_steps": 128, "batch_size": 64, "n_epochs": 10, "learning_rate": 3e-4, "ent_coef": 0.01},
        "n64-lr1e-3-g1": {"n_steps": 64, "batch_size": 64, "n_epochs": 4, "learning_rate": 1e-3, "ent_coef": 0.01, "gamma": 1.0},
    },
    "a2c": {
        "n8-lr1e-3": {"n_steps": 8, "learning_rate": 1e-3, "ent_coef": 0.01},
        "n32-lr7e-4-g1": {"n_steps": 32, "learning_rate": 7e-4, "ent_coef": 0.01, "gamma": 1.0},
    },
    "dqn": {
        "ls100-tu100": {
            "learning_starts": 100, "buffer_size": 20_000, "batch_size": 32, "learning_rate": 1e-3,
            "target_update_interval": 100, "exploration_fraction": 0.2, "exploration_final_eps": 0.02, "train_freq": 1,
        },
        "ls500-tu250-g1": {
            "learning_starts": 500, "buffer_size": 20_000, "batch_size": 64, "learning_rate": 5e-4,
            "target_update_interval": 250, "exploration_fraction": 0.3, "exploration_final_eps": 0.02, "train_freq": 1,
            "gamma": 1.0,
        },
    },
}  # fmt: skip
ROUND_2: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n64-lr1e-3-g1": ROUND_1["ppo"]["n64-lr1e-3-g1"],
        "n16-e10-lr3e-3": {"n_steps": 16, "batch_size": 16, "n_epochs": 10, "learning_rate": 3e-3, "gamma": 1.0},
        "n32-e10-lr1e-3": {"n_steps": 32, "batch_size": 32, "n_epochs": 10, "learning_rate": 1e-3, "gamma": 1.0},
    },
    "a2c": {
        "n8-lr1e-3": ROUND_1["a2c"]["n8-lr1e-3"],
        "n4-lr3e-3-g1": {"n_steps": 4, "learning_rate": 3e-3, "gamma": 1.0},
    },
    "dqn": {
        "ls500-tu250-g1": ROUND_1["dqn"]["ls500-tu250-g1"],
        "ls100-tu50-e0.1-g1": {
            "learning_starts": 100, "buffer_size": 20_000, "batch_size": 32, "learning_rate": 1e-3,
            "target_update_interval": 50, "exploration_fraction": 0.1, "exploration_final_eps": 0.01, "train_freq": 1,
            "gamma": 1.0,
        },
        "ls100-tu50-e0.1-g1-gs4": {
            "learning_starts": 100, "buffer_size": 20_000, "batch_size": 32, "learning_rate": 1e-3,
            "target_update_interval": 50, "exploration_fraction": 0.1, "exploration_final_eps": 0.01, "train_freq": 1,
            "gradient_steps": 4, "gamma": 1.0,
        },
    },
}  # fmt: skip
DQN_FAST = {"buffer_size": 20_000, "train_freq": 1, "gamma": 1.0, "exploration_initial_eps": 1.0}
ROUND_3: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n32-e10-lr1e-3": ROUND_2["ppo"]["n32-e10-lr1e-3"],  # round 2's choice, the reference
        "n16-e10-lr1e-3-l1": {
            "n_steps": 16, "batch_size": 16, "n_epochs": 10, "learning_rate": 1e-3, "gamma": 1.0, "gae_lambda": 1.0,
        },
        "n16-e10-lr3e-3-l1-a64": {
            "n_steps": 16, "batch_size": 16, "n_epochs": 10, "learning_rate": 3e-3, "gamma": 1.0, "gae_lambda": 1.0,
            "policy_kwargs": {"net_arch": [64]},
        },
        "n16-e10-lr1e-3-l0.8-a64": {
            "n_steps": 16, "batch_size": 16, "n_epochs": 10, "learning_rate": 1e-3, "gamma": 1.0, "gae_lambda": 0.8,
            "policy_kwargs": {"net_arch": [64]},
        },
        "n8-e10-lr1e-3-l1-a32": {
            "n_steps": 8, "batch_size": 8, "n_epochs": 10, "learning_rate": 1e-3, "gamma": 1.0, "gae_lambda": 1.0,
            "policy_kwargs": {"net_arch": [32]},
        },
        "n32-b8-e10-lr1e-3-l1": {
            "n_steps": 32, "batch_size": 8, "n_epochs": 10, "learning_rate": 1e-3, "gamma": 1.0, "gae_lambda": 1.0,
        },
    },
    "dqn": {
        "ls100-tu50-e0.1-g1-gs4": ROUND_2["dqn"]["ls100-tu50-e0.1-g1-gs4"],  # round 2's choice, the reference
        "ls32-tu50-e0.02-lr1e-3": {
            **DQN_FAST, "learning_starts": 32, "batch_size": 32, "learning_rate": 1e-3, "target_update_interval": 50,
            "exploration_fraction": 0.02, "exploration_final_eps": 0.0, "gradient_steps": 1,
        },
        "ls32-tu50-e0.02-lr3e-3-gs2-b64-a64": {
            **DQN_FAST, "learning_starts": 32, "batch_size": 64, "learning_rate": 3e-3, "target_update_interval": 50,
            "exploration_fraction": 0.02, "exploration_final_eps": 0.0, "gradient_steps": 2, "policy_kwargs": {"net_arch": [64]},
        },
        "ls100-tu100-e0.05-lr1e-3-gs2-b128": {
            **DQN_FAST, "learning_starts": 100, "batch_size": 128, "learning_rate": 1e-3, "target_update_interval": 100,
            "exploration_fraction": 0.05, "exploration_final_eps": 0.01, "gradient_steps": 2,
        },
        "ls32-tu50-e0.05-lr1e-3-gs4": {
            **DQN_FAST, "learning_starts": 32, "batch_size": 32, "learning_rate": 1e-3, "target_update_interval": 50,
            "exploration_fraction": 0.05, "exploration_final_eps": 0.0, "gradient_steps": 4,
        },
    },
}  # fmt: skip
PPO_B8 = {"n_steps": 32, "batch_size": 8, "n_epochs": 10, "learning_rate": 1e-3, "gamma": 1.0, "gae_lambda": 1.0}
ROUND_4: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n32-b8-e10-lr1e-3-l1": ROUND_3["ppo"]["n32-b8-e10-lr1e-3-l1"],  # round 3's choice, the reference
        "n32-b8-e20-lr1e-3-l1": {**PPO_B8, "n_epochs": 20},
        "n32-b4-e10-lr1e-3-l1": {**PPO_B8, "batch_size": 4},
        "n64-b8-e10-lr1e-3-l1": {**PPO_B8, "n_steps": 64},
        "n32-b8-e10-lr1e-3-l0.5": {**PPO_B8, "gae_lambda": 0.5},
        "n32-b8-e10-lr1e-3-l1-nonorm": {**PPO_B8, "normalize_advantage": False},
    },
}  # fmt: skip
DQN_R3 = ROUND_3["dqn"]["ls32-tu50-e0.02-lr3e-3-gs2-b64-a64"]
ROUND_5: dict[str, dict[str, dict[str, Any]]] = {
    "dqn": {
        "ls32-tu50-e0.02-lr3e-3-gs2-b64-a64": DQN_R3,  # round 3's choice, the reference
        "ls32-tu50-e0.02-lr3e-3-gs2-b128-a64": {**DQN_R3, "batch_size": 128},
        "ls32-tu25-e0.02-lr3e-3-gs2-b64-a64": {**DQN_R3, "target_update_interval": 25},
        "ls32-tu50-e0.02-lr5e-3-gs2-b64-a64": {**DQN_R3, "learning_rate": 5e-3},
    },
}  # fmt: skip
ROUND_6: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n32-b8-e10-lr1e-3-l1": PPO_B8,  # the zoo entry (round 3's choice), the reference
        "n32-b8-e10-lr1e-3-l1-clip0.5": {**PPO_B8, "clip_range": 0.5},
        "n32-b8-e10-lr3e-3-l1": {**PPO_B8, "learning_rate": 3e-3},
        "n32-b8-e10-lr3e-3-l1-clip0.5": {**PPO_B8, "learning_rate": 3e-3, "clip_range": 0.5},
    },
    "dqn": {
        "ls32-tu50-e0.02-lr3e-3-gs2-b64-a64": DQN_R3,  # the zoo entry (round 3's choice), the reference
        "ls32-tu50-e0.02-lr3e-3-gs2-b64-a64-ns3": {**DQN_R3, "n_steps": 3},
        "ls32-tu50-e0.02-lr3e-3-gs2-b64-a64-ns10": {**DQN_R3, "n_steps": 10},
        "ls32-tu50-e0.02-lr3e-3-gs4-b64-a64-ns10": {**DQN_R3, "n_steps": 10, "gradient_steps": 4},
    },
}  # fmt: skip
PPO_DC = {**PPO_B8, "n_steps": 100, "batch_size": 10}
ROUND_7: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n100-b10-e10-lr1e-3-l1": PPO_DC,  # the umbrella entry's steps per sample, rollouts of one whole episode
        "n100-b25-e10-lr1e-3-l1": {**PPO_DC, "batch_size": 25},
        "n200-b25-e10-lr1e-3-l1": {**PPO_DC, "n_steps": 200, "batch_size": 25},
        "n100-b10-e10-lr3e-4-l1": {**PPO_DC, "learning_rate": 3e-4},
    },
}  # fmt: skip
# Round 8 (PPO on umbrella_length, round 6's settings and seeds): the zoo entry is round 6's reference, whose runs are
# not repeated (`REFERENCE`: same settings, seeds and deterministic code, read from the round-6 JSON)
ROUND_8: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n32-b8-e10-lr1e-3-l1-mgn100": {**PPO_B8, "max_grad_norm": 100.0},
        "n32-b8-e5-lr1e-3-l1-mgn100": {**PPO_B8, "n_epochs": 5, "max_grad_norm": 100.0},
        "n32-b8-e10-lr5e-4-l1-mgn100": {**PPO_B8, "learning_rate": 5e-4, "max_grad_norm": 100.0},
    },
}  # fmt: skip
PPO_B8_MGN100 = ROUND_8["ppo"]["n32-b8-e10-lr1e-3-l1-mgn100"]
LINEAR_POLICY = {"policy_kwargs": {"net_arch": {"pi": [], "vf": [64, 64]}}}
# Round 9 (PPO on umbrella_length, round 6's settings and seeds): round 8's choice is the reference (REFERENCE)
ROUND_9: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n32-b8-e10-lr1e-3-l1-mgn100-nonorm": {**PPO_B8_MGN100, "normalize_advantage": False},
        "n32-b16-e10-lr1e-3-l1-mgn100": {**PPO_B8_MGN100, "batch_size": 16},
        "n32-b8-e10-lr1e-3-l1-mgn100-pilinear": {**PPO_B8_MGN100, **LINEAR_POLICY},
        "n32-b8-e10-lr1e-3-l1-mgn100-pilinear-nonorm": {
            **PPO_B8_MGN100, **LINEAR_POLICY, "normalize_advantage": False,
        },
    },
}  # fmt: skip
# Round 10 (the same settings and seeds): linear decays of the step (lin_<start>), round 8's choice the reference
ROUND_10: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n32-b8-e10-lrlin1e-3-l1-mgn100": {**PPO_B8_MGN100, "learning_rate": "lin_1e-3"},
        "n32-b8-e10-lrlin2e-3-l1-mgn100": {**PPO_B8_MGN100, "learning_rate": "lin_2e-3"},
        "n32-b8-e10-lr1e-3-cliplin0.2-l1-mgn100": {**PPO_B8_MGN100, "clip_range": "lin_0.2"},
    },
}  # fmt: skip
# Round 11 (the same settings and seeds): more steps per update, or a linear critic, against the distractor bits' fitted
# noise; round 8's choice the reference
ROUND_11: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n128-b32-e10-lr1e-3-l1-mgn100": {**PPO_B8_MGN100, "n_steps": 128, "batch_size": 32},
        "n64-b16-e10-lr1e-3-l1-mgn100": {**PPO_B8_MGN100, "n_steps": 64, "batch_size": 16},
        "n32-b8-e10-lr1e-3-l1-mgn100-vflinear": {
            **PPO_B8_MGN100, "policy_kwargs": {"net_arch": {"pi": [64, 64], "vf": []}},
        },
    },
}  # fmt: skip
REFERENCE = {  # round -> (the round whose JSON holds it, candidate key)
    8: (6, "ppo n32-b8-e10-lr1e-3-l1"),
    9: (8, "ppo n32-b8-e10-lr1e-3-l1-mgn100"),
    10: (8, "ppo n32-b8-e10-lr1e-3-l1-mgn100"),
    11: (8, "ppo n32-b8-e10-lr1e-3-l1-mgn100"),
}
ROUNDS = {
    1: ROUND_1, 2: ROUND_2, 3: ROUND_3, 4: ROUND_4, 5: ROUND_5, 6: ROUND_6, 7: ROUND_7, 8: ROUND_8, 9: ROUND_9,
    10: ROUND_10, 11: ROUND_11,
}  # fmt: skip
VIEW = {"env_kwargs": {"integer_observations": True}}  # the view every algo of the sweeps sees


def run(argv: list[str]) -> None:
    parser = cli.ArgumentParser(prog="python benchmarks/bsuite_baselines_pilot.py", description=__doc__.splitlines()[0])
    parser.add_argument("--round", type=int, choices=sorted(ROUNDS), required=True)
    parser.add_argument("--out", default="runs/bsuite_pilot")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    out = cli.check_output_dir(args.out, "--out") / f"round{args.round}"
    candidates_of = ROUNDS[args.round]
    experiment = EXPERIMENTS.get(args.round, "umbrella_length")
    episodes = EPISODES.get(args.round, 1_000)
    window = WINDOWS.get(args.round, episodes)
    common = {"stop_at_convergence": False, "convergence_window": window, "max_episodes": episodes}
    started = provenance.start()
    jobs, cells = [], {}
    indices, seeds = SETTINGS[args.round], SEEDS[args.round]
    for algo, candidates in candidates_of.items():
        for name, settings in candidates.items():
            for index in indices:
                env = f"bsuite:{experiment}/{index}"
                spec = resolve_spec(algo, env, seeds[0], {**common, **VIEW, **settings})
                where = out / algo / name / f"{experiment}-{index}"
                cell = seed_jobs(f"{algo} {name}", spec, seeds, lambda s, w=where: w / f"seed{s}")
                cells[(algo, name, index)] = cell
                jobs += cell
    summaries = train_jobs(jobs, args.workers, progress=False)
    report: dict[str, Any] = {
        "round": args.round, "experiment": experiment, "settings": list(indices), "seeds": list(seeds),
        "episodes": episodes, "rate_over_last_episodes": window, "candidates": {},
    }  # fmt: skip
    for algo, candidates in candidates_of.items():
        for name, settings in candidates.items():
            per_setting = {
                index: [summaries[job]["final_correct_rate"] for job in cells[(algo, name, index)]] for index in indices
            }
            means = [sum(v) / len(v) for v in per_setting.values()]
            report["candidates"][f"{algo} {name}"] = {
                "settings": settings,
                "final_correct_rate": {f"{experiment}/{i}": v for i, v in per_setting.items()},
                "mean": sum(means) / len(means),
                "worst_setting_mean": min(means),
            }
            print(f"{algo:4s} {name:34s} mean {sum(means) / len(means):.3f}  worst {min(means):.3f}")
    if args.round in REFERENCE:
        source, key = REFERENCE[args.round]
        earlier = json.loads((REPO / f"benchmarks/results/bsuite_baselines_pilot_round{source}.json").read_text())
        report["candidates"][key] = {**earlier["candidates"][key], "from_round": source}
        algo, name = key.split(" ", 1)
        candidates_of = {**candidates_of, algo: {name: {}, **candidates_of[algo]}}  # first: ties keep the reference
    if args.round >= 3:  # the best worst-setting mean per algo, ties to the best mean
        report["choice_rule"] = "per algo, the best worst_setting_mean, ties to the best mean"
        report["chosen"] = {
            algo: max(
                candidates,
                key=lambda name, a=algo: (
                    report["candidates"][f"{a} {name}"]["worst_setting_mean"],
                    report["candidates"][f"{a} {name}"]["mean"],
                ),
            )
            for algo, candidates in candidates_of.items()
        }
        print("chosen:", report["chosen"])
    report["run"] = provenance.run_record("benchmarks/bsuite_baselines_pilot.py", argv, started)
    path = REPO / f"benchmarks/results/bsuite_baselines_pilot_round{args.round}.json"
    cli.atomic_write_text(path, json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(cli.main(run))
