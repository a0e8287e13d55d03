"""Many tabular-VCBM seeds as one numpy batch on WatchRepair, read top to bottom.

`run_batch(seeds)` returns, for every seed k, exactly the summary fields that
`python -m algorithms.train --algo vcbm --env WatchRepair-v0 --seed k` reports (episodes to
converge, roles, bookmark values): same random streams, drawn in the same order.

- Each seed keeps its own agent (`VCBMAgent`, or a subclass such as `vcbm-plus`'s) and its own env
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
- The change counts of Eq. 9-10 (VCBM paper, arXiv:2610.24032) are read only at role refreshes, so each seed's transitions are
  buffered and counted at the refresh (`ChangeStatistics.update_many`), as the single agent does.

The roles are the paper's test (`causal_test: frequency`, the zoo's WatchRepair-v0 setting); another
test raises. A role refresh must fall on an episode boundary here (warmup_transitions and refresh_every
multiples of the horizon, true for the zoo settings), else this raises.
Memory: each seed keeps the single agent's pre-change state sets; `batch_size` seeds at a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from algorithms.common.config import zoo_hyperparams
from algorithms.common.convergence import ConvergenceTracker
from algorithms.common.spec import canonical_algo
from algorithms.tabular.runner import TabularRunConfig, agent_class, tabular_config
from algorithms.tabular.vcbm import VCBMAgent
from envs.watch_repair import COMPONENT_NAMES, GROUND_TRUTH_ROLES, WatchRepairDynamics, WatchRepairParams
from vcbm_gym.credit.causal_roles import FREQUENCY, Role, classify_roles


def _check(agent_cfg: Any, run_cfg: TabularRunConfig, horizon: int) -> None:
    if agent_cfg.causal_test != FREQUENCY:
        raise ValueError(
            f"causal_test={agent_cfg.causal_test!r}: the batched runner counts change frequencies only "
            f"(causal_test: {FREQUENCY}, the paper's test and the zoo's WatchRepair-v0 setting)"
        )
    for name in ("warmup_transitions", "refresh_every"):
        value = getattr(agent_cfg, name)
        if value < 1 or value % horizon:
            raise ValueError(f"{name}={value}: the batched runner needs a positive multiple of the horizon ({horizon})")
    if run_cfg.max_episodes < 1:
        raise ValueError(f"max_episodes={run_cfg.max_episodes}: expected an integer >= 1")


class BatchChangeCounts:
    """What each seed's `ChangeStatistics` holds (Eq. 9-10's c[i, a] and n[a], and the states seen
    just before each component changed), kept for many seeds at once: counts as (seeds, ...) arrays,
    states as mixed-radix integer codes. Pre-change codes are buffered between role refreshes."""

    def __init__(self, n_seeds: int, nvec: np.ndarray, n_actions: int, buffer_transitions: int) -> None:
        n_components = len(nvec)
        self.n_actions = n_actions
        self.nvec = np.asarray(nvec, dtype=np.int64)
        self.strides = np.concatenate([np.cumprod(self.nvec[::-1])[::-1][1:], [1]])
        self.change_counts = np.zeros((n_seeds, n_components, n_actions), dtype=np.int64)
        self.action_counts = np.zeros((n_seeds, n_actions), dtype=np.int64)
        self.pre_change_codes: list[list[set[int]]] = [[set() for _ in range(n_components)] for _ in range(n_seeds)]
        self._codes = np.zeros((n_seeds, buffer_transitions), dtype=np.int64)
        self._changed = np.zeros((n_seeds, buffer_transitions, n_components), dtype=bool)
        self._filled = 0

    def add(self, seeds: np.ndarray, states: np.ndarray, actions: np.ndarray) -> None:
        """One episode per seed: states (n, T + 1, n_components), actions (n, T)."""
        changed = states[:, 1:] != states[:, :-1]
        for a in range(self.n_actions):
            taken = actions == a
            self.action_counts[seeds, a] += taken.sum(axis=1)
            self.change_counts[seeds, :, a] += (changed & taken[:, :, None]).sum(axis=1)
        horizon = actions.shape[1]
        window = slice(self._filled, self._filled + horizon)
        self._codes[seeds, window] = states[:, :-1] @ self.strides
        self._changed[seeds, window] = changed
        self._filled += horizon

    def flush(self, seeds: np.ndarray) -> None:
        """Move the buffered pre-change codes of `seeds` into their sets (at a role refresh)."""
        codes, changed = self._codes[:, : self._filled], self._changed[:, : self._filled]
        for i in seeds.tolist():
            for component, seen in enumerate(self.pre_change_codes[i]):
                seen.update(codes[i][changed[i, :, component]].tolist())
        self._filled = 0

    def pre_change_states(self, i: int, components: list[int]) -> list[set[tuple[int, ...]]]:
        """`ChangeStatistics.pre_change_states` of seed i for `components` (empty sets elsewhere)."""
        out: list[set[tuple[int, ...]]] = [set() for _ in self.nvec]
        for c in components:
            codes = np.fromiter(self.pre_change_codes[i][c], dtype=np.int64)
            rows = (codes[:, None] // self.strides) % self.nvec
            out[c] = set(map(tuple, rows.tolist()))
        return out


@dataclass
class ContextGroup:
    """Seeds with the same projection and contexts: a context is a mixed-radix code over `indices`."""

    seeds: list[int]
    indices: list[int]
    strides: np.ndarray
    is_context: np.ndarray  # bool per code


def context_groups(agents: dict[int, VCBMAgent], nvec: np.ndarray) -> list[ContextGroup]:
    """Seeds (keys of `agents`) with non-empty contexts, grouped by (projection, contexts)."""
    by_contexts: dict[tuple, list[int]] = {}
    for i, agent in agents.items():
        if agent.contexts:
            by_contexts.setdefault((tuple(agent.context_indices), tuple(sorted(agent.contexts))), []).append(i)
    groups = []
    for (indices, contexts), seeds in by_contexts.items():
        radix = nvec[list(indices)]
        strides = np.concatenate([np.cumprod(radix[::-1])[::-1][1:], [1]]).astype(np.int64)
        is_context = np.zeros(int(np.prod(radix)), dtype=bool)
        is_context[np.asarray(contexts, dtype=np.int64) @ strides] = True
        groups.append(ContextGroup(seeds, list(indices), strides, is_context))
    return groups


def late_bookmarks(groups: list[ContextGroup], row_of: np.ndarray, states: np.ndarray) -> np.ndarray:
    """(rows,) bool: whether any of row r's `states` (its states after t = 0) is one of its seed's contexts."""
    hits = np.zeros(len(states), dtype=bool)
    for group in groups:
        rows = row_of[group.seeds]
        hits[rows] = group.is_context[states[rows][:, :, group.indices] @ group.strides].any(axis=1)
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
    algo = canonical_algo(algo)
    agent_cls = agent_class(algo)
    if not issubclass(agent_cls, VCBMAgent):
        raise ValueError(f"algo {algo!r}: the batched runner runs VCBM agents (vcbm, vcbm-plus)")
    mapping = {**zoo_hyperparams(algo, "WatchRepair-v0"), **(hyperparams or {})}
    config = tabular_config(algo, mapping)  # the typed configs, as TabularArm.resolve builds them
    run_cfg, agent_cfg = config.run, config.agent
    dynamics = WatchRepairDynamics(WatchRepairParams(**run_cfg.env_kwargs))
    _check(agent_cfg, run_cfg, dynamics.params.horizon)
    summaries: list[dict[str, Any]] = []
    for start in range(0, len(seeds), batch_size):
        summaries += _run_chunk(list(seeds[start : start + batch_size]), agent_cls, agent_cfg, run_cfg, dynamics)
    return summaries


def _play_episode(
    live: list[int],
    agents: dict[int, VCBMAgent],
    env_rngs: list,
    dynamics: WatchRepairDynamics,
    groups: list[ContextGroup],
    row_of: np.ndarray,
):
    """One episode of every live seed: (brand, first action, states, rewards, actions), rows in `live` order;
    a row that meets one of its seed's bookmark contexts after t = 0 is stepped through `act`."""
    horizon = dynamics.params.horizon
    # reset: one uniform per seed -> brand; then each agent's t = 0 decision
    brand = dynamics.brands(np.array([env_rngs[i].random() for i in live]))
    first_obs = np.zeros((len(live), 5), dtype=np.int64)
    first_obs[:, 3] = brand
    first_action = np.array([agents[i].act(o) for i, o in zip(live, first_obs)])
    # each seed's own draws, then the law for all seeds at once
    draws = dynamics.draw([env_rngs[i] for i in live], brand, first_action)
    states, rewards = dynamics.rollout(brand, first_action, draws)
    # later actions: uniform, drawn at once, unless a later state is a bookmark
    actions = np.empty((len(live), horizon), dtype=np.int64)
    actions[:, 0] = first_action
    late = late_bookmarks(groups, row_of, states[:, 1:horizon])
    for row, i in enumerate(live):
        if late[row]:
            actions[row, 1:] = [agents[i].act(s) for s in states[row, 1:horizon]]
        else:
            actions[row, 1:] = agents[i].random_actions(horizon - 1)
    return brand, first_action, states, rewards, actions


def _refresh_roles(live: list[int], agents: dict[int, VCBMAgent], counts: BatchChangeCounts, agent_cfg: Any) -> None:
    """Eq. 9-10 on each live seed's counts so far (what the single agent's observe does at a refresh)."""
    counts.flush(np.asarray(live))
    for i in live:
        roles = classify_roles(counts.change_counts[i], counts.action_counts[i], agent_cfg.eta_clock, agent_cfg.z_thresh)
        controlled = [c for c, role in enumerate(roles) if role is Role.CONTROLLED]
        agents[i].set_roles(roles, counts.pre_change_states(i, controlled))


def _seed_summary(seed: int, tracker: ConvergenceTracker, agent: VCBMAgent) -> dict[str, Any]:
    return {
        "seed": int(seed),
        "converged": tracker.converged_at is not None,
        "episodes_to_converge": tracker.converged_at,
        "episodes_run": tracker.episodes,
        "final_correct_rate": tracker.rate,
        **agent.summary(),
    }


# Summary key: a role refresh of this seed found no bookmark, so it acted uniformly at random until a later one did
# (what a single run warns about on stderr; the batch counts such seeds in one line).
FELL_BACK = "fell_back_to_random"


def _run_chunk(seeds, agent_cls, agent_cfg, run_cfg: TabularRunConfig, dynamics: WatchRepairDynamics) -> list[dict]:
    start_time = time.perf_counter()
    horizon, optimal = dynamics.params.horizon, dynamics.params.optimal_first_action()
    obs_space, act_space = dynamics.observation_space(), gym.spaces.Discrete(2)
    nvec = np.asarray(obs_space.nvec)
    env_rngs = [gym.utils.seeding.np_random(int(k))[0] for k in seeds]
    agents = {i: agent_cls(obs_space, act_space, agent_cfg, int(k), component_names=COMPONENT_NAMES) for i, k in enumerate(seeds)}
    for agent in agents.values():  # a refresh without bookmarks is counted per seed (`fell_back`), not printed per seed
        agent.no_bookmarks_warned = True
    fell_back: set[int] = set()
    trackers = [ConvergenceTracker(run_cfg.convergence_window, run_cfg.convergence_threshold) for _ in seeds]
    counts = BatchChangeCounts(len(seeds), nvec, 2, max(agent_cfg.warmup_transitions, agent_cfg.refresh_every))
    results: dict[int, dict[str, Any]] = {}
    active = np.arange(len(seeds))
    row_of = np.arange(len(seeds))  # seed index -> row in this episode's arrays
    groups: list[ContextGroup] = []
    transitions, next_refresh = 0, agent_cfg.warmup_transitions
    for episode in range(1, run_cfg.max_episodes + 1):
        live = active.tolist()
        brand, first_action, states, rewards, actions = _play_episode(live, agents, env_rngs, dynamics, groups, row_of)
        counts.add(active, states, actions)
        transitions += horizon
        if transitions >= next_refresh:
            next_refresh += agent_cfg.refresh_every
            _refresh_roles(live, agents, counts, agent_cfg)
            fell_back.update(i for i in live if not agents[i].contexts)
            groups = context_groups(agents, nvec)
        # end of episode: Welford update, convergence
        returns = np.cumsum(rewards, axis=1)[:, -1]  # sequential, as the runner adds the rewards
        correct = (first_action == optimal[brand]).tolist()
        finished = []
        for row, i in enumerate(live):
            agents[i].learn(float(returns[row]), states[row, 0], states[row, -1])
            agents[i].episode += 1
            if (trackers[i].update(correct[row]) and run_cfg.stop_at_convergence) or episode == run_cfg.max_episodes:
                finished.append(row)
                results[i] = {**_seed_summary(seeds[i], trackers[i], agents.pop(i)), FELL_BACK: i in fell_back}
                counts.pre_change_codes[i] = []  # free the seed's memory
        if finished:
            active = np.delete(active, finished)
            row_of[active] = np.arange(len(active))
            groups = context_groups(agents, nvec)
        if not len(active):
            break
    wall = time.perf_counter() - start_time
    return [{**results[i], "batch_wall_time_s": wall} for i in range(len(seeds))]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m algorithms.tabular.vcbm_batch", description="Many VCBM seeds on WatchRepair-v0 as one numpy batch."
    )
    parser.add_argument("--algo", default="vcbm", help="vcbm or vcbm-plus")
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--out", default=None, help="write the per-seed summaries as JSON here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
    fell_back = sum(s[FELL_BACK] for s in summaries)
    if fell_back:
        print(
            f"{fell_back} of {args.seeds} seeds found no bookmark at a role refresh and acted uniformly at random "
            "until a later refresh found one (a single run warns of it: vcbm/no_bookmarks)"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summaries, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
