"""Multi-turn rollouts of any Gymnasium text env: observation text in, action text out.

Each episode becomes one training sequence: the chat-templated prompt (system + first
observation), then every model answer followed by the environment's reply rendered as the next
user turn. Model tokens have env_mask 1, environment tokens 0 (never trained). Every completion
token carries its turn id; per turn we keep the env contract's keys (vcbm_gym/contract.py):
`info["state_mutating"]`, `info["execution_output"]` (the VCBM bookmark key; the observation when
absent) and `info["effect"]` (EMPO's canonical effect; None when absent). The runner checks at the
first step that the env reports the keys the chosen credit and ratio sharing learn from.

Generation is batched over the live episodes of a turn: `CachedGeneration` (algorithms.llm.generation.decode,
each episode's keys and values kept across turns, the packed forward of algorithms.llm.generation.packed_forward
where the model allows) by default, `hf_generate` (transformers `generate`, every context re-encoded
each turn) for sharded or sliding-window models, TRL's vLLM engine when the trainer has one. When the conversation outgrows
`truncation_chars`, the context given to the model is the truncated one (algorithms.llm.generation.prompting)
while the training sequence keeps every token; the importance ratio against the trainer's own
log-probabilities absorbs the difference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper

from algorithms.common.errors import VcbmGymError
from algorithms.llm.generation.decode import CachedGeneration, answers_until_eos, full_attention_only, left_padded
from algorithms.llm.generation.prompting import WITH_ONE_SHOT, initial_messages, prompt_chars, truncate_messages
from envs.snapshot import restore, snapshot
from vcbm_gym.contract import check_reward, env_name

# CachedGeneration and full_attention_only: the trainer's rollout generation imports them from here
__all__ = [
    "CachedGeneration",
    "Episode",
    "branch_episode",
    "env_reply_text",
    "full_attention_only",
    "hf_generate",
    "play_continuations",
    "play_episodes",
    "render",
    "turn_entropies",
]


# a turn's `effect` when its answer executed nothing: the contract's None (TextWorld's games, AppWorld's code that
# does not parse) or "invalid" (the embedded envs' canonical name for an answer that names no tool)
NO_EFFECT = (None, "invalid")


@dataclass
class Episode:
    task_seed: int
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    state_mutating: list[bool] = field(default_factory=list)
    turn_texts: list[str] = field(default_factory=list)
    effects: list[Any] = field(default_factory=list)  # EMPO effect per turn, info["effect"] (None: none)
    decision_turns: list[bool] = field(default_factory=list)  # evaluation only: info["is_decision_turn"]
    optimal_turns: list[bool | None] = field(default_factory=list)  # evaluation only: info["action_optimal"], if given
    turn_rewards: list[float] = field(default_factory=list)  # the env's reward at each turn
    # where each turn started: (len(completion_ids), len(messages)) before its answer, and, when the rollout was
    # asked for them (play_episodes(snapshots=True)), the env's snapshot there (envs.snapshot): a branch point
    turn_starts: list[tuple[int, int]] = field(default_factory=list)
    snapshots: list[Any] = field(default_factory=list)
    final_text: str = ""
    episode_return: float = 0.0
    last_info: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)
    done: bool = False
    token_bound_reached: bool = False  # ended by max_episode_tokens (its last answer possibly cut)

    @property
    def n_generated(self) -> int:
        return int(sum(self.env_mask))


def render(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


_DUMMY_EXCHANGE = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\x1fA\x1f"}]


@functools.lru_cache(maxsize=8)
def _closed_exchange(tokenizer, template: str) -> str:
    """The rendered dummy exchange: it does not depend on the observation (rendered once per tokenizer and template)."""
    return render(tokenizer, _DUMMY_EXCHANGE, add_generation_prompt=False)


def env_reply_text(tokenizer, observation: str, answer_closed: bool) -> str:
    """The template text between a model answer and the next answer: end of turn, user turn, header.

    Found by rendering a dummy exchange with and without the extra user turn, so any chat template
    works (including those that inject a default system prompt). Kept per tokenizer, template and
    observation (the K rollouts of a task often meet the same observation; a render costs more
    than the lookup).
    """
    return _env_reply_text(tokenizer, str(tokenizer.chat_template), observation, answer_closed)


@functools.lru_cache(maxsize=4096)
def _env_reply_text(tokenizer, template: str, observation: str, answer_closed: bool) -> str:
    closed = _closed_exchange(tokenizer, template)
    full = render(tokenizer, _DUMMY_EXCHANGE + [{"role": "user", "content": observation}], add_generation_prompt=True)
    if not full.startswith(closed):
        raise ValueError("the chat template does not render conversations as extensions of their prefixes")
    tail = closed[closed.rindex("\x1fA\x1f") + 3 :]
    eos = tokenizer.eos_token or ""
    if answer_closed and tail.startswith(eos):
        tail = tail[len(eos) :]
    return tail + full[len(closed) :]


class _SampledLogprobs(LogitsProcessor):
    """Records, per generated step, the log-prob of the token sampled from that step's scores.

    Placed last in the processor list, it sees the scores the sampler draws from (after the
    temperature warper) and returns them unchanged. Step t's token is only known at step t+1 (the
    last column of `input_ids`), so it keeps one step's scores, [batch, vocab], and gathers then;
    the last step is gathered after `generate` from the returned sequences (`finish`). The values
    go into one preallocated [batch, max_new_tokens] tensor (no small allocation per step).
    """

    def __init__(self, batch: int, max_new_tokens: int) -> None:
        self.logps = torch.zeros((batch, max_new_tokens))
        self.n = 0  # steps gathered
        self._pending: torch.Tensor | None = None

    def _gather(self, tokens: torch.Tensor) -> None:
        logps = torch.log_softmax(self._pending.float(), dim=-1)  # one step: [batch, vocab]
        self.logps[:, self.n] = logps.gather(-1, tokens.reshape(-1, 1).to(logps.device)).squeeze(-1).cpu()
        self.n += 1
        self._pending = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._pending is not None:
            self._gather(input_ids[:, -1])
        self._pending = scores
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """[batch, steps] log-probs of `new_tokens` (the generated columns of the returned sequences)."""
        if self._pending is not None and self.n < new_tokens.shape[1]:
            self._gather(new_tokens[:, self.n])
        self._pending = None
        return self.logps[:, : new_tokens.shape[1]]


@torch.no_grad()
def hf_generate(
    model, tokenizer, contexts: list[list[int]], max_new_tokens: int, temperature: float, synced: bool = False
) -> list[tuple[list[int], list[float]]]:
    """Sample one answer per context (left-padded batch); returns (token ids, log-probs) per context.

    Log-probs are those of the sampled tokens only, under the temperature-scaled distribution they
    were drawn from: one step's [batch, vocab] log-softmax at a time (`_SampledLogprobs`), never the
    [batch, steps, vocab] stack that `output_scores=True` keeps (about 22 GB for 24 episodes x
    1,500 steps at a 152k vocabulary). The values are those of `log_softmax(scores)[token]`.
    Temperature is applied by our own warper just before the recorder, and every other warper is
    switched off, so the recorder is the last processor (transformers appends its own warpers after
    the caller's processors).

    `synced`: the model's parameters are sharded over processes (FSDP), so every forward pass is a
    collective: generation runs with `synced_gpus=True` (a process whose answers are finished keeps
    stepping until all are), and a process with no context still generates, on a one-token dummy
    context whose answer is dropped.
    """
    if not contexts and not synced:
        return []
    dummy = not contexts
    contexts = contexts or [[tokenizer.eos_token_id]]
    pad = tokenizer.pad_token_id
    input_ids, attention = left_padded(contexts, pad)
    width = input_ids.shape[1]
    device = next(model.parameters()).device
    recorder = _SampledLogprobs(len(contexts), max_new_tokens)
    processors = LogitsProcessorList([recorder])
    if temperature != 1.0:
        processors.insert(0, TemperatureLogitsWarper(temperature))
    was_training = model.training
    model.eval()
    try:
        sequences = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            min_p=None,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            top_h=None,
            renormalize_logits=False,
            logits_processor=processors,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
            synced_gpus=synced,
        )
    finally:
        if was_training:
            model.train()
    if dummy:
        return []
    new = sequences[:, width:].cpu()
    return answers_until_eos(new, recorder.finish(new), tokenizer.eos_token_id)


def takes_outcome_seed(env: gym.Env) -> bool:
    """The env's reset takes options={"outcome_seed": s}: the episode's outcome drawn apart from its task seed."""
    return "outcome_seed" in env.metadata.get("reset_options", ())


def _reset(env: gym.Env, task_seed: int, outcome_seed: int | None):
    if outcome_seed is None or not takes_outcome_seed(env):
        return env.reset(seed=int(task_seed))
    return env.reset(seed=int(task_seed), options={"outcome_seed": int(outcome_seed)})


def _reset_episodes(
    tokenizer, envs, task_seeds, one_shot: bool, system_prompt, max_episode_tokens, outcome_seeds=None
) -> list[Episode]:
    """Each env reset with its task seed (and its outcome seed, where the env takes one); the first prompts
    rendered once per distinct observation, tokenized in one call."""
    outcomes = [None] * len(envs) if outcome_seeds is None else list(outcome_seeds)
    resets = [_reset(env, seed, outcome) for env, seed, outcome in zip(envs, task_seeds, outcomes)]
    observations, infos = [obs for obs, _ in resets], [info for _, info in resets]
    return prompt_episodes(tokenizer, task_seeds, observations, infos, one_shot, system_prompt, max_episode_tokens)


def prompt_episodes(
    tokenizer, task_seeds, observations, infos, one_shot: bool, system_prompt, max_episode_tokens, what: str = "the first prompt"
) -> list[Episode]:
    """An episode per observation, its prompt [system, observation] rendered once per distinct observation (K rollouts
    of a task share it) and tokenized in one call; a prompt that leaves no room under `max_episode_tokens` is one
    line naming `what` it is."""
    messages = [initial_messages(str(obs), one_shot, system_prompt) for obs in observations]
    rendered = {m[-1]["content"]: i for i, m in enumerate(messages)}
    texts = [render(tokenizer, messages[i], True) for i in rendered.values()]
    encoded = dict(zip(rendered, tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []))
    episodes = []
    for seed, m, info in zip(task_seeds, messages, infos):
        ids = encoded[m[-1]["content"]]
        if max_episode_tokens is not None and len(ids) >= max_episode_tokens:
            raise VcbmGymError(
                f"task seed {int(seed)}: {what} is {len(ids)} tokens, which leaves no room to generate under "
                f"max_episode_tokens={max_episode_tokens}; expected max_episode_tokens > {len(ids)}"
            )
        episodes.append(Episode(task_seed=int(seed), prompt_ids=list(ids), messages=m, last_info=dict(info)))
    return episodes


def _context(tokenizer, episode: Episode, truncation_chars: int) -> list[int]:
    """The tokens the model sees: the training sequence so far, or past `truncation_chars` its truncated rendering."""
    if prompt_chars(episode.messages) > truncation_chars:
        short = truncate_messages(episode.messages, truncation_chars)
        return tokenizer(render(tokenizer, short, True), add_special_tokens=False)["input_ids"]
    return episode.prompt_ids + episode.completion_ids


def _take_turn(tokenizer, e: Episode, env, turn: int, answer, text: str, last_turn: bool, max_episode_tokens) -> str | None:
    """Record the answer (cut at the token bound), step the env with it; the env reply's template text, or None at the end."""
    ids, lps = answer
    if max_episode_tokens is not None:
        room = max_episode_tokens - len(e.prompt_ids) - len(e.completion_ids)
        if len(ids) >= room:  # this answer reaches the bound: the episode's last turn
            ids, lps = ids[:room], lps[:room]
            e.token_bound_reached = True
            text = tokenizer.decode(ids, skip_special_tokens=True)
    e.completion_ids += ids
    e.env_mask += [1] * len(ids)
    e.logprobs += lps
    e.turn_ids += [turn] * len(ids)
    obs, reward, terminated, truncated, info = env.step(text)
    reward = check_reward(reward, env_name(env), f"turn {turn + 1} of the episode of task seed {e.task_seed}")
    e.episode_return += reward
    e.turn_rewards.append(reward)
    e.state_mutating.append(bool(info.get("state_mutating", False)))
    e.turn_texts.append(str(info.get("execution_output", obs)))
    e.effects.append(info.get("effect"))
    e.decision_turns.append(bool(info.get("is_decision_turn", False)))
    e.optimal_turns.append(None if info.get("action_optimal") is None else bool(info["action_optimal"]))
    e.last_info = dict(info)
    e.messages += [{"role": "assistant", "content": text}, {"role": "user", "content": str(obs)}]
    e.done = bool(terminated or truncated) or last_turn or e.token_bound_reached
    if e.done:
        e.final_text = str(obs)
        return None
    return env_reply_text(tokenizer, str(obs), bool(ids) and ids[-1] == tokenizer.eos_token_id)


def _append_replies(
    tokenizer, episodes: list[Episode], replies: dict[int, str], turns: Sequence[int], max_episode_tokens
) -> None:
    """Tokenize the env replies in one call and append each to its episode (env_mask 0, the turn id of the turn it
    answers, turns[i]), or end it at the token bound."""
    encoded = tokenizer(list(replies.values()), add_special_tokens=False)["input_ids"] if replies else []
    for i, reply in zip(replies, encoded):
        e = episodes[i]
        length = len(e.prompt_ids) + len(e.completion_ids) + len(reply)
        if max_episode_tokens is not None and length >= max_episode_tokens:
            e.done = e.token_bound_reached = True  # no room for the next answer
            e.final_text = e.messages[-1]["content"]
        else:
            e.completion_ids += reply
            e.env_mask += [0] * len(reply)
            e.logprobs += [0.0] * len(reply)
            e.turn_ids += [turns[i]] * len(reply)


def play_episodes(
    generate: Callable[[list[list[int]]], list[tuple[list[int], list[float]]]],
    tokenizer,
    envs: Sequence[gym.Env],
    task_seeds: Sequence[int],
    max_turns: int,
    truncation_chars: int = 20_000,
    one_shot: bool = WITH_ONE_SHOT,
    system_prompt: str | None = None,
    lockstep: bool = False,
    max_episode_tokens: int | None = None,
    outcome_seeds: Sequence[int] | None = None,
    snapshots: bool = False,
) -> list[Episode]:
    """Play one episode per env, env i reset with seed task_seeds[i]; all turns batched.

    `outcome_seeds`: env i's reset also gets options={"outcome_seed": outcome_seeds[i]} where the env takes it
    (`takes_outcome_seed`; others get the task seed alone), so that rollouts of one task meet independent outcomes.
    None: the task seed fixes both.

    `lockstep`: call `generate` on every one of the `max_turns` turns, with no contexts once this
    process's episodes are over, so that collective generation (vLLM across processes) never waits
    on a process that stopped early.

    `max_episode_tokens` bounds each training sequence (prompt + completion tokens): an answer that
    would cross it is cut at the bound (a prefix of a sample: its log-probs stay exact), the env
    still takes the (cut) answer as that turn's action, and the episode ends there with the return
    it has, as at the turn limit; so does an episode whose next environment reply would leave no
    room for a generated token. Such episodes are marked `token_bound_reached`. A first prompt that
    already fills the bound is refused (VcbmGymError, one line). None: no bound.

    `snapshots`: keep the env's snapshot at the start of every turn (`Episode.snapshots`), the branch points of
    `play_continuations` (the branch-based credit rules, vcbm_gym/credit/branch.py).
    """
    if outcome_seeds is not None and len(outcome_seeds) != len(task_seeds):
        raise ValueError(f"{len(outcome_seeds)} outcome seeds for {len(task_seeds)} task seeds: expected one per task seed")
    episodes = _reset_episodes(tokenizer, envs, task_seeds, one_shot, system_prompt, max_episode_tokens, outcome_seeds)
    _play_turns(
        generate,
        tokenizer,
        episodes,
        envs,
        [0] * len(episodes),
        max_turns,
        truncation_chars,
        lockstep,
        max_episode_tokens,
        snapshots,
    )
    return episodes


def _play_turns(
    generate,
    tokenizer,
    episodes: list[Episode],
    envs,
    turns: list[int],
    max_turns: int,
    truncation_chars: int,
    lockstep: bool,
    max_episode_tokens: int | None,
    snapshots: bool,
) -> None:
    """Play every episode to its end, episode i from its turn turns[i]; one batched generation per round, at most
    `max_turns` rounds (every episode takes one turn per round until it ends; lockstep: all `max_turns` rounds)."""
    turns = list(turns)
    for _ in range(max_turns):
        live = [i for i, e in enumerate(episodes) if not e.done]
        if not live and not lockstep:
            break
        for i in live:
            e = episodes[i]
            e.turn_starts.append((len(e.completion_ids), len(e.messages)))
            if snapshots:
                e.snapshots.append(snapshot(envs[i]))
        answers = generate([_context(tokenizer, episodes[i], truncation_chars) for i in live])
        texts = tokenizer.batch_decode([ids for ids, _ in answers], skip_special_tokens=True)
        replies: dict[int, str] = {}  # episode -> the template text of its env reply (tokenized together)
        for i, answer, text in zip(live, answers, texts):
            last = turns[i] == max_turns - 1
            reply = _take_turn(tokenizer, episodes[i], envs[i], turns[i], answer, text, last, max_episode_tokens)
            if reply is not None:
                replies[i] = reply
        _append_replies(tokenizer, episodes, replies, turns, max_episode_tokens)
        for i in live:
            turns[i] += 1


def branch_episode(episode: Episode, turn: int) -> Episode:
    """The prefix of `episode` before its turn `turn` (the training text and the conversation up to that turn's
    answer, the per-turn records of the turns before it) with a return of 0, so that a continuation played from
    it accumulates its reward-to-go from `turn`."""
    if not 0 <= turn < len(episode.turn_starts):
        raise ValueError(f"turn {turn}: episode of task seed {episode.task_seed} has turns 0..{len(episode.turn_starts) - 1}")
    tokens, n_messages = episode.turn_starts[turn]
    return Episode(
        task_seed=episode.task_seed,
        prompt_ids=list(episode.prompt_ids),
        completion_ids=episode.completion_ids[:tokens],
        env_mask=episode.env_mask[:tokens],
        logprobs=episode.logprobs[:tokens],
        turn_ids=episode.turn_ids[:tokens],
        state_mutating=episode.state_mutating[:turn],
        turn_texts=episode.turn_texts[:turn],
        effects=episode.effects[:turn],
        decision_turns=episode.decision_turns[:turn],
        optimal_turns=episode.optimal_turns[:turn],
        turn_rewards=[],
        messages=[dict(m) for m in episode.messages[:n_messages]],
    )


def play_continuations(
    generate: Callable[[list[list[int]]], list[tuple[list[int], list[float]]]],
    tokenizer,
    envs: Sequence[gym.Env],
    starts: Sequence[tuple[Episode, int, int | None]],
    max_turns: int,
    truncation_chars: int,
    lockstep: bool,
    max_episode_tokens: int | None,
) -> list[Episode]:
    """One continuation per (episode, turn, outcome seed) of `starts`, played to its end by `generate` (the current
    policy): env i restored to the episode's snapshot at the start of that turn (`restore(env, state, outcome_seed)`:
    None continues the episode's own outcome draw, an integer draws what it had not revealed afresh), the same
    text prefix (`branch_episode`). The episodes were played with `play_episodes(snapshots=True)`. Each
    continuation's `episode_return` is its reward-to-go from its turn; its turns from there on are its own."""
    if len(envs) < len(starts):
        raise ValueError(f"{len(envs)} envs for {len(starts)} continuations: expected one env per continuation")
    episodes, turns = [], []
    for env, (episode, turn, outcome_seed) in zip(envs, starts):
        if turn >= len(episode.snapshots):
            raise ValueError(
                f"turn {turn} of the episode of task seed {episode.task_seed} has no snapshot: play the episodes with "
                "play_episodes(snapshots=True)"
            )
        restore(env, episode.snapshots[turn], outcome_seed)
        episodes.append(branch_episode(episode, turn))
        turns.append(turn)
    _play_turns(
        generate, tokenizer, episodes, list(envs), turns, max_turns, truncation_chars, lockstep, max_episode_tokens, False
    )
    return episodes


@torch.no_grad()
def turn_entropies(model, episodes: Sequence[Episode], temperature: float) -> list[np.ndarray]:
    """Per episode, (n_turns,) the mean entropy of the sampling distribution (softmax of the logits / temperature,
    as the rollout sampled) over each turn's generated tokens (NaN for a turn with none). One forward pass per
    episode over its whole training sequence (its logits are [tokens, vocab] at once)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        for e in episodes:
            ids = torch.tensor([e.prompt_ids + e.completion_ids], device=device)
            logits = model(input_ids=ids).logits[0, len(e.prompt_ids) - 1 : -1].float() / temperature
            logps = torch.log_softmax(logits, dim=-1)
            entropy = -(logps.exp() * logps).sum(-1).cpu().numpy()
            generated, turn_ids = np.asarray(e.env_mask, bool), np.asarray(e.turn_ids)
            n_turns = len(e.turn_rewards)
            out.append(
                np.array(
                    [
                        entropy[generated & (turn_ids == t)].mean() if (generated & (turn_ids == t)).any() else np.nan
                        for t in range(n_turns)
                    ]
                )
            )
    finally:
        if was_training:
            model.train()
    return out
