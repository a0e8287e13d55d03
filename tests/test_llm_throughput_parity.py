"""The cached rollout path (CachedGeneration: keys and values kept across turns, the shared prompt
prefix encoded once) samples the same tokens with the same log-probs as re-encoding every turn
(hf_generate, the earlier path), for batches of multi-turn episodes, on both cache engines: the
packed forward (algorithms.llm.generation.packed_forward, for Qwen2 / Qwen3 / Llama decoders) and the model's
own forward over a transformers cache."""

import pytest

pytest.importorskip("trl")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

import vcbm_gym  # noqa: E402, F401
from algorithms.llm.generation.packed_forward import packed_forward_supported  # noqa: E402
from algorithms.llm.generation.prompting import initial_messages, prompt_chars  # noqa: E402
from algorithms.llm.generation.rollout import CachedGeneration, full_attention_only, hf_generate, play_episodes  # noqa: E402
from algorithms.llm.model.tiny import build_tiny, build_tiny_model  # noqa: E402

ENGINES = ("packed", "transformers")

# Both paths compute a row's logits from the same tokens at the same positions, summed in other
# chunks (a cache of earlier keys instead of one pass), so they differ by float32 rounding only:
# a few units in the last place of each logit, carried through two layers and a log-softmax.
# 1,024 float32 epsilons (1.2e-4 nats) bounds that with a wide margin; a wrong position, mask or
# cache row moves log-probs by far more (tenths of a nat and up on this model).
LOGPROB_TOLERANCE = 1024 * torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(0)


def _play(generate, tok, envs, seeds, max_turns, **kwargs):
    torch.manual_seed(1234)
    return play_episodes(generate, tok, envs, seeds, max_turns, **kwargs)


def _assert_same(old, new):
    assert len(old) == len(new)
    for a, b in zip(old, new):
        assert b.completion_ids == a.completion_ids  # the same samples and the same env replies
        assert b.env_mask == a.env_mask and b.turn_ids == a.turn_ids
        assert len(b.logprobs) == len(a.logprobs)
        diff = max((abs(p - q) for p, q in zip(a.logprobs, b.logprobs)), default=0.0)
        assert diff <= LOGPROB_TOLERANCE, diff
        assert b.episode_return == a.episode_return and b.final_text == a.final_text


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_cached_generation_samples_what_reencoding_samples_over_several_turns(tiny, temperature, engine):
    model, tok = tiny
    # episodes of different lengths in one batch: 2-turn envs end (and leave the cache) before the
    # 4-turn ones; 3 rollouts of each task share their whole first prompt
    envs = [gym.make("TextWatchRepair-v0", max_turns=2 if i % 2 else 4) for i in range(12)]
    seeds = [i // 3 for i in range(12)]
    max_new = 10  # short enough that some answers are cut at the limit, long enough that others end by eos
    old = _play(lambda c: hf_generate(model, tok, c, max_new, temperature), tok, envs, seeds, 4, one_shot=False)
    cached = CachedGeneration(model, tok, max_new, temperature, engine)
    new = _play(cached, tok, envs, seeds, 4, one_shot=False)
    _assert_same(old, new)
    assert cached.restarts == 1  # only the first turn encoded from scratch
    turns = [max(e.turn_ids) + 1 for e in new]
    assert set(turns) == {2, 4}  # rows did leave the cache mid-rollout
    answers = [
        [t for t, m, k in zip(e.completion_ids, e.env_mask, e.turn_ids) if m and k == turn]
        for e in new
        for turn in range(max(e.turn_ids) + 1)
    ]
    assert any(a[-1] == tok.eos_token_id for a in answers) and any(len(a) == max_new for a in answers)
    assert len({tuple(e.completion_ids) for e in new}) > 6  # the samples differ between rollouts


@pytest.mark.parametrize("engine", ENGINES)
def test_cached_generation_starts_over_when_truncation_rewrites_a_context(tiny, engine):
    """Past `truncation_chars` the context given to the model is no longer an extension of the cache."""
    model, tok = tiny
    envs = [gym.make("TextWatchRepair-v0", max_turns=5) for _ in range(4)]
    seeds = [3, 3, 8, 8]
    first = prompt_chars(initial_messages(envs[0].reset(seed=3)[0], one_shot=False))
    limit = first + 400  # the first turns fit; a turn adds an answer and an observation (~150 characters)
    kwargs = {"truncation_chars": limit, "one_shot": False}
    old = _play(lambda c: hf_generate(model, tok, c, 8, 1.0), tok, envs, seeds, 5, **kwargs)
    cached = CachedGeneration(model, tok, 8, 1.0, engine)
    new = _play(cached, tok, envs, seeds, 5, **kwargs)
    _assert_same(old, new)
    assert 1 < cached.restarts < 5  # truncated turns were encoded anew, untruncated ones continued the cache


def _tiny_decoder(kind: str, vocab: int):
    """A random 2-layer decoder of another family than the tiny Qwen2: Llama (no q/k/v bias) or Qwen3 (q/k head norms)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    sizes = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    torch.manual_seed(7)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**sizes, num_key_value_heads=2, tie_word_embeddings=True)).eval()
    return Qwen3ForCausalLM(Qwen3Config(**sizes, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)).eval()


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_the_packed_forward_samples_what_reencoding_samples_on_other_decoder_families(tiny, kind):
    tok = tiny[1]
    model = _tiny_decoder(kind, len(tok))
    assert packed_forward_supported(model)
    envs = [gym.make("TextWatchRepair-v0", max_turns=3) for _ in range(6)]
    seeds = [i // 2 for i in range(6)]
    old = _play(lambda c: hf_generate(model, tok, c, 6, 1.0), tok, envs, seeds, 3, one_shot=False)
    new = _play(CachedGeneration(model, tok, 6, 1.0, "packed"), tok, envs, seeds, 3, one_shot=False)
    _assert_same(old, new)
    assert max(len(e.completion_ids) for e in new) > 2 * 6  # several turns were played


def test_models_with_a_sliding_window_are_left_to_reencoding():
    model = build_tiny_model(vocab_size=32)  # its own model: the config is changed below
    assert full_attention_only(model) and packed_forward_supported(model)
    model.config.layer_types = ["sliding_attention"] + list(model.config.layer_types[1:])
    assert not full_attention_only(model)  # a sliding window counts cache slots, holes included: re-encode
    assert not packed_forward_supported(model)


def test_the_packed_engine_is_the_default_where_supported_and_refused_elsewhere(tiny):
    model, tok = tiny
    assert type(CachedGeneration(model, tok, 4, 1.0).engine).__name__ == "PackedForward"
    from transformers import GPT2Config, GPT2LMHeadModel

    other = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2))
    assert full_attention_only(other) and not packed_forward_supported(other)
    assert type(CachedGeneration(other, tok, 4, 1.0).engine).__name__ == "TransformersForward"
    with pytest.raises(ValueError, match="engine 'packed'"):
        CachedGeneration(other, tok, 4, 1.0, "packed")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--sizes", "16", "6"], "--sizes 6: expected multiples of 4"),
        (["--iterations", "0"], "--iterations"),
        (["--json", "/nonexistent-folder/rows.json"], "--json /nonexistent-folder/rows.json"),
        (["--markdown", "/nonexistent-folder/report.md"], "--markdown /nonexistent-folder/report.md"),
        (["--engine", "vllm"], "--engine"),
    ],
)
def test_the_throughput_benchmark_refuses_bad_input_in_one_line(tmp_path, argv, expected):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "llm_throughput.py"
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]
