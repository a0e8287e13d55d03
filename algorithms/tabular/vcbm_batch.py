"""Many tabular-VCBM seeds as one numpy batch on WatchRepair (issue 15), read top to bottom.

`run_batch(seeds)` returns, for every seed k, exactly the summary fields that
`python -m algorithms.train --algo vcbm --env WatchRepair-v0 --seed k` reports (episodes to
converge, roles, bookmark values): same random streams, drawn in the same order.

- Each seed keeps its own agent (`VCBMAgent`, or a subclass such as `vcbm+`) and its own env
  generator, seeded as `WatchRepairEnv.reset(seed=k)` seeds it (the per-env-seed mode of
  `WatchRepairVectorEnv`).
- All seeds play episode e together. Per episode and seed only a few calls stay in Python: the
  brand's uniform, the t = 0 action (`agent.act`, the bookmark decision), the episode's draws
  (`WatchRepairDynamics.draw`), the later actions in one `rng.integers(2, size=T - 1)` call, the
  Welford update and the convergence tracker. The law (`WatchRepairDynamics.rollout`) runs once for
  the whole batch.
- Later actions can be drawn at once because only t = 0 changes the state, so the trajectory is
  known after the first action: a seed none of whose later states is a bookmark context draws
  exactly the T - 1 uniform actions `act` would have drawn one by one (`VCBMAgent.random_actions`);
  a seed with a bookmark at t >= 1 (possible while roles are wrong) is stepped through `act`.
- The change counts of Eq. 9-10 are read only at role refreshes, so each seed's transitions are
  buffered and counted at the refresh (`ChangeStatistics.update_many`), as the single agent does.

A role refresh must fall on an episode boundary here (warmup_transitions and refresh_every
multiples of the horizon, true for the zoo settings), else this raises.
Memory: each seed keeps the single agent's pre-change state sets; `batch_size` seeds at a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from algorithms.common.config import build_dataclasses, zoo_hyperparams
from algorithms.common.convergence import ConvergenceTracker
from algorithms.registry import get_algo, load_object
from algorithms.tabular.runner import TabularRunConfig
from algorithms.tabular.vcbm import VCBMAgent
from envs.watch_repair import COMPONENT_NAMES, GROUND_TRUTH_ROLES, WatchRepairDynamics, WatchRepairParams


def _check(agent_cfg: Any, run_cfg: TabularRunConfig, horizon: int) -> None:
    for name in ("warmup_transitions", "refresh_every"):
        value = getattr(agent_cfg, name)
        if value < 1 or value % horizon:
            raise ValueError(f"{name}={value}: the batched runner needs a positive multiple of the horizon ({horizon})")
    if run_cfg.max_episodes < 1:
        raise ValueError(f"max_episodes={run_cfg.max_episodes}: expected an integer >= 1")


def late_bookmarks(agents: list[VCBMAgent], states: np.ndarray, nvec: np.ndarray) -> np.ndarray:
    """(N,) bool: whether any of agent i's `states[i]` (its states after t = 0) is one of its contexts.

    Seeds that project on the same components are tested together: a context is a mixed-radix code
    over those components, looked up in a (seeds, codes) table.
    """
    hits = np.zeros(len(agents), dtype=bool)
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, agent in enumerate(agents):
        if agent.contexts:
            groups.setdefault(tuple(agent.context_indices), []).append(row)
    for indices, rows in groups.items():
        radix = nvec[list(indices)]
        strides = np.concatenate([np.cumprod(radix[::-1])[::-1][1:], [1]])
        size = int(np.prod(radix))
        table = np.zeros((len(rows), size), dtype=bool)
        for r, row in enumerate(rows):
            table[r, np.asarray(sorted(agents[row].contexts), dtype=np.int64).reshape(-1, len(indices)) @ strides] = True
        codes = states[rows][:, :, list(indices)] @ strides
        hits[rows] = table[np.arange(len(rows))[:, None], codes].any(axis=1)
    return hits


def run_batch(
    seeds: Sequence[int],
    algo: str = "vcbm",
    hyperparams: dict[str, Any] | None = None,
    batch_size: int = 250,
) -> list[dict[str, Any]]:
    """One summary per seed, in order; `hyperparams` overrides the zoo entry for WatchRepair-v0."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: expected an integer >= 1")
    agent_cls = load_object(get_algo(algo).target)
    if not issubclass(agent_cls, VCBMAgent):
        raise ValueError(f"algo {algo!r}: the batched runner runs VCBM agents (vcbm, vcbm+)")
    mapping = {**zoo_hyperparams(algo, "WatchRepair-v0"), **(hyperparams or {})}
    run_cfg, agent_cfg = build_dataclasses(mapping, [TabularRunConfig, agent_cls.config_class], owner=f"algo {algo!r}")
    dynamics = WatchRepairDynamics(WatchRepairParams(**run_cfg.env_kwargs))
    _check(agent_cfg, run_cfg, dynamics.params.horizon)
    summaries: list[dict[str, Any]] = []
    for start in range(0, len(seeds), batch_size):
        summaries += _run_chunk(list(seeds[start : start + batch_size]), agent_cls, agent_cfg, run_cfg, dynamics)
    return summaries


def _run_chunk(seeds, agent_cls, agent_cfg, run_cfg: TabularRunConfig, dynamics: WatchRepairDynamics) -> list[dict]:
    start_time = time.perf_counter()
    horizon = dynamics.params.horizon
    optimal = dynamics.params.optimal_first_action()
    obs_space, act_space = dynamics.observation_space(), gym.spaces.Discrete(2)
    nvec = np.asarray(obs_space.nvec)
    env_rngs = [gym.utils.seeding.np_random(int(k))[0] for k in seeds]
    agents = [agent_cls(obs_space, act_space, agent_cfg, int(k), component_names=COMPONENT_NAMES) for k in seeds]
    trackers = [ConvergenceTracker(run_cfg.convergence_window, run_cfg.convergence_threshold) for _ in seeds]
    pending: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in seeds]  # (states, actions) per episode
    results: dict[int, dict[str, Any]] = {}
    active = np.arange(len(seeds))
    transitions = 0
    next_refresh = agent_cfg.warmup_transitions
    for episode in range(1, run_cfg.max_episodes + 1):
        # reset: one uniform per seed -> brand; then the t = 0 decision of each agent
        brand = dynamics.brands(np.array([env_rngs[i].random() for i in active.tolist()]))
        first_obs = np.zeros((len(active), 5), dtype=np.int64)
        first_obs[:, 3] = brand
        first_action = np.array([agents[i].act(o) for i, o in zip(active.tolist(), first_obs)])
        # the law, for every seed at once, on each seed's own draws
        draws = dynamics.draw([env_rngs[i] for i in active.tolist()], brand, first_action)
        states, rewards = dynamics.rollout(brand, first_action, draws)
        actions = np.empty((len(active), horizon), dtype=np.int64)
        actions[:, 0] = first_action
        late = late_bookmarks([agents[i] for i in active.tolist()], states[:, 1:horizon], nvec)
        for row, i in enumerate(active.tolist()):
            agent = agents[i]
            if late[row]:
                actions[row, 1:] = [agent.act(s) for s in states[row, 1:horizon]]
            else:
                actions[row, 1:] = agent.random_actions(horizon - 1)
        returns = np.cumsum(rewards, axis=1)[:, -1]  # sequential, as the runner adds the rewards
        correct = first_action == optimal[brand]
        transitions += horizon
        refresh = transitions >= next_refresh
        if refresh:
            next_refresh += agent_cfg.refresh_every
        finished = []
        for row, i in enumerate(active.tolist()):
            agent = agents[i]
            pending[i].append((states[row], actions[row]))
            if refresh:
                agent.transitions = transitions
                agent.record_episodes(pending[i])
                pending[i] = []
                agent.refresh_roles()
            agent.learn(float(returns[row]))
            agent.episode += 1
            just_converged = trackers[i].update(bool(correct[row]))
            if (just_converged and run_cfg.stop_at_convergence) or episode == run_cfg.max_episodes:
                finished.append(row)
                tracker = trackers[i]
                agent.record_episodes(pending[i])
                results[i] = {
                    "seed": int(seeds[i]),
                    "converged": tracker.converged_at is not None,
                    "episodes_to_converge": tracker.converged_at,
                    "episodes_run": tracker.episodes,
                    "final_correct_rate": tracker.rate,
                    **agent.summary(),
                }
                agents[i] = pending[i] = None  # free the seed's memory
        if finished:
            active = np.delete(active, finished)
        if not len(active):
            break
    wall = time.perf_counter() - start_time
    return [{**results[i], "batch_wall_time_s": wall} for i in range(len(seeds))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Many VCBM seeds on WatchRepair-v0 as one numpy batch")
    parser.add_argument("--algo", default="vcbm", help="vcbm or vcbm+")
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--out", default=None, help="write the per-seed summaries as JSON here")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: expected an integer >= 1")
    start = time.perf_counter()
    summaries = run_batch(range(args.seed_start, args.seed_start + args.seeds), args.algo, batch_size=args.batch_size)
    wall = time.perf_counter() - start
    episodes = [s["episodes_to_converge"] if s["converged"] else s["episodes_run"] for s in summaries]
    roles_ok = sum(tuple(s["roles"].values()) == GROUND_TRUTH_ROLES for s in summaries)
    print(
        f"{args.algo}: {args.seeds} seeds in {wall:.1f} s; converged {sum(s['converged'] for s in summaries)}; "
        f"median {statistics.median(episodes):g}, max {max(episodes)}; roles right in {roles_ok}"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summaries, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
