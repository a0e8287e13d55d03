"""The LLM arm's credit goes through the rule interface: `--credit RULE` builds `make_rule(...)` on an EpisodeBatch."""

import types

import numpy as np
import pytest

pytest.importorskip("trl")

from algorithms.common.credit_slot import CreditSlot  # noqa: E402
from algorithms.llm.config import LLM_CREDIT  # noqa: E402
from algorithms.llm.generation.rollout import Episode  # noqa: E402
from algorithms.llm.training.batch import anchor_keys, concat_episode_batches, episode_batch  # noqa: E402
from algorithms.llm.training.checkpoints import join_state, split_state  # noqa: E402
from algorithms.llm.training.loop import LoopTrainer  # noqa: E402
from algorithms.train import run  # noqa: E402
from tests.helpers import tiny_llm_argv  # noqa: E402
from vcbm_gym.credit.base import EpisodeBatch  # noqa: E402
from vcbm_gym.credit.loo import loo_advantages  # noqa: E402
from vcbm_gym.credit.registry import make_rule  # noqa: E402
from vcbm_gym.credit.vcbm_blend import VCBMBlendRule, blend  # noqa: E402

TEXTS = ["repair() done: the Corvina watch", "wait", "skip() done", "bumps: the counter moved", "sold for 12"]


def _batch(seed: int = 0, b: int = 6, turns: int = 4, tokens: int = 3, short=(1,)) -> EpisodeBatch:
    """A fixed LLM-shaped batch: 3 tasks x 2 rollouts, 4 turns of 3 generated + 2 env tokens, bookmarks."""
    rng = np.random.default_rng(seed)
    width = turns * (tokens + 2)
    step_turn = np.repeat(np.arange(turns), tokens + 2)[None, :].repeat(b, 0)
    mask = np.tile(np.tile([True] * tokens + [False] * 2, turns), (b, 1))
    for i in short:  # shorter episodes (3 turns)
        mask[i, -5:] = False
        step_turn[i, -5:] = -1
    rewards = np.zeros((b, width))
    for i in range(b):
        rewards[i, np.flatnonzero(mask[i])[-1]] = rng.normal()
    flags = [rng.random(turns) < 0.6 for _ in range(b)]
    texts = [[str(rng.choice(TEXTS)) + f" {rng.integers(5)}" for _ in range(turns)] for _ in range(b)]
    return EpisodeBatch(
        rewards=rewards,
        mask=mask,
        group_ids=np.repeat([11, 12, 13], 2),
        step_turn=step_turn,
        turn_flags={"state_mutating": flags},
        turn_texts=texts,
        final_texts=[str(rng.choice(TEXTS)) for _ in range(b)],
        extras={"anchor_keys": [[f"obs{t}" for t in range(turns)] for _ in range(b)]},
    )


def _trainer(credit: str, credit_kwargs: dict | None = None, processes: int = 1, index: int = 0):
    """What token_advantages reads of a LoopTrainer: its rule, its accelerator and its objective (LOOP's own)."""
    kwargs = CreditSlot(credit, credit_kwargs or {}).rule_kwargs(LLM_CREDIT)
    accelerator = types.SimpleNamespace(num_processes=processes, process_index=index)
    args = types.SimpleNamespace(objective="ppo_clip")
    rule = make_rule(credit, **kwargs)
    return types.SimpleNamespace(credit_rule=rule, accelerator=accelerator, args=args, _pending_observe=None)


def test_loop_and_vcbm_loop_advantages_equal_the_former_formulas():
    batch = _batch()
    loo = loo_advantages(batch.returns, batch.group_ids)
    # loop: Eq. 6 LOO broadcast to every generated token (the former `credit == "loo"` branch)
    np.testing.assert_array_equal(LoopTrainer.token_advantages(_trainer("loo"), batch), batch.broadcast(loo))
    # vcbm-loop: LOO blended with the Eq. 13 weights of a separately built VCBMBlendRule (the former branch)
    for kwargs in (
        {"beta": 1.0, "few_bookmarks": "retrieve", "top_k": 2},
        {"beta": 0.5, "tau": 0.3, "top_k": 1},
        {"few_bookmarks": "floor"},
    ):
        trainer = _trainer("vcbm_blend", {"vcbm_blend": kwargs})
        former = VCBMBlendRule(**{"memory_capacity": 100_000, **kwargs})
        expected = np.where(batch.mask, blend(loo, former.token_weights(batch), former.beta), 0.0)
        got = LoopTrainer.token_advantages(trainer, batch)
        np.testing.assert_array_equal(got, expected)
        assert not np.array_equal(got, batch.broadcast(loo)) or kwargs.get("few_bookmarks") == "floor"
        # the episodic memory is filled only when the iteration is kept (LoopTrainer._end_iteration observes)
        assert len(trainer.credit_rule.memory) == 0 and trainer._pending_observe is batch
        trainer.credit_rule.observe(trainer._pending_observe)
        former.observe(batch)
        np.testing.assert_array_equal(trainer.credit_rule.memory.embeddings, former.memory.embeddings)
        assert trainer.credit_rule.memory.capacity == 100_000  # the LLM arm's default bound
        # and it round-trips through the checkpoint's split (JSON + npz) form
        arrays = {}
        plain = split_state(trainer.credit_rule.state_dict(), arrays)
        restored = make_rule("vcbm_blend", **kwargs)
        restored.load_state_dict(join_state(plain, arrays))
        np.testing.assert_array_equal(restored.memory.returns, former.memory.returns)
        assert restored.memory.capacity == 100_000


def test_groups_spread_over_processes_are_gathered_before_the_rule(monkeypatch):
    # rank 0 holds rows 0-2, rank 1 rows 3-5: task 12's two rollouts sit on different ranks, and the
    # ranks' batches have different widths. Each rank's advantages equal its rows of the whole batch.
    whole = _batch(seed=3, short=(0, 1, 2))
    parts = [
        EpisodeBatch(
            rewards=whole.rewards[rows][:, :w],
            mask=whole.mask[rows][:, :w],
            group_ids=whole.group_ids[rows],
            step_turn=whole.step_turn[rows][:, :w],
            turn_flags={"state_mutating": [whole.turn_flags["state_mutating"][i] for i in rows]},
            turn_texts=[whole.turn_texts[i] for i in rows],
            final_texts=[whole.final_texts[i] for i in rows],
            extras={"anchor_keys": [whole.extras["anchor_keys"][i] for i in rows]},
        )
        for rows, w in (([0, 1, 2], 15), ([3, 4, 5], 20))
    ]  # rank 0's episodes end by token 15
    assert parts[0].returns.tolist() == whole.returns[:3].tolist()
    import accelerate.utils

    monkeypatch.setattr(accelerate.utils, "gather_object", lambda objects: [p for p in parts])
    for credit in ("loo", "grpo", "gigpo", "vcbm_blend"):
        expected = make_rule(credit, **CreditSlot(credit, {}).rule_kwargs(LLM_CREDIT)).advantages(whole)
        for rank, rows in ((0, slice(0, 3)), (1, slice(3, 6))):
            trainer = _trainer(credit, processes=2, index=rank)
            got = LoopTrainer.token_advantages(trainer, parts[rank])
            assert got.shape == parts[rank].rewards.shape
            np.testing.assert_allclose(got, expected[rows, : got.shape[1]], rtol=0, atol=1e-12)
    assert np.abs(expected[:, 15:]).sum() > 0 and concat_episode_batches(parts).batch_size == 6


def test_episode_batch_gives_gigpo_its_anchor_observations():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "obs0"},
        {"role": "assistant", "content": "a0"},
        {"role": "user", "content": "obs1"},
        {"role": "assistant", "content": "a1"},
    ]
    e = Episode(
        task_seed=1,
        prompt_ids=[1],
        completion_ids=[5, 9, 6],
        env_mask=[1, 0, 1],
        turn_ids=[0, 0, 1],
        state_mutating=[True, False],
        turn_texts=["x", "y"],
        final_text="over",
        episode_return=1.0,
        messages=messages,
    )
    assert anchor_keys(e) == ["obs0", "obs1"]
    batch = episode_batch([e, e], 3)
    out = make_rule("gigpo").advantages(batch)
    assert out.shape == (2, 3) and np.all(out == 0.0)  # equal returns, equal anchors: nothing to compare


@pytest.mark.parametrize("credit", ["grpo", "gigpo", "vcbm_blend"])  # ~1.5 s each on 2 CPU cores
def test_credit_flag_trains_the_tiny_model_with_that_rule(tmp_path, credit):
    small = ["env_kwargs={max_turns: 2}", "max_turns=2", "generation_batch_size=4", "num_generations=2"]
    small += ["per_device_train_batch_size=4", "max_new_tokens_per_turn=8"]
    summary = run(
        tiny_llm_argv("loop", tmp_path, "--credit", credit, "--seed", "1", model="tiny", iterations=2, hyperparams=small)
    )
    assert summary["credit"] == credit and summary["iterations_run"] == 2
    assert summary["trained_weight_change_l2"] > 0
    assert (summary.get("memory_size", 0) > 0) == (credit == "vcbm_blend")  # the rule's own summary() numbers
    import yaml

    assert yaml.safe_load((tmp_path / "config.yml").read_text())["hyperparams"]["credit"] == credit


def test_missing_vllm_log_probs_fail_loudly():
    from algorithms.common.errors import VcbmGymError
    from algorithms.llm.training.trainer import MultiTurnGRPOTrainer

    class FakeGeneration:
        max_completion_length = None

        def __init__(self, logprobs):
            self.logprobs = logprobs

        def generate(self, prompts, images, num_generations):
            return None, [[5, 6], [7]], self.logprobs, None

    def answers(logprobs):
        fake = types.SimpleNamespace(
            vllm_generation=FakeGeneration(logprobs),
            args=types.SimpleNamespace(max_new_tokens_per_turn=4),
            accelerator=types.SimpleNamespace(num_processes=1),
        )
        out = MultiTurnGRPOTrainer._vllm_generate(fake, [[1], [2]])
        assert fake.vllm_generation.max_completion_length == 4  # per turn
        return out

    assert answers([[[-0.5], [-1.0]], [[-0.25]]]) == [([5, 6], [-0.5, -1.0]), ([7], [-0.25])]
    for bad, where in (
        ([[[-0.5], [None]], [[-0.25]]], "token 1 of completion 0"),
        ([[[-0.5], []], [[-0.25]]], "token 1 of completion 0"),
        ([[[-0.5]], [[-0.25]]], "token 1 of completion 0"),  # fewer log-probs than tokens
        ([[[-0.5], [-1.0]], [[float("nan")]]], "token 0 of completion 1"),
        ([[[-0.5], [-1.0]]], "log-probs for 1 of 2 completions"),
        (None, "log-probs for 0 of 2 completions"),
    ):
        with pytest.raises(VcbmGymError) as excinfo:
            answers(bad)
        assert where in str(excinfo.value) and "\n" not in str(excinfo.value)


@pytest.mark.slow
def test_two_processes_gather_a_task_split_over_ranks(tmp_path):
    """torchrun, 2 CPU processes (gloo): task 2's rollouts sit on ranks 0 and 1; both see the whole batch."""
    import json
    import shutil
    import socket
    import subprocess
    import sys
    from pathlib import Path

    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [torchrun, "--nproc_per_node", "2", "--master_port", str(port), str(repo / "tests" / "llm_gather_check.py"), str(repo)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            _, rank, start, size, payload = line.split(" ", 4)
            results[int(rank)] = (int(start), int(size), json.loads(payload))
    assert {r: v[:2] for r, v in results.items()} == {0: (0, 6), 1: (3, 6)}
    # returns: rank 0 [1, 3, 5] (tasks 1, 1, 2), rank 1 [-1, 0.5, 2.5] (tasks 2, 3, 3)
    assert results[0][2]["loo"] == [-2.0, 2.0, 6.0] and results[1][2]["loo"] == [-6.0, -2.0, 2.0]
    assert results[0][2]["grpo"][2] == pytest.approx(-results[1][2]["grpo"][0])
    assert results[0][2]["vcbm_blend"] == results[0][2]["loo"]  # one bookmark per turn <= top_k: plain LOO
