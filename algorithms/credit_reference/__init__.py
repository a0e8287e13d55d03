"""Replay-defined credit, the reference (docs/papers/replay_credit.md).

    python -m algorithms.credit_reference [--env WatchRepair-v0,umbrella_length/9] [--policy uniform|scripted]
        [--rules broadcast,loo,...] [--seeds 3] [--episodes auto] [--train-episodes 512] [--batch-episodes 64]
        [--k 64] [--group-size auto] [--decision-step auto] [--independent-branches] [--seed 0]
        [--env-kwargs YAML]
        [--out benchmarks/results/credit_reference_{env}.json]

For each seed, episodes of a behaviour policy pi are played; before every step t the env is snapshotted
(envs/snapshot.py). From each snapshot s_t, for every alternative a of the turn, K continuations
are restored with a fresh outcome seed each (`restore(env, state, outcome_seed)`), take a first, then follow pi to
the episode's end. Their returns from t (the undiscounted sum of the rewards of steps t, t + 1, ... up to the
episode's termination or truncation) estimate

    Q(s_t, a) = mean_k G_k(a),   V(s_t) = sum_a pi(a | s_t) Q(s_t, a),   reference credit_t = Q(s_t, a_t) - V(s_t)

for the action a_t the episode took. Standard errors come from the per-continuation contrasts
d_k = G_k(a_t) - sum_a pi(a | s_t) G_k(a) (SE = std(d_k, ddof=1) / sqrt(K)), which are i.i.d. over k whether or
not the branches share random numbers. By default continuation k of every action shares its outcome seed and the
policy's random stream (common random numbers): where an action changes nothing (WatchRepair after its first step)
every branch replays the same future and the reference is exactly 0 rather than noise; `--independent-branches`
gives each (a, k) its own seeds.

A turn's alternatives: every action of a Discrete space; for an env whose action space does not enumerate them (a
Text space) the finite actions the env lists itself, `env.unwrapped.turn_alternatives()` (vcbm_gym/contract.py:
TextWatchWorkshop's station tools, "repair()" / "skip()" at the movement, "standard()" / "premium()" elsewhere; any
other answer is invalid and never taken). The decision step is the env's `is_decision_turn`.

A one-step set action (MultiDiscrete([P] * m), SetRetrieval) is scored per slot: its m slots are the "steps". With
a the submitted set and v the env's exact expected value of a set (info['set_value']; the reward is the imperfect
snapshot evaluator's, which the rules see), the reference credit of slot i is the replay-defined counterfactual

    credit_i = v(a) - sum_b pi(b) v(a with slot i := b)   over every pool item b (pi: each slot uniform over the pool)

each v(a with slot i := b) from `restore(state)` of the snapshot taken after reset and one step. The evaluation is
deterministic (no outcome noise to redraw, one evaluation per alternative), so K continuations are not needed and
the standard error is 0; there is no decision step, hence no leakage.

Every credit rule whose batch needs the episodes meet is built per seed with `make_rule`, fed `--train-episodes`
episodes of pi in batches of `--batch-episodes` in the arms' call order (`assign_credit`: credit, then observe),
and then gives its per-step credit (`credit_of`) on the scored episodes, which it never observed, as one batch.
What a batch holds (`Branching`):
for a Discrete env observations, actions and groups; for a text env groups, the observation texts (GiGPO's anchor
keys) and the final text, no observations or actions; for a set action groups, one step per slot with the reward on
the last, and CASI's coalition values; plus, per turn, the info keys the env reports on every step (state_mutating
-> turn_flags, execution_output -> turn_texts: VCBM-blend's bookmarks, as the LLM arm builds them) and at the end
(coalition_values). A rule that needs more is listed as refused with one line. Groups (loo, grpo, vcbm_blend's LOO,
CASI's base): `--group-size auto` plays 8 rollouts per task (reset seed) on text and set envs, the LLM arm's K;
on Discrete envs each episode is its own task and groups are episodes with the same initial observation. On a set
action the coalition rules of vcbm_gym/credit/set_credit.py (set_shapley, CASI's credit before shaping;
set_singleton, set_banzhaf, set_loo, set_broadcast) are scored too, from the snapshot's coalition values over the
slots, as algorithms/credit_fidelity.py computes them. Each scored episode's credit
vector over its steps is compared with the reference vector by CASI's `fidelity_metrics` (sign agreement over all
steps and over the steps with non-zero reference, Spearman, whether the rule's top step is a reference top step,
cosine; uncentred: a step's credit is relative to the policy's average at that step, not to the episode's other
steps) and, where the env declares its decision step, by leakage (the episode's share of |credit| after it,
credit_leakage's measure). The table gives the mean over scored episodes (pooled over seeds) and, for cosine, the
median (CASI's primary metric), each with a 95% percentile bootstrap CI (algorithms/experiment/stats.py). On a
set action a second table centres credit and reference within each set (CASI's fidelity protocol).

Policies: `uniform` (pi(a) = 1 / n over the turn's alternatives), `scripted` (the env's optimal decision with
probability 1, else uniform: on a Discrete env the first action named by its reset info `optimal_first_action`,
which WatchRepair offers and the bsuite adapter does not; on a text env the alternative its `optimal_alternative()`
names, TextWatchWorkshop's movement call; a set action names none and is refused). The tabular arm has no
checkpoint loader, so a trained policy is not offered.

Budget: a default run (WatchRepair-v0 and umbrella_length/9; 3 seeds x 32 scored episodes, K = 64, 512 training
episodes per seed, every rule that fits) is sized to about 4 minutes on one core, from measured costs: the reference
takes 0.026 s per scored episode and continuation on WatchRepair (50 steps x 2 actions) and 0.0075 s on
umbrella_length/9, i.e. ~160 s and ~46 s; the rules' training on 512 episodes takes ~1 s per seed (RUDDER's LSTM
starts after 256 of them). Cost grows linearly in seeds x episodes x K. K buys precision at the decision, episodes
buy the CI over episodes: at K = 64 the WatchRepair first decision's SE is ~0.7 (sd ~5.5 per contrast) against true
credits of +-0.75 (brands 0, 3) and +-1.75 (brands 1, 2) under the uniform policy.

Budget on the other envs, measured on tiny runs (one core, shared): TextWatchWorkshop-v0
takes 0.0030 s per scored episode and continuation (8 turns x 2 alternatives); SetRetrieval-v0 0.006 s per scored
set (m x P = 50 evaluations). With groups of 8 rollouts per task the unit of the CIs is the task (the cluster
bootstrap, `task_estimate`), so `--episodes auto` buys tasks: 128 episodes per seed on a text env (16 tasks; 3 x 128
x 64 continuations ~ 75 s of reference, ~1.5 min in all: fewer tasks would give the cluster bootstrap too few units)
and 256 sets per seed on a set action (32 requests; ~1 min in all, most of it the 512 training sets per seed).
Both stay inside 5 minutes; raise --k (workshop) or --episodes for tighter estimates.

The package's modules: `replay` plays episodes of pi and estimates the reference, `scoring` trains the rules and
scores their credit against it, `report` renders the markdown table, and `cli` checks the command line and runs it
(`python -m algorithms.credit_reference`, `__main__`).
"""
