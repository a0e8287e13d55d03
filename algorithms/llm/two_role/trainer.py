"""Two roles of one model in the LLM arm (`--algo ccpo`): a Thinker writes a note, a Solver answers, and a credit rule
of the registry (CCPO, SEPO, the Shapley form, or plain GRPO on the shared reward) pays each role (docs/papers/ccpo.md;
Z. Li et al., arXiv 2603.21563, reference code bhai114/ccpo).

One model plays both roles; the role prompt is the env's observation ("Role: Thinker. ..." or "Role: Solver. ...",
envs/text_think_solve.py) under the run's system prompt. Each role's turn is a sequence of its own, so the Solver
never sees the Thinker's prompt (the record), only the note in its own prompt. Per task and rollout
(`play_two_roles`):

1. the Thinker's note, from the joint episode's first observation;
2. the Solver's joint answer, from the observation that carries the note: R_joint;
3. the Solver's solo answer, from the same task reset in solo mode (the problem only): R_solo, the counterfactual.

All three are generated for every rollout of the iteration; the rows TRL trains (one per rollout, as TRL's batch
holds) are the trained role's turns (`TwoRoleConfig.role_schedule`: the Thinker's notes for `switch_every`
iterations, then the Solver's joint answers, and so on; or under `both` the task groups alternating between the
roles). Solo answers are never trained. `TwoRoleTrainer.token_advantages` puts the shared reward R_joint on each row's
last generated token and hands the batch, with each row's role, outcomes and splits in its extras, over every process's
rows, to the run's rule (`TWO_ROLE_CREDIT` says what fits): a two-role rule (vcbm_gym/credit/ccpo.py) pays each row its
role's reward and gives GRPO's advantage without std, r_k - mean of its task's rows of that role, on every generated
token of the row; `grpo` (without std here) does the same with R_joint for both roles. The loss is LoopTrainer's,
under the run's `objective` (ppo_clip, gspo or reinforce_pp); no KL.

Metrics per iteration (history.json, TensorBoard `loop/`): `task_goal_completion` and `mean_return` of the joint
episodes (all rollouts), `solo_task_goal_completion`, `thinker_help` (joint minus solo success), `thinker_rows`
(the share of trained rows that are the Thinker's), `mean_role_reward`, and under a rule that reads the credit
splits (SEPO) `split_parse_rate`, `thinker_split_parse_rate` and `solver_split_parse_rate`: the share of all ratings,
the Thinker's and the Solver's, whose split could be read (the rest fall back to (0.5, 0.5)); absent where no rating
was asked. Under `--model tiny` both roles are played by the warm-start that also learnt the rating's format
(two_role/warm_start.py).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from algorithms.common.credit_slot import credit_of
from algorithms.common.errors import VcbmGymError
from algorithms.llm.generation.prompting import WITH_ONE_SHOT
from algorithms.llm.generation.rollout import Episode, _take_turn, prompt_episodes, render
from algorithms.llm.training.batch import gather_episode_batch
from algorithms.llm.training.loop import LoopTrainer
from algorithms.llm.training.loss import global_normalized_advantages
from algorithms.llm.two_role.config import TwoRoleConfig, role_of_iteration, row_roles
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.ccpo import ROLE_EXTRAS, SPLIT_EXTRAS, RoleCreditRule, parse_credit_split

# SEPO: after the joint turns, each role is asked (in its own conversation) for its split of the credit, parsed
# by vcbm_gym.credit.ccpo.parse_credit_split; the task's own prompts stay as they are. It asks for the Thinker's share
# alone, one number: the nine splits sum to 1, and a tiny model taught to write the pair (the reference's form, which
# the parser still reads) chose its second share independently of the first, so only about 1 pair in 9 was a split
RATING_REQUEST = (
    'The Thinker\'s note was: "{note}". The Solver answered: "{answer}". Rate how the credit for the outcome '
    "splits between the Thinker and the Solver: the Thinker's share, the Solver having the rest, as one of (0.9), "
    "(0.8), ..., (0.1)."
)
# the per-row inputs of the role rewards, in EpisodeBatch.extras (gathered with the batch over processes)
EXTRAS = (*ROLE_EXTRAS, *SPLIT_EXTRAS)
PARSE_RATES = ("split_parse_rate", "thinker_split_parse_rate", "solver_split_parse_rate")  # metrics where ratings were asked


@dataclass
class TwoRolePlay:
    """One iteration's episodes, one entry per rollout in each list: the Thinker's turn, the Solver's joint answer
    (its `episode_return` is R_joint), and the Solver's solo answer (R_solo)."""

    thinker: list[Episode]
    joint: list[Episode]
    solo: list[Episode]
    thinker_ratings: list[str] | None = None  # SEPO: each role's rating text (None: not asked)
    solver_ratings: list[str] | None = None

    @staticmethod
    def _success(episodes: list[Episode]) -> np.ndarray:
        return np.array([float(e.last_info.get("task_goal_completion", 0.0)) for e in episodes])

    @property
    def r_joint(self) -> np.ndarray:
        return np.array([e.episode_return for e in self.joint])

    @property
    def r_solo(self) -> np.ndarray:
        return np.array([e.episode_return for e in self.solo])

    @property
    def joint_success(self) -> np.ndarray:
        return self._success(self.joint)

    @property
    def solo_success(self) -> np.ndarray:
        return self._success(self.solo)

    def splits(self) -> tuple[list, list, list[bool], list[bool]]:
        """Each rollout's (Thinker share, Solver share) as the Thinker and as the Solver rated it, and whether each
        role's rating could be read (the rest fall back to (0.5, 0.5); no rating asked: all fall back)."""
        n = len(self.thinker)
        thinker = [parse_credit_split(t) for t in (self.thinker_ratings or [""] * n)]
        solver = [parse_credit_split(t) for t in (self.solver_ratings or [""] * n)]
        return (
            [[s.thinker, s.solver] for s in thinker],
            [[s.thinker, s.solver] for s in solver],
            [s.parsed for s in thinker],
            [s.parsed for s in solver],
        )


def answer_text(episode: Episode) -> str:
    """The text of an episode's one answer (the assistant message after the prompt)."""
    return episode.messages[2]["content"] if len(episode.messages) > 2 else ""


def reset_all(envs: Sequence[gym.Env], seeds: Sequence[int], outcome_seeds: Sequence[int] | None, solo: bool) -> list:
    """Each env reset with its task seed, in joint or solo mode (and its outcome seed, where given)."""
    out = []
    for k, (env, seed) in enumerate(zip(envs, seeds)):
        options: dict[str, Any] = {"solo": solo}
        if outcome_seeds is not None:
            options["outcome_seed"] = int(outcome_seeds[k])
        out.append(env.reset(seed=int(seed), options=options))
    return out


def answer_turn(
    generate: Callable[[list[list[int]]], list[tuple[list[int], list[float]]]],
    tokenizer,
    envs: Sequence[gym.Env],
    seeds: Sequence[int],
    observations: Sequence[str],
    infos: Sequence[dict],
    one_shot: bool,
    system_prompt: str | None,
    max_episode_tokens: int | None,
) -> list[Episode]:
    """One turn per env from its current observation, as one-turn episodes: the prompt [system, observation]
    (rendered once per distinct observation), one sampled answer, the env stepped with it (rollout._take_turn: the
    reward, info and the next observation, kept as the episode's `final_text`)."""
    episodes = prompt_episodes(
        tokenizer, seeds, observations, infos, one_shot, system_prompt, max_episode_tokens, what="a role's prompt"
    )
    answers = generate([e.prompt_ids for e in episodes]) if episodes else []
    decoded = tokenizer.batch_decode([ids for ids, _ in answers], skip_special_tokens=True)
    for e, env, answer, text in zip(episodes, envs, answers, decoded):
        _take_turn(tokenizer, e, env, 0, answer, text, True, max_episode_tokens)
    return episodes


def play_two_roles(
    generation: Callable[[], Callable],
    tokenizer,
    envs: Sequence[gym.Env],
    seeds: Sequence[int],
    outcome_seeds: Sequence[int] | None = None,
    one_shot: bool = WITH_ONE_SHOT,
    system_prompt: str | None = None,
    max_episode_tokens: int | None = None,
    request_split: bool = False,
) -> TwoRolePlay:
    """The Thinker's note, the Solver's joint answer and its solo answer for each (env, task seed); `generation()`
    gives each phase a fresh generator (a cached one keeps one phase's contexts). `request_split` (SEPO): then each
    role rates the credit split of the joint episode (`rate_splits`)."""
    common = (tokenizer, envs, seeds)
    resets = reset_all(envs, seeds, outcome_seeds, solo=False)
    thinker = answer_turn(
        generation(), *common, [o for o, _ in resets], [i for _, i in resets], one_shot, system_prompt, max_episode_tokens
    )
    joint = answer_turn(
        generation(),
        *common,
        [e.final_text for e in thinker],
        [e.last_info for e in thinker],
        one_shot,
        system_prompt,
        max_episode_tokens,
    )
    resets = reset_all(envs, seeds, outcome_seeds, solo=True)
    solo = answer_turn(
        generation(), *common, [o for o, _ in resets], [i for _, i in resets], one_shot, system_prompt, max_episode_tokens
    )
    play = TwoRolePlay(thinker, joint, solo)
    if request_split:
        play.thinker_ratings, play.solver_ratings = rate_splits(generation, tokenizer, thinker, joint)
    return play


def rate_splits(generation: Callable[[], Callable], tokenizer, thinker: list[Episode], joint: list[Episode]):
    """SEPO's self-evaluation: each role, in its own conversation (its prompt and its answer), is asked for the
    credit split of the joint episode (RATING_REQUEST, which quotes the note and the Solver's answer); the
    (Thinker's, Solver's) rating texts. The ratings are sampled, not trained."""
    texts = {}
    for name in ("thinker", "solver"):
        contexts = []
        for t, j in zip(thinker, joint):
            own = t if name == "thinker" else j
            ask = RATING_REQUEST.format(note=answer_text(t), answer=answer_text(j))
            messages = own.messages[:3] + [{"role": "user", "content": ask}]
            contexts.append(tokenizer(render(tokenizer, messages, True), add_special_tokens=False)["input_ids"])
        answers = generation()(contexts) if contexts else []
        texts[name] = tokenizer.batch_decode([ids for ids, _ in answers], skip_special_tokens=True)
    return texts["thinker"], texts["solver"]


def shared_reward_batch(batch: EpisodeBatch) -> EpisodeBatch:
    """`batch` (its extras holding EXTRAS per row) with the shared reward R_joint on each row's last generated token
    (docs/papers/ccpo.md: "the reward on the role's last token"): the rule's input. A two-role rule pays each row its
    role's reward from the extras; `grpo` pays both roles R_joint. A task group's rows are all of one role under
    either schedule (`row_roles`), so a group baseline over the task group is one over the task's rows of that role."""
    rewards = np.zeros(batch.rewards.shape)
    for b, r_joint in enumerate(batch.extras["r_joint"]):
        generated = np.flatnonzero(batch.mask[b])
        if len(generated):
            rewards[b, generated[-1]] = r_joint
    return dataclasses.replace(batch, rewards=rewards)


class TwoRoleTrainer(LoopTrainer):
    """LoopTrainer whose rollouts are two-role plays and whose advantages are a two-role rule's (module docstring)."""

    def __init__(self, model, args: TwoRoleConfig, *trainer_args, **trainer_kwargs) -> None:
        if not isinstance(args, TwoRoleConfig):
            raise TypeError(f"args: expected a TwoRoleConfig, got {type(args).__name__}")
        self._row_extras: dict[str, list] = {}
        self._play: TwoRolePlay | None = None
        self._parsed: list[list[bool]] = [[], []]  # per rollout: the Thinker's and the Solver's rating read
        super().__init__(model, args, *trainer_args, **trainer_kwargs)
        reset_options = self._envs(1)[0].metadata.get("reset_options", ())
        if "solo" not in reset_options:
            raise VcbmGymError(
                f"--algo ccpo on {self.env_id}: the env takes no reset option 'solo' (the Solver's turn without the "
                "Thinker's); expected a two-role env such as TextThinkSolve-v0"
            )

    def _rollout(self, prompts: list[str], trainer) -> dict[str, list]:
        seeds = [int(p) for p in prompts]
        start = time.perf_counter()
        iteration = self.state.global_step // self.args.optimizer_steps_per_iteration
        role = role_of_iteration(iteration, self.args.role_schedule, self.args.switch_every)
        roles = row_roles(role, len(seeds), self.num_generations)
        play = play_two_roles(
            self._rollout_generation,
            self.processing_class,
            self._envs(len(seeds)),
            seeds,
            self._outcome_seeds(len(seeds)),
            self.args.one_shot,
            self._system_prompt,
            self.episode_token_bound,
            request_split=any(f"extras[{key!r}]" in self.credit_rule.needs() for key in SPLIT_EXTRAS),
        )
        thinker_splits, solver_splits, *self._parsed = play.splits()
        rows = [play.thinker[k] if r == "thinker" else play.joint[k] for k, r in enumerate(roles)]
        self._iter_stats["rollout_time_s"] += time.perf_counter() - start
        self._episodes, self._play = rows, play
        self._row_extras = {
            "role": roles,
            "r_joint": play.r_joint.tolist(),
            "r_solo": play.r_solo.tolist(),
            "thinker_split": thinker_splits,
            "solver_split": solver_splits,
        }
        return {
            "prompt_ids": [e.prompt_ids for e in rows],
            "completion_ids": [e.completion_ids for e in rows],
            "logprobs": [e.logprobs for e in rows],
            "env_mask": [e.env_mask for e in rows],
            "episode_return": play.r_joint.tolist(),
        }

    def token_advantages(self, batch: EpisodeBatch) -> np.ndarray:
        """(B, T) advantages of this process's rows: the rule's credit for every process's rows (`shared_reward_batch`;
        a two-role rule's role rewards through GRPO without std), then REINFORCE++'s global normalisation under that
        objective."""
        batch = dataclasses.replace(batch, extras={**batch.extras, **self._row_extras})
        full, start = gather_episode_batch(self.accelerator, batch)
        full = shared_reward_batch(full)
        self._pending_observe = full
        advantages = credit_of(self.credit_rule, full)
        if self.args.objective == "reinforce_pp":
            advantages = global_normalized_advantages(advantages, full.mask)
        rows = slice(start, start + batch.batch_size)
        role_rewards = self.credit_rule.role_rewards(full) if isinstance(self.credit_rule, RoleCreditRule) else full.returns
        self._iter_stats["mean_role_reward"] = float(role_rewards.mean()) if full.batch_size else 0.0
        self._iter_stats["thinker_rows"] = float(np.mean([r == "thinker" for r in full.extras["role"]]))
        return advantages[rows, : batch.rewards.shape[1]]

    def _record_rollouts(self, episodes: list[Episode], batch: EpisodeBatch, advantages) -> None:
        """The trained rows' metrics (LoopTrainer's), then the joint and solo outcomes and the ratings' parse rates over
        every rollout."""
        super()._record_rollouts(episodes, batch, advantages)
        play = self._play
        local = [play.joint_success.tolist(), play.solo_success.tolist(), play.r_joint.tolist(), play.r_solo.tolist()]
        parts = self._every_process([*local, *self._parsed])
        local = [[x for part in parts for x in part[i]] for i in range(6)]
        joint, solo, r_joint, r_solo, thinker_parsed, solver_parsed = (np.asarray(v, float) for v in local)
        if play.thinker_ratings is not None and len(thinker_parsed):
            self._iter_stats.update(
                {
                    "split_parse_rate": float(np.concatenate([thinker_parsed, solver_parsed]).mean()),
                    "thinker_split_parse_rate": float(thinker_parsed.mean()),
                    "solver_split_parse_rate": float(solver_parsed.mean()),
                }
            )
        self._iter_stats.update(
            {
                "task_goal_completion": float(joint.mean()),
                "solo_task_goal_completion": float(solo.mean()),
                "thinker_help": float(joint.mean() - solo.mean()),
                "mean_return": float(r_joint.mean()),
                "mean_solo_return": float(r_solo.mean()),
            }
        )

    def _iteration_metrics(self) -> dict[str, float]:
        metrics = super()._iteration_metrics()
        for key in ("solo_task_goal_completion", "thinker_help", "mean_solo_return", "mean_role_reward", "thinker_rows"):
            metrics[key] = float(self._iter_stats[key])
        metrics.update({key: float(self._iter_stats[key]) for key in PARSE_RATES if key in self._iter_stats})
        return metrics
