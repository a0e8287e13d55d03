"""GRPO's KL penalty toward the starting model in the LLM arm (`beta` > 0; LOOP's own loss has none): its estimator
by hand, LoopTrainer's penalised loss against TRL's on the same numbers, and a run where a larger `beta` keeps the
policy closer to where it started."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from algorithms.common.errors import ConfigError, VcbmGymError  # noqa: E402
from algorithms.llm.training.loop import LoopTrainer  # noqa: E402
from algorithms.llm.training.loss import kl_to_reference  # noqa: E402
from algorithms.train import resolve_argv, run  # noqa: E402
from tests.helpers import tiny_llm_argv  # noqa: E402
from tests.test_llm_objectives import _inputs, _loop_self, _trl_self  # noqa: E402


def test_the_estimator_by_hand_and_the_sign_of_its_gradient():
    # pi_theta = 1/4 where pi_ref = 1/2: ratio 2, so 2 - log 2 - 1; and the reverse: 1/2 - log(1/2) - 1
    ref = torch.log(torch.tensor([0.5, 0.25, 0.3], dtype=torch.float64))
    logps = torch.log(torch.tensor([0.25, 0.5, 0.3], dtype=torch.float64)).requires_grad_(True)
    kl = kl_to_reference(ref, logps)
    expected = torch.tensor([2 - math.log(2) - 1, 0.5 - math.log(0.5) - 1, 0.0], dtype=torch.float64)
    torch.testing.assert_close(kl.detach(), expected, rtol=0, atol=1e-15)
    (grad,) = torch.autograd.grad(kl.sum(), logps)
    # d/dlog pi_theta = 1 - pi_ref / pi_theta: descent raises a token the policy under-weights, lowers one it
    # over-weights, and leaves a token the two agree on alone
    torch.testing.assert_close(grad, torch.tensor([1 - 2.0, 1 - 0.5, 0.0], dtype=torch.float64), rtol=0, atol=1e-15)


def _case():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    logps = -torch.rand(mask.shape, generator=gen, dtype=torch.float64) * 2.0 * mask
    old = (logps - 0.05 * torch.randn(mask.shape, generator=gen, dtype=torch.float64)) * mask
    ref = (logps + 0.3 * torch.randn(mask.shape, generator=gen, dtype=torch.float64)) * mask
    advantages = torch.tensor([[0.5, 0.5, 0.5, 0.0], [-1.0, -1.0, 2.0, 2.0], [0.2, -0.3, 0.0, 0.0]], dtype=torch.float64)
    return logps, old, ref, mask, advantages


def _trl_loss(logps, old, ref, mask, advantages, beta: float, bias_correction: bool) -> torch.Tensor:
    """TRL's GRPOTrainer._compute_loss with its token-level ratio and LOOP's aggregation (loss_type "dapo": the sum
    over the batch's generated tokens), `beta` and its KL importance correction on or off."""
    config = GRPOConfig(
        output_dir="unused",
        loss_type="dapo",
        beta=beta,
        use_bias_correction_kl=bias_correction,
        epsilon=0.1,
        epsilon_high=0.1,
        use_cpu=True,
        report_to="none",
    )
    inputs = _inputs(advantages[:, 0], mask, old) | {"advantages": advantages, "ref_per_token_logps": ref}
    return GRPOTrainer._compute_loss(_trl_self(config, logps), None, inputs)


def _loop_loss(logps, old, ref, mask, advantages, beta: float, bias_correction: bool) -> tuple[torch.Tensor, SimpleNamespace]:
    ns = _loop_self("ppo_clip", 0.1)
    ns.beta, ns.args.use_bias_correction_kl = beta, bias_correction
    ns._get_per_token_logps_and_entropies = lambda *a, **k: (logps, None, None)
    inputs = _inputs(advantages, mask, old) | {"ref_per_token_logps": ref}
    return LoopTrainer._compute_loss(ns, None, inputs), ns


@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("beta", [0.0, 0.04, 1.0])
def test_the_penalised_loss_and_its_gradient_equal_trls(beta, bias_correction):
    logps, old, ref, mask, advantages = _case()
    leaf = [logps.clone().requires_grad_(True) for _ in range(2)]
    theirs = _trl_loss(leaf[0], old, ref, mask, advantages, beta, bias_correction)
    ours, ns = _loop_loss(leaf[1], old, ref, mask, advantages, beta, bias_correction)
    (their_grad,), (our_grad,) = torch.autograd.grad(theirs, leaf[0]), torch.autograd.grad(ours, leaf[1])
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-10, atol=1e-15)
    if beta:
        expected = ((kl_to_reference(ref, logps) * mask).sum() / mask.sum()).item()
        assert ns._iter_stats["kl_to_reference"] == pytest.approx(expected, rel=1e-12) and expected > 0.01
    else:
        assert "kl_to_reference" not in ns._iter_stats


def test_beta_is_checked_and_needs_a_model_with_a_folder(tmp_path):
    argv = tiny_llm_argv("loop", tmp_path / "run", hyperparams=["beta=-0.1"])
    with pytest.raises(ConfigError, match=r"beta=-0.1: expected beta >= 0"):
        resolve_argv(argv)
    with pytest.raises(VcbmGymError, match="tiny-random is built in memory") as info:
        resolve_argv(tiny_llm_argv("loop", tmp_path / "run", hyperparams=["beta=0.1"]))
    assert "\n" not in str(info.value) and not (tmp_path / "run").exists()
    spec = resolve_argv(tiny_llm_argv("loop", tmp_path / "run", hyperparams=["beta=0.1", "finetune=lora"]))
    assert spec.config.trainer.beta == 0.1 and spec.hyperparams["beta"] == 0.1
    assert "beta" not in resolve_argv(tiny_llm_argv("loop", tmp_path / "run")).hyperparams  # LOOP's runs keep their hash


@pytest.mark.slow
def test_a_larger_beta_keeps_the_policy_closer_to_its_start(tmp_path):
    """Same seed, same rollouts' source, four iterations of full fine-tuning from a saved model: at beta 5 the
    policy's KL to its start ends well below its value at beta 0.01. A penalty of the wrong sign pushes it away."""
    from algorithms.llm.model.tiny import build_tiny

    model, tokenizer = build_tiny(0)
    folder = tmp_path / "start"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    final = {}
    for beta in (0.01, 5.0):
        log_dir = tmp_path / f"beta{beta}"
        hyperparams = [f"beta={beta}", "finetune=full", "learning_rate=1e-3"]
        run(tiny_llm_argv("loop", log_dir, "--seed", "3", model=str(folder), iterations=4, hyperparams=hyperparams))
        history = json.loads((log_dir / "history.json").read_text())
        assert all(h["kl_to_reference"] >= 0 for h in history)
        final[beta] = history[-1]["kl_to_reference"]
    assert final[5.0] < 0.5 * final[0.01]
