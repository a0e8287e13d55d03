"""Turns of TRL's vLLM engine inside multi-turn rollouts: answers with their log-probs, padded so that
every process passes as many prompts; and the weight sync of TRL's colocated engine on vLLM's CPU build."""

from __future__ import annotations

import functools
import math

from algorithms.common.errors import VcbmGymError


def vllm_answers(completion_ids, logprobs) -> list[tuple[list[int], list[float]]]:
    """(token ids, sampled-token log-probs) per completion from TRL's vLLM engine (`logprobs[j][i][0]`).

    A missing log-prob (no list, a None, a NaN, or fewer than the tokens) raises: a stand-in value
    such as 0.0 would make the importance ratio and the KL estimate of that token silently wrong.
    """
    if logprobs is None or len(logprobs) != len(completion_ids):
        raise VcbmGymError(
            f"vLLM returned log-probs for {0 if logprobs is None else len(logprobs)} of "
            f"{len(completion_ids)} completions; expected one per completion (logprobs enabled)"
        )
    out = []
    for j, (ids, seq) in enumerate(zip(completion_ids, logprobs)):
        values = []
        for i in range(len(ids)):
            lp = seq[i] if seq is not None and i < len(seq) else None
            value = lp[0] if isinstance(lp, (list, tuple)) and lp else None
            if value is None or not math.isfinite(float(value)):
                raise VcbmGymError(
                    f"vLLM returned no log-prob for token {i} of completion {j} ({lp!r}); expected the "
                    "sampled token's log-prob for every generated token"
                )
            values.append(float(value))
        out.append((list(ids), values))
    return out


def gather_counts(n: int) -> list[int]:
    """Every process's number of contexts this turn, in rank order (a collective: every process calls it)."""
    from accelerate.utils import gather_object

    return [int(c) for c in gather_object([n])]


def vllm_turn(gen, contexts: list[list[int]], counts=gather_counts, dummy: list[int] | None = None):
    """One turn of TRL's vLLM generation for this process's contexts, one answer per context.

    TRL 1.16's `VLLMGeneration.generate` gathers every rank's prompts (server mode: all processes;
    colocate with tensor parallelism: the TP group) and hands rank r back the completions at
    [r * len(prompts), (r + 1) * len(prompts)): right only when every rank passes as many prompts.
    In a multi-turn rollout the ranks' live episodes differ, so with `counts` (every process's
    count, a collective) each process pads its contexts to the largest count with `dummy` prompts
    and drops their answers; when no process has a context, nothing is generated. `counts=None`
    (one process, or colocate without tensor parallelism: no gather) passes the contexts as they are.
    """
    n = len(contexts)
    width = max(counts(n)) if counts is not None else n
    if width == 0:
        return []
    prompts = list(contexts) + [list(dummy or [0])] * (width - n)
    _, completion_ids, logprobs, _ = gen.generate(prompts=prompts, images=None, num_generations=1)
    return vllm_answers(completion_ids[:n], None if logprobs is None else logprobs[:n])


def reload_weights(gen) -> None:
    """TRL's colocate weight sync, with the parameters loaded through vLLM's `reload_weights`.

    TRL 1.16 hands each parameter to the model's `load_weights`, which fills the weight tensors vLLM
    keeps. vLLM's CPU build keeps none for its linear layers: after loading it packs each weight into
    a oneDNN (or SGL) GEMM handle and replaces the parameter with an empty one, so TRL's sync fails
    (`'Parameter' object has no attribute 'weight_loader'`). `reload_weights(is_checkpoint_format=True)`
    restores each layer to its checkpoint form, loads the streamed weights and packs them again.
    The parameters come from TRL's own iterator (PEFT merged, names mapped), as in TRL's sync.
    """
    runner = gen.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=gen._iter_named_params(), is_checkpoint_format=True)
    gen.llm.reset_prefix_cache()  # as TRL does: no prefix cached under the old weights is reused


def fit_engine_to_platform(gen) -> None:
    """Give TRL's colocated vLLM engine the weight sync its platform needs: `reload_weights` on vLLM's
    CPU build; TRL's own sync elsewhere (server mode, GPUs)."""
    if gen.mode != "colocate":
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        gen.sync_weights = functools.partial(reload_weights, gen)
