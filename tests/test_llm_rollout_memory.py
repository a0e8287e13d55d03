"""The LLM arm's memory bounds: sampled-token log-probs in rollouts, the episode token bound, the
start-up memory line, and vLLM generation with unequal context counts per process."""

import threading

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402

import vcbm_gym  # noqa: E402, F401
from algorithms.llm.generation.rollout import hf_generate  # noqa: E402
from algorithms.llm.model.tiny import build_tiny  # noqa: E402
from tests.helpers import load_file, tiny_llm_argv  # noqa: E402


def _benchmark():
    """benchmarks/llm_logprob_memory.py, whose full_vocab_generate is the earlier path kept as the reference."""
    return load_file("benchmarks/llm_logprob_memory.py", "llm_logprob_memory")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_token_logprobs_equal_the_full_vocabulary_log_softmax(temperature):
    model, tokenizer = build_tiny(0)
    texts = ["Thought: repair the watch", "Action: inspect()", "Observation: the watch has stopped . Turn 1 of 3"]
    contexts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    for seed in range(3):
        torch.manual_seed(seed)
        new = hf_generate(model, tokenizer, contexts, 24, temperature)
        torch.manual_seed(seed)
        old = _benchmark().full_vocab_generate(model, tokenizer, contexts, 24, temperature)
        assert [ids for ids, _ in new] == [ids for ids, _ in old]  # the same samples
        assert [lps for _, lps in new] == [lps for _, lps in old]  # bit for bit
        assert all(len(ids) == len(lps) > 0 for ids, lps in new)


class TwoRanks:
    """Two ranks simulated by two threads of one process: accelerate's gather_object and
    broadcast_object_list as TRL's vLLM generation calls them, meeting at a barrier."""

    def __init__(self, n: int = 2):
        self.n, self.barrier, self.local = n, threading.Barrier(n, timeout=20), threading.local()
        self.slots: list = [None] * n

    @property
    def rank(self) -> int:
        return self.local.rank

    def gather_object(self, obj):
        self.slots[self.rank] = list(obj)
        self.barrier.wait()
        out = [x for slot in self.slots for x in slot]
        self.barrier.wait()
        return out

    def broadcast_object_list(self, obj_list, from_process=0):
        if self.rank == from_process:
            self.slots[0] = obj_list[0]
        self.barrier.wait()
        obj_list[0] = self.slots[0]
        self.barrier.wait()
        return obj_list

    def run(self, work):
        results, errors = [None] * self.n, []

        def target(rank):
            self.local.rank = rank
            try:
                results[rank] = work(rank)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


def completion_of(prompt):
    """The fake server's completion: a function of the prompt, so a misplaced answer shows."""
    return [1000 + sum(prompt) % 997, len(prompt)]


class FakeClient:
    def generate(self, prompts, features=None, n=1, **kwargs):
        completions = [completion_of(p) for p in prompts for _ in range(n)]
        return {"prompt_ids": prompts, "completion_ids": completions, "logprobs": [[[-0.5]] * len(c) for c in completions]}


def server_generation(rank, ranks, n_processes=2):
    """TRL's own VLLMGeneration in server mode, its collectives and client faked (no vllm needed)."""
    from types import SimpleNamespace

    from trl.generation.vllm_generation import VLLMGeneration

    gen = object.__new__(VLLMGeneration)
    gen.accelerator = SimpleNamespace(process_index=rank, is_main_process=rank == 0, num_processes=n_processes)
    gen.mode, gen.tensor_parallel_size, gen.enable_sleep_mode = "server", 1, False
    gen.temperature, gen.top_p, gen.top_k, gen.min_p, gen.repetition_penalty = 1.0, 1.0, 0, 0.0, 1.0
    gen.max_completion_length, gen.logprobs, gen.structured_outputs_regex, gen.generation_kwargs = 8, 0, None, {}
    gen.vllm_client = FakeClient()
    return gen


# contexts per turn and rank: unequal counts, then a rank with none left (lockstep), then none at all
TURNS = {0: [[[1, 2], [3, 4, 5], [6]], [[7, 8]]], 1: [[[9], [10, 11]], []], 2: [[], []]}


def _play_turns(monkeypatch, turn, ranks):
    import trl.generation.vllm_generation as vg

    monkeypatch.setattr(vg, "gather_object", ranks.gather_object)
    monkeypatch.setattr(vg, "broadcast_object_list", ranks.broadcast_object_list)

    def work(rank):
        gen = server_generation(rank, ranks)
        return [turn(gen, TURNS[t][rank], ranks) for t in sorted(TURNS)]

    return ranks.run(work)


def _expected():
    return [[[(completion_of(c), [-0.5, -0.5]) for c in TURNS[t][rank]] for t in sorted(TURNS)] for rank in range(2)]


def test_vllm_turn_gives_every_episode_its_own_completion_with_unequal_counts_per_rank(monkeypatch):
    import accelerate.utils

    from algorithms.llm.generation.vllm import gather_counts, vllm_turn

    ranks = TwoRanks()
    monkeypatch.setattr(accelerate.utils, "gather_object", ranks.gather_object)  # what gather_counts calls
    answers = _play_turns(monkeypatch, lambda gen, contexts, ranks: vllm_turn(gen, contexts, gather_counts, [0]), ranks)
    assert answers == _expected()


def test_trl_vllm_generation_alone_misplaces_completions_with_unequal_counts(monkeypatch):
    """The behaviour vllm_turn corrects (TRL 1.16 slices rank r's completions at r * len(prompts))."""
    from algorithms.llm.generation.vllm import vllm_answers

    def unpadded(gen, contexts, ranks):
        _, completion_ids, logprobs, _ = gen.generate(prompts=contexts, images=None, num_generations=1)
        return vllm_answers(completion_ids, logprobs)

    answers = _play_turns(monkeypatch, unpadded, TwoRanks())
    assert answers != _expected()
    assert answers[1][0] == [(completion_of([3, 4, 5]), [-0.5, -0.5])]  # rank 1's episode got rank 0's second answer


def _scripted_episode(tok, max_episode_tokens=None, max_turns=6):
    import gymnasium as gym

    from algorithms.llm.generation.rollout import play_episodes

    answers = iter(["Thought : fix it Action : repair ( )"] + ["Thought : wait for it Action : wait ( )"] * 5)
    steps = []

    def scripted(contexts):
        ids = tok(next(answers), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return [(ids, [-0.1 * (k + 1) for k in range(len(ids))])] * len(contexts)

    env = gym.make("TextWatchRepair-v0")
    step = env.step

    def recording_step(action):
        steps.append(action)
        return step(action)

    env.step = recording_step
    (e,) = play_episodes(scripted, tok, [env], [11], max_turns=max_turns, max_episode_tokens=max_episode_tokens)
    return e, steps


def test_max_episode_tokens_cuts_the_answer_that_crosses_it_and_ends_the_episode():
    _, tok = build_tiny(0)
    full, full_steps = _scripted_episode(tok)
    assert not full.token_bound_reached and len(full_steps) == 6
    turn2 = full.turn_ids.index(2)  # where turn 2's answer starts in the completion
    bound = len(full.prompt_ids) + turn2 + 3  # three tokens of turn 2's answer fit
    e, steps = _scripted_episode(tok, max_episode_tokens=bound)
    assert e.token_bound_reached and e.done
    assert len(e.prompt_ids) + len(e.completion_ids) == bound
    assert e.completion_ids == full.completion_ids[: turn2 + 3]
    assert e.logprobs == full.logprobs[: turn2 + 3] and e.logprobs[-3:] == [-0.1, -0.2, -0.30000000000000004]
    assert len(e.env_mask) == len(e.turn_ids) == len(e.completion_ids)
    # the env took the cut answer as turn 2's action, and the turn records stay aligned with the turn ids
    assert len(steps) == 3 and steps[2] == tok.decode(e.completion_ids[turn2:], skip_special_tokens=True)
    assert len(e.state_mutating) == len(e.turn_texts) == len(e.effects) == 3 == max(e.turn_ids) + 1
    assert e.final_text == e.messages[-1]["content"]
    # a bound inside the env's reply after turn 1: the episode ends with turn 1, the reply left out
    reply_end = len(full.prompt_ids) + turn2
    e, steps = _scripted_episode(tok, max_episode_tokens=reply_end)
    assert e.token_bound_reached and len(steps) == 2 and max(e.turn_ids) == 1 and e.env_mask[-1] == 1
    assert len(e.prompt_ids) + len(e.completion_ids) < reply_end
    # a bound that the whole episode fits under changes nothing
    e, _ = _scripted_episode(tok, max_episode_tokens=len(full.prompt_ids) + len(full.completion_ids) + 1)
    assert not e.token_bound_reached and e.completion_ids == full.completion_ids


def test_max_episode_tokens_refuses_a_first_prompt_that_fills_it_and_bad_values():
    from algorithms.common.errors import VcbmGymError
    from algorithms.llm.config import LoopConfig

    _, tok = build_tiny(0)
    with pytest.raises(VcbmGymError, match=r"max_episode_tokens=50; expected max_episode_tokens > \d+") as info:
        _scripted_episode(tok, max_episode_tokens=50)
    assert "\n" not in str(info.value)
    for bad in (0, 1):
        with pytest.raises(ValueError, match=f"max_episode_tokens={bad}: expected None or an integer >= 2"):
            LoopConfig(output_dir="unused", use_cpu=True, max_episode_tokens=bad)
    assert LoopConfig(output_dir="unused", use_cpu=True).max_episode_tokens is None


def test_memory_estimate_states_its_formula():
    from algorithms.llm.training.metrics import logprob_memory_line

    line = logprob_memory_line(8192, 152_064, 8, 48, use_vllm=False)
    assert "sequence bound x vocab x batch x 4 B = 8,192 x 152,064 x 8 x 4 B = 37.1 GiB" in line
    assert "5 x 48 x 152,064 x 4 B = 139.2 MiB per generated token" in line and "= 512.0 MiB per tile" in line
    assert "no estimate" in logprob_memory_line(None, 100, 2, 2, use_vllm=True)


def test_the_runner_prints_the_memory_estimate_at_start_up(tmp_path, capfd):
    from algorithms.train import run

    small = ["finetune=lora", "max_new_tokens_per_turn=8", "generation_batch_size=8", "per_device_train_batch_size=8"]
    summary = run(tiny_llm_argv("loop", tmp_path, hyperparams=["max_episode_tokens=4000", *small]))
    assert summary["iterations_run"] == 1 and summary["final_token_bound_rate"] == 0.0
    lines = [x for x in capfd.readouterr().err.splitlines() if x.startswith("log-prob memory estimate:")]
    assert len(lines) == 1
    assert "sequence bound x vocab x batch x 4 B = 4,000 x " in lines[0] and " x 8 x 4 B = " in lines[0]


def test_synced_generation_joins_with_no_context_and_samples_as_unsynced(tmp_path):
    # the FSDP rollout path: synced_gpus needs a process group (here gloo, one process); a process
    # with no context still runs the forward passes (a dummy answer, dropped)
    import torch.distributed as dist

    from algorithms.llm.generation.rollout import hf_generate
    from algorithms.llm.model.tiny import build_tiny

    model, tokenizer = build_tiny(0)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        calls = {"n": 0}
        hook = model.register_forward_hook(lambda *args: calls.__setitem__("n", calls["n"] + 1))
        assert hf_generate(model, tokenizer, [], 4, 1.0, synced=True) == []
        assert calls["n"] >= 1
        hook.remove()
        contexts = [tokenizer("A watch has stopped .", add_special_tokens=False)["input_ids"]] * 2
        torch.manual_seed(5)
        synced = hf_generate(model, tokenizer, contexts, 4, 1.0, synced=True)
        torch.manual_seed(5)
        assert synced == hf_generate(model, tokenizer, contexts, 4, 1.0)
    finally:
        dist.destroy_process_group()
