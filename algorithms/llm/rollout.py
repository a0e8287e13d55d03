"""Multi-turn rollouts of any Gymnasium text env: observation text in, action text out.

Each episode becomes one training sequence: the chat-templated prompt (system + first
observation), then every model answer followed by the environment's reply rendered as the next
user turn. Model tokens have env_mask 1, environment tokens 0 (never trained). Every completion
token carries its turn id; per turn we keep the env contract's keys (vcbm_gym/contract.py):
`info["state_mutating"]`, `info["execution_output"]` (the VCBM bookmark key; the observation when
absent) and `info["effect"]` (EMPO's canonical effect; None when absent). The runner checks at the
first step that the env reports the keys the chosen credit and ratio sharing learn from.

Generation is batched over the live episodes of a turn with transformers `generate` (TRL's vLLM
engine is used instead when the trainer has one). When the conversation outgrows
`truncation_chars`, the context given to the model is the truncated one (algorithms.llm.prompting)
while the training sequence keeps every token; the importance ratio against the trainer's own
log-probabilities absorbs the difference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import gymnasium as gym
import torch
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper
from transformers.cache_utils import DynamicLayer

from algorithms.common.errors import VcbmGymError
from algorithms.llm.prompting import initial_messages, prompt_chars, truncate_messages
from vcbm_gym.contract import check_reward, env_name


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
    works (including those that inject a default system prompt).
    """
    closed = _closed_exchange(tokenizer, str(tokenizer.chat_template))
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


def left_padded(contexts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[batch, longest context] token ids, left-padded with `pad`, and their attention mask."""
    width = max(len(c) for c in contexts)
    input_ids = torch.full((len(contexts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, c in enumerate(contexts):
        input_ids[i, width - len(c) :] = torch.tensor(c)
        attention[i, width - len(c) :] = 1
    return input_ids, attention


def answers_until_eos(new: torch.Tensor, token_logps: torch.Tensor, eos: int) -> list[tuple[list[int], list[float]]]:
    """(token ids, log-probs) per row of the generated [batch, steps] tokens, each cut after its first `eos`."""
    results = []
    for row, row_logps in zip(new.tolist(), token_logps.tolist()):
        end = row.index(eos) + 1 if eos in row else len(row)
        results.append((row[:end], [float(x) for x in row_logps[:end]]))
    return results


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


def full_attention_only(model) -> bool:
    """Whether every layer of `model` attends over the whole context (no sliding window, no linear attention).

    The cached path leaves holes (masked slots) in the middle of a row's cache; a sliding window
    counts slots, not tokens, so it would see a different context than a re-encoding does.
    """
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return not getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None) is None
    return all(t == "full_attention" for t in layer_types)


def _common_prefix_length(contexts: list[list[int]]) -> int:
    first = contexts[0]
    n = min(len(c) for c in contexts)
    for c in contexts[1:]:
        k = 0
        while k < n and c[k] == first[k]:
            k += 1
        n = k
    return n


class _ReservedLayer(DynamicLayer):
    """A cache layer whose keys and values sit in buffers with room to spare (`reserve`).

    transformers' DynamicLayer concatenates every step's keys and values onto the cache, a copy of
    the whole cache per step and layer (most of a decoding step's time on the tiny model, measured);
    here a step writes its slot in place and `keys` / `values` are views of the filled part.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._length = 0
        self._room = 0

    def reserve(self, slots: int) -> None:
        """Make room for `slots` more slots (the next call's new tokens and steps) before they arrive."""
        self._room = slots

    def _view(self) -> None:
        keys, values = self._buffers
        self.keys, self.values = keys[:, :, : self._length], values[:, :, : self._length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, add = self._length, key_states.shape[-2]
        if self._buffers is None or n + add > self._buffers[0].shape[-2]:
            capacity = n + max(add, self._room)
            grown = []
            for old, new in zip((self.keys, self.values), (key_states, value_states)):
                buffer = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
                if n:
                    buffer[:, :, :n] = old
                grown.append(buffer)
            self._buffers = (grown[0], grown[1])
        self._buffers[0][:, :, n : n + add] = key_states
        self._buffers[1][:, :, n : n + add] = value_states
        self._length = n + add
        self._room = max(self._room - add, 0)
        self._view()
        return self.keys, self.values

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._length:
            self._buffers = tuple(b[:, :, : self._length].repeat_interleave(repeats, dim=0) for b in self._buffers)
            self._view()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._length:
            self._buffers = tuple(b[indices, :, : self._length] for b in self._buffers)
            self._view()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the rollout cache only grows")


class CachedGeneration:
    """Sampling for one rollout that keeps every episode's keys and values from one turn to the next.

    A stateful stand-in for `hf_generate` (the same call: contexts in, (token ids, log-probs) out),
    made for one `play_episodes` call. `hf_generate` re-encodes each live episode's whole context
    every turn; here a context that extends what the cache already holds for an episode (the
    previous context, the tokens sampled for it, then the environment's reply) only feeds its new
    tokens. The first turn encodes each distinct context once (the K rollouts of a task share their
    first prompt) and, before that, the prefix that all of them share (the system prompt) once.
    A context that does not extend its episode's cache (the prompt truncation of
    algorithms.llm.prompting rewrote it) makes the call start over: every context is encoded
    anew, as `hf_generate` does.

    Rows of one batch are kept aligned by masked slots (holes): a left-padded chunk of new tokens,
    and the steps after a row's end-of-sequence, occupy cache slots whose attention mask is 0.
    Position ids count only a row's real tokens, so a row's tokens see the same positions and the
    same keys as in a re-encoding of its context; the sampled tokens and their log-probs are
    those of `hf_generate` up to floating-point rounding (the same ops, fed in other chunks; tested
    against it). Sampling draws as transformers' sampler does (softmax of the temperature-scaled
    float32 scores, then `torch.multinomial`, once per step over the live rows, stopping when
    every row has ended), so seeded runs consume the random stream alike.

    Episodes that ended are dropped from the cache (`Cache.batch_select_indices`). The model's
    layers must all be full attention (`full_attention_only`); single process only (no synced
    generation: sharded models use `hf_generate`).
    """

    def __init__(self, model, tokenizer, max_new_tokens: int, temperature: float) -> None:
        self.model, self.max_new_tokens, self.temperature = model, max_new_tokens, temperature
        self.pad, self.eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        self.cache = None
        self.mask: torch.Tensor | None = None  # [rows, slots]: 1 where the slot holds a real token
        self.held: list[list[int]] = []  # per row: the real tokens whose keys and values the cache holds
        self.device = next(model.parameters()).device
        self.restarts = 0  # calls that encoded every context from scratch (the first, and after a truncation)

    def _match(self, contexts: list[list[int]]) -> list[int] | None:
        """The cache row each context extends (rows in order, as play_episodes keeps its live episodes), or None."""
        rows, r = [], 0
        for c in contexts:
            while r < len(self.held) and not (len(c) > len(self.held[r]) and c[: len(self.held[r])] == self.held[r]):
                r += 1
            if r == len(self.held):
                return None
            rows.append(r)
            r += 1
        return rows

    def _forward(self, chunks: list[list[int]]) -> torch.Tensor:
        """Feed each row its chunk of new tokens (left-padded, pads masked); the last position's logits, [rows, vocab]."""
        new_ids, new_mask = left_padded(chunks, self.pad)
        for layer in self.cache.layers:
            layer.reserve(new_ids.shape[1] + self.max_new_tokens)  # this chunk and the decoding steps after it
        mask = new_mask if self.mask is None else torch.cat([self.mask, new_mask], dim=1)
        positions = (mask.cumsum(-1) - 1)[:, -new_ids.shape[1] :].masked_fill(new_mask == 0, 0)
        out = self.model(
            input_ids=new_ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache, self.mask = out.cache, mask
        return out.logits[:, -1]

    def _start(self, contexts: list[list[int]]) -> torch.Tensor:
        """A fresh cache: each distinct context encoded once (the K rollouts of a task share their first
        prompt), the prefix that all of them share encoded once before that, then rows copied to their episodes."""
        self.cache, self.mask = DynamicCache(config=self.model.config), None
        self.cache.layers = [_ReservedLayer() for _ in self.cache.layers]
        self.restarts += 1
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(c), len(distinct)) for c in contexts]
        unique = [list(c) for c in distinct]
        shared = min(_common_prefix_length(unique), min(len(c) for c in unique) - 1)  # each row keeps >= 1 token
        if shared > 0 and len(unique) > 1:
            self._forward([unique[0][:shared]])
            self.cache.batch_repeat_interleave(len(unique))
            self.mask = self.mask.repeat(len(unique), 1)
        else:
            shared = 0
        logits = self._forward([c[shared:] for c in unique])
        if len(unique) < len(contexts):
            index = torch.tensor(rows)
            self.cache.batch_select_indices(index.to(self.device))
            self.mask, logits = self.mask[index], logits[index.to(logits.device)]
        self.held = [list(c) for c in contexts]
        return logits

    def _resume(self, contexts: list[list[int]], rows: list[int]) -> torch.Tensor:
        if rows != list(range(len(self.held))):
            index = torch.tensor(rows)
            self.cache.batch_select_indices(index.to(self.device))
            self.mask = self.mask[index]
        chunks = [c[len(self.held[r]) :] for c, r in zip(contexts, rows)]
        self.held = [list(c) for c in contexts]
        return self._forward(chunks)

    @torch.no_grad()
    def __call__(self, contexts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        if not contexts:
            return []
        was_training = self.model.training
        self.model.eval()
        try:
            return self._generate(contexts)
        finally:
            if was_training:
                self.model.train()

    def _generate(self, contexts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        rows = self._match(contexts) if self.cache is not None else None
        logits = self._start(contexts) if rows is None else self._resume(contexts, rows)
        batch = len(contexts)
        tokens = torch.full((batch, self.max_new_tokens), self.pad, dtype=torch.long)
        logps = torch.zeros((batch, self.max_new_tokens))
        fed = torch.zeros(batch, dtype=torch.long)  # answer tokens fed back (now in the cache) per row
        live = torch.ones(batch, dtype=torch.bool)
        steps = 0
        for step in range(self.max_new_tokens):
            scores = logits.to(dtype=torch.float32)
            if self.temperature != 1.0:
                scores = scores / self.temperature
            sampled = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            step_logps = torch.log_softmax(scores, dim=-1).gather(-1, sampled[:, None]).squeeze(1).cpu()
            sampled = sampled.cpu()
            tokens[:, step] = torch.where(live, sampled, self.pad)
            logps[:, step] = step_logps
            steps = step + 1
            was_live = live
            live = live & (sampled != self.eos)
            if not live.any() or steps == self.max_new_tokens:
                break
            # feed this step's tokens; a row that had already ended feeds a masked pad
            step_mask = was_live.long()[:, None]
            self.mask = torch.cat([self.mask, step_mask], dim=1)
            fed += was_live.long()
            positions = (self.mask.sum(-1, keepdim=True) - 1).masked_fill(step_mask == 0, 0)
            out = self.model(
                input_ids=tokens[:, step : step + 1].to(self.device),
                attention_mask=self.mask.to(self.device),
                position_ids=positions.to(self.device),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )
            self.cache, logits = out.cache, out.logits[:, -1]
        answers = answers_until_eos(tokens[:, :steps], logps[:, :steps], self.eos)
        self.held = [held + ids[: int(n)] for held, (ids, _), n in zip(self.held, answers, fed)]
        return answers


def play_episodes(
    generate: Callable[[list[list[int]]], list[tuple[list[int], list[float]]]],
    tokenizer,
    envs: Sequence[gym.Env],
    task_seeds: Sequence[int],
    max_turns: int,
    truncation_chars: int = 20_000,
    one_shot: bool = True,
    system_prompt: str | None = None,
    lockstep: bool = False,
    max_episode_tokens: int | None = None,
) -> list[Episode]:
    """Play one episode per env, env i reset with seed task_seeds[i]; all turns batched.

    `lockstep`: call `generate` on every one of the `max_turns` turns, with no contexts once this
    process's episodes are over, so that collective generation (vLLM across processes) never waits
    on a process that stopped early.

    `max_episode_tokens` bounds each training sequence (prompt + completion tokens): an answer that
    would cross it is cut at the bound (a prefix of a sample: its log-probs stay exact), the env
    still takes the (cut) answer as that turn's action, and the episode ends there with the return
    it has, as at the turn limit; so does an episode whose next environment reply would leave no
    room for a generated token. Such episodes are marked `token_bound_reached`. A first prompt that
    already fills the bound is refused (VcbmGymError, one line). None: no bound.
    """
    episodes = []
    for env, seed in zip(envs, task_seeds):
        obs, info = env.reset(seed=int(seed))
        messages = initial_messages(str(obs), one_shot, system_prompt)
        ids = tokenizer(render(tokenizer, messages, True), add_special_tokens=False)["input_ids"]
        if max_episode_tokens is not None and len(ids) >= max_episode_tokens:
            raise VcbmGymError(
                f"task seed {int(seed)}: the first prompt is {len(ids)} tokens, which leaves no room to generate under "
                f"max_episode_tokens={max_episode_tokens}; expected max_episode_tokens > {len(ids)}"
            )
        episodes.append(Episode(task_seed=int(seed), prompt_ids=list(ids), messages=messages, last_info=dict(info)))
    for turn in range(max_turns):
        live = [i for i, e in enumerate(episodes) if not e.done]
        if not live and not lockstep:
            break
        contexts = []
        for e in (episodes[i] for i in live):
            if prompt_chars(e.messages) > truncation_chars:
                short = truncate_messages(e.messages, truncation_chars)
                contexts.append(tokenizer(render(tokenizer, short, True), add_special_tokens=False)["input_ids"])
            else:
                contexts.append(e.prompt_ids + e.completion_ids)
        answers = generate(contexts)
        texts = tokenizer.batch_decode([ids for ids, _ in answers], skip_special_tokens=True)
        replies: dict[int, str] = {}  # episode -> the template text of its env reply (tokenized together below)
        for i, (ids, lps), text in zip(live, answers, texts):
            e, env = episodes[i], envs[i]
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
            e.episode_return += check_reward(reward, env_name(env), f"turn {turn + 1} of the episode of task seed {e.task_seed}")
            e.state_mutating.append(bool(info.get("state_mutating", False)))
            e.turn_texts.append(str(info.get("execution_output", obs)))
            e.effects.append(info.get("effect"))
            e.decision_turns.append(bool(info.get("is_decision_turn", False)))
            e.last_info = dict(info)
            e.messages += [{"role": "assistant", "content": text}, {"role": "user", "content": str(obs)}]
            e.done = bool(terminated or truncated) or turn == max_turns - 1 or e.token_bound_reached
            if e.done:
                e.final_text = str(obs)
            else:
                closed = bool(ids) and ids[-1] == tokenizer.eos_token_id
                replies[i] = env_reply_text(tokenizer, str(obs), closed)
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
                e.turn_ids += [turn] * len(reply)
    return episodes
