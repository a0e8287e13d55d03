"""The LLM arm's base objectives (docs/papers/base_objectives.md): LOOP's token PPO-clip, GSPO and REINFORCE++.

GSPO is checked against TRL's own loss: `GRPOTrainer._compute_loss` called unbound on a SimpleNamespace carrying
the attributes it reads (built from a real GRPOConfig with TRL's documented GSPO settings), its per-token
log-probabilities a leaf tensor, so that its loss and gradient compare with LoopTrainer's on the same numbers.
LoopTrainer's own methods are called the same way; the end-to-end test trains the tiny model with each objective.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from algorithms.common.errors import ConfigError, VcbmGymError  # noqa: E402
from algorithms.llm.training.loop import LoopTrainer  # noqa: E402
from algorithms.llm.training.loss import OBJECTIVES, global_normalized_advantages  # noqa: E402
from algorithms.train import resolve_argv, resolve_spec, run  # noqa: E402
from vcbm_gym.credit.base import EpisodeBatch  # noqa: E402
from vcbm_gym.credit.loo import LeaveOneOutRule  # noqa: E402

ENV = "TextWatchRepair-v0"


def _loop_self(objective: str, epsilon: float, epsilon_high: float | None = None, rule=None) -> SimpleNamespace:
    """What LoopTrainer's loss and advantage methods read, on one process with one micro-batch per generation batch."""
    ns = SimpleNamespace(
        args=SimpleNamespace(
            objective=objective,
            ratio_sharing="none",
            length_norm=True,
            steps_per_generation=1,
            kl_abort=20.0,
            use_bias_correction_kl=True,
        ),
        epsilon_low=epsilon,
        epsilon_high=epsilon if epsilon_high is None else epsilon_high,
        use_vllm=False,
        accelerator=SimpleNamespace(num_processes=1, gather=lambda x: x),
        current_gradient_accumulation_steps=1,
        credit_rule=rule,
        _iter_stats=defaultdict(float),
        _aborted=False,
        _pending_observe=None,
        beta=0.0,
    )
    for name in ("_policy_loss", "_record_drift", "_record_reference_kl", "token_advantages"):
        setattr(ns, name, partial(getattr(LoopTrainer, name), ns))
    return ns


def _inputs(advantages: torch.Tensor, mask: torch.Tensor, old: torch.Tensor) -> dict:
    batch, width = mask.shape
    return {
        "prompt_ids": torch.zeros(batch, 1, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 1, dtype=torch.long),
        "completion_ids": torch.zeros(batch, width, dtype=torch.long),
        "completion_mask": mask.long(),
        "old_per_token_logps": old,
        "advantages": advantages,
        "num_items_in_batch": mask.sum(),
    }


def _loss_and_grad(compute, logps0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A loss method's value and its gradient in the per-token log-probabilities it is handed."""
    logps = logps0.clone().requires_grad_(True)
    loss = compute(logps)
    (grad,) = torch.autograd.grad(loss, logps)
    return loss.detach(), grad


def _gspo_case():
    """Four sequences of 3, 5, 2 and 4 tokens whose sequence ratios sit inside the clip range, above it with A > 0,
    below it with A < 0 (both clipped) and above it with A < 0 (not clipped: min takes the unclipped term)."""
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    logps = -torch.rand(mask.shape, generator=gen, dtype=torch.float64) * 3.0
    mean_log_ratio = torch.tensor([1.0e-4, 1.0e-3, -1.0e-3, 2.0e-3], dtype=torch.float64)
    wiggle = torch.tensor([[1.0, -1.0, 0.0, 0, 0], [2.0, -1.0, 0.5, -0.5, -1.0], [1.0, -1.0, 0, 0, 0], [0.5, 0.5, -0.5, -0.5, 0]])
    log_ratio = mean_log_ratio[:, None] + 1e-3 * wiggle.double()  # each row's wiggle sums to 0 over its tokens
    old = (logps - log_ratio) * mask
    advantages = torch.tensor([1.0, 2.0, -1.0, -0.5], dtype=torch.float64)
    return logps * mask, old, mask, advantages


def _trl_self(config: GRPOConfig, logps: torch.Tensor) -> SimpleNamespace:
    """What TRL's GRPOTrainer._compute_loss reads, on one process, its model handing back `logps`."""
    return SimpleNamespace(
        args=config,
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        aux_loss_enabled=False,
        top_entropy_quantile=config.top_entropy_quantile,
        off_policy_mask_threshold=config.off_policy_mask_threshold,
        importance_sampling_level=config.importance_sampling_level,
        beta=config.beta,
        loss_type=config.loss_type,
        epsilon_low=config.epsilon,
        epsilon_high=config.epsilon_high,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        accelerator=SimpleNamespace(reduce=lambda x, reduction: x, gather=lambda x: x, num_processes=1),
    )


def _trl_gspo_loss(logps: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """TRL's GRPOTrainer._compute_loss with TRL's documented GSPO configuration (docs: paper_index, GSPO)."""
    config = GRPOConfig(
        output_dir="unused",
        importance_sampling_level="sequence",
        loss_type="grpo",
        beta=0.0,
        epsilon=3e-4,
        epsilon_high=4e-4,
        use_cpu=True,
        report_to="none",
    )
    return GRPOTrainer._compute_loss(_trl_self(config, logps), None, _inputs(advantages, mask, old))


def _loop_loss(objective: str, logps, old, mask, advantages, epsilon: float, epsilon_high: float | None = None):
    """LoopTrainer._compute_loss on hand log-probabilities (its per-token advantages are the sequence's on every token)."""
    ns = _loop_self(objective, epsilon, epsilon_high)
    ns._get_per_token_logps_and_entropies = lambda *a, **k: (logps, None, None)
    token_advantages = advantages[:, None] * mask if advantages.dim() == 1 else advantages
    return LoopTrainer._compute_loss(ns, None, _inputs(token_advantages, mask, old))


def test_gspo_loss_and_gradient_equal_trls_sequence_level_loss():
    logps, old, mask, advantages = _gspo_case()
    theirs, their_grad = _loss_and_grad(lambda lp: _trl_gspo_loss(lp, old, mask, advantages), logps)
    ours, our_grad = _loss_and_grad(lambda lp: _loop_loss("gspo", lp, old, mask, advantages, 3e-4, 4e-4), logps)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(our_grad, their_grad, rtol=1e-10, atol=1e-15)
    # the case reaches every branch: the clipped sequences (1 and 2) have no gradient, the others do
    on = mask.bool()
    assert (our_grad[1][on[1]] == 0).all() and (our_grad[2][on[2]] == 0).all()
    assert (our_grad[0][on[0]] != 0).all() and (our_grad[3][on[3]] != 0).all()
    # LOOP's token-level clip on the same numbers is another loss (TRL's default token level, too)
    token_level, _ = _loss_and_grad(lambda lp: _loop_loss("ppo_clip", lp, old, mask, advantages, 3e-4, 4e-4), logps)
    assert abs(token_level.item() - ours.item()) > 1e-3


def _two_sequences(log_ratios: list[list[float]]):
    width = max(len(r) for r in log_ratios)
    mask = torch.tensor([[1.0] * len(r) + [0.0] * (width - len(r)) for r in log_ratios], dtype=torch.float64)
    logps = torch.full(mask.shape, -1.0, dtype=torch.float64) * mask
    old = logps - torch.tensor([r + [0.0] * (width - len(r)) for r in log_ratios], dtype=torch.float64)
    return logps, old, mask


def test_gspo_by_hand_clips_the_sequence_ratio_on_both_sides():
    # sequence 1: log-ratios 0.3, 0.1 -> s1 = e^0.2 = 1.2214; sequence 2: -0.4, -0.2, -0.3 -> s2 = e^-0.3 = 0.7408
    logps, old, mask = _two_sequences([[0.3, 0.1], [-0.4, -0.2, -0.3]])
    s1, s2 = math.exp(0.2), math.exp(-0.3)
    # A1 = +1 above 1 + 0.1 and A2 = -2 below 1 - 0.1: both clipped, -min(...) = -1.1 and +1.8, no gradient
    loss, grad = _loss_and_grad(lambda lp: _loop_loss("gspo", lp, old, mask, torch.tensor([1.0, -2.0]).double(), 0.1), logps)
    assert loss.item() == pytest.approx((-1.1 + 1.8) / 2, abs=1e-12)
    assert (grad == 0).all()
    # the signs flipped, min takes the unclipped terms: -(s1 * -1) and -(s2 * 2); the gradient of sequence i's tokens
    # is -A_i s_i / |y_i| / 2 each (the mean over two sequences of each one's token mean)
    loss, grad = _loss_and_grad(lambda lp: _loop_loss("gspo", lp, old, mask, torch.tensor([-1.0, 2.0]).double(), 0.1), logps)
    assert loss.item() == pytest.approx((s1 - 2 * s2) / 2, abs=1e-12)
    expected = torch.tensor([[s1 / 2 / 2] * 2 + [0.0], [-2 * s2 / 3 / 2] * 3], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    # an upper clip range of its own (GSPO's 3e-4 / 4e-4 in the paper): s = e^0.00035 is inside, e^0.00045 is not
    logps, old, mask = _two_sequences([[0.00035], [0.00045]])
    loss, grad = _loss_and_grad(
        lambda lp: _loop_loss("gspo", lp, old, mask, torch.tensor([1.0, 1.0]).double(), 3e-4, 4e-4), logps
    )
    assert loss.item() == pytest.approx(-(math.exp(0.00035) + 1.0004) / 2, abs=1e-12)
    assert grad[0, 0] != 0 and grad[1, 0] == 0


def test_gspo_token_form_keeps_each_tokens_own_advantage():
    # per-token advantages (a credit rule's): the value is TRL's, but each token's gradient is its own advantage's
    logps, old, mask = _two_sequences([[1e-4, 1e-4, 1e-4]])
    advantages = torch.tensor([[3.0, 0.0, -1.0]], dtype=torch.float64)
    loss, grad = _loss_and_grad(lambda lp: _loop_loss("gspo", lp, old, mask, advantages, 3e-4, 4e-4), logps)
    s = math.exp(1e-4)  # inside the clip range
    assert loss.item() == pytest.approx(-s * (3.0 + 0.0 - 1.0) / 3, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[-3.0 * s / 3, 0.0, s / 3]], dtype=torch.float64), rtol=1e-12, atol=1e-15)
    theirs, their_grad = _loss_and_grad(lambda lp: _trl_gspo_loss(lp, old, mask, advantages), logps)
    torch.testing.assert_close(loss, theirs, rtol=1e-12, atol=1e-15)
    assert not torch.allclose(grad, their_grad)  # TRL's sequence form spreads the mean advantage over every token


def test_reinforce_pp_normalises_over_the_whole_batch_not_per_group():
    # group 0: advantages 2 and 4 (mean 3); group 1: -1 and 1 (mean 0); the padding value 100 must not count
    advantages = np.array([[2.0, 2.0], [4.0, 4.0], [-1.0, 100.0], [1.0, 1.0]])
    mask = np.array([[1, 1], [1, 1], [1, 0], [1, 1]], bool)
    # the 7 tokens: mean (4 + 8 - 1 + 2) / 7 = 13/7; population variance as below
    values = np.array([2, 2, 4, 4, -1, 1, 1.0])
    mean = 13 / 7
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 7)
    expected = np.where(mask, (advantages - mean) / std, 0.0)
    out = global_normalized_advantages(advantages, mask)
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    assert out[mask].mean() == pytest.approx(0.0, abs=1e-12) and out[mask].std() == pytest.approx(1.0, rel=1e-12)
    # per-group normalisation would make sequence 0 the worse of its group; globally it is above the batch mean
    assert out[0, 0] > 0 and out[2, 1] == 0.0
    # equal advantages: all zero after centring, not a division by zero
    np.testing.assert_array_equal(global_normalized_advantages(np.ones((2, 2)), np.ones((2, 2), bool)), np.zeros((2, 2)))


def _loo_batch(returns: list[float], groups: list[int], lengths: list[int]) -> EpisodeBatch:
    width = max(lengths)
    mask = np.array([[t < n for t in range(width)] for n in lengths])
    rewards = np.zeros(mask.shape)
    for b, n in enumerate(lengths):
        rewards[b, n - 1] = returns[b]
    return EpisodeBatch(rewards=rewards, mask=mask, group_ids=np.array(groups))


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_the_trainers_advantages_are_the_rules_normalised_only_under_reinforce_pp(objective):
    batch = _loo_batch([5.0, 3.0, 1.0, 0.0], [0, 0, 1, 1], [2, 3, 1, 2])
    rule = LeaveOneOutRule()
    loo = rule.advantages(batch)
    out = LoopTrainer.token_advantages(_loop_self(objective, 0.1, rule=rule), batch)
    if objective == "reinforce_pp":
        np.testing.assert_allclose(out, global_normalized_advantages(loo, batch.mask), rtol=1e-12)
        assert out[batch.mask].mean() == pytest.approx(0.0, abs=1e-12)
        assert not np.allclose(out, loo)
    else:
        np.testing.assert_array_equal(out, loo)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_one_step_raises_the_log_probability_of_the_sequence_with_positive_advantage(objective):
    # two sequences of one task, returns 1 and 0 (LOO: +1 and -1), each with its own logits so that they do not interact
    batch = _loo_batch([1.0, 0.0], [0, 0], [3, 3])
    ns = _loop_self(objective, 3e-4 if objective == "gspo" else 0.1, 4e-4 if objective == "gspo" else None, LeaveOneOutRule())
    advantages = torch.as_tensor(ns.token_advantages(batch))
    assert advantages[0, 0] > 0 > advantages[1, 0]
    logits = torch.zeros(2, 3, 5, dtype=torch.float64, requires_grad=True)
    tokens = torch.tensor([[1, 2, 3], [4, 0, 2]])
    mask = torch.ones(2, 3, dtype=torch.float64)

    def sequence_logps() -> torch.Tensor:
        return torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]

    before = sequence_logps().detach()
    ns._policy_loss(sequence_logps(), before, mask, _inputs(advantages, mask, before)).backward()
    with torch.no_grad():
        logits -= 0.5 * logits.grad
    after = sequence_logps().detach().sum(-1)
    assert after[0] > before.sum(-1)[0] and after[1] < before.sum(-1)[1]


def test_objective_is_recorded_only_when_set_and_reaches_the_config_from_the_command_line():
    for algo in ("loop", "vcbm-loop"):
        default = resolve_spec(algo, ENV, 0)
        assert default.config.trainer.objective == "ppo_clip"
        assert "objective" not in default.hyperparams  # the config hash of every earlier run stays what it was
        for objective in OBJECTIVES:
            for argv in (["--objective", objective], ["--hyperparams", f"objective={objective}"]):
                spec = resolve_argv(["--algo", algo, "--env", ENV, *argv])
                assert spec.config.trainer.objective == spec.hyperparams["objective"] == objective
        assert resolve_argv(["--algo", algo, "--env", ENV, "--objective", "gspo"]).config_hash != default.config_hash


def _one_line_config_error(argv, *fragments):
    with pytest.raises(ConfigError) as excinfo:
        run(["--env", ENV, "--no-progress", *argv])
    message = str(excinfo.value)
    assert "\n" not in message and all(f in message for f in fragments), message


def test_a_bad_objective_is_one_line_naming_it_and_the_choices():
    _one_line_config_error(["--algo", "loop", "--hyperparams", "objective=grpo"], "objective='grpo'", str(OBJECTIVES))
    _one_line_config_error(
        ["--algo", "vcbm-loop", "--hyperparams", "objective=gspo", "--ratio-sharing", "effect"],
        "objective='gspo'",
        "ratio_sharing: none",
    )
    _one_line_config_error(
        ["--algo", "trl-grpo", "--objective", "gspo"], "trl-grpo keeps TRL's own loss", "importance_sampling_level"
    )
    with pytest.raises(VcbmGymError) as excinfo:  # the flag: argparse's own line, through the project's parser
        resolve_argv(["--algo", "loop", "--env", ENV, "--objective", "grpo"])
    message = str(excinfo.value)
    assert "\n" not in message and "'grpo'" in message and all(o in message for o in OBJECTIVES), message


def _train_one_iteration(objective: str, out) -> tuple[object, list[dict]]:
    """One LOOP iteration (2 epochs, one micro-batch each) of the tiny random model; what each loss call was given."""
    from algorithms.llm.config import LoopConfig
    from tests.llm_tiny import tiny_trainer

    class Recording(LoopTrainer):
        def _policy_loss(self, logps, old, mask, inputs):
            loss = super()._policy_loss(logps, old, mask, inputs)
            first_epoch = inputs.get("old_per_token_logps") is None
            given = {"logps": logps.detach().clone(), "old": old.clone(), "advantages": inputs["advantages"].clone()}
            self.calls.append({"loss": loss.item(), "mask": mask.clone(), "first": first_epoch, **given})
            return loss

    trainer = tiny_trainer(
        Recording, LoopConfig, out, prompts=8, max_steps=2, num_iterations=2, per_device_train_batch_size=8,
        objective=objective,
    )  # fmt: skip
    trainer.calls = []
    trainer.train()
    return trainer, trainer.calls


def _expected_loss(objective: str, call: dict, epsilon: float = 0.1) -> float:
    """The objective's loss on what a loss call was given, written out here without the trainer's helpers."""
    logps, old, mask, advantages = (call[k].double() for k in ("logps", "old", "mask", "advantages"))
    if objective == "gspo":
        ratio = torch.exp(((logps - old) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True))
    else:
        ratio = torch.exp(logps - old)
    per_token = -torch.min(ratio * advantages, ratio.clamp(1 - epsilon, 1 + epsilon) * advantages) * mask
    if objective == "gspo":
        return (per_token.sum(-1) / mask.sum(-1)).mean().item()
    return (per_token.sum() / mask.sum()).item()


@pytest.mark.slow
def test_each_objective_is_honoured_end_to_end(tmp_path):
    runs = {objective: _train_one_iteration(objective, tmp_path / objective) for objective in OBJECTIVES}
    for objective, (_, calls) in runs.items():
        assert [c["first"] for c in calls] == [True, False], objective
        for call in calls:  # both epochs: the first at ratio 1, the second after a step
            assert call["loss"] == pytest.approx(_expected_loss(objective, call), abs=1e-6), objective
    ppo, gspo, rpp = (runs[o][1][0] for o in OBJECTIVES)
    mask = ppo["mask"]
    # the same rollouts (same seeds, same weights before the first step): LOO's advantages, REINFORCE++'s normalised
    torch.testing.assert_close(gspo["advantages"], ppo["advantages"])
    expected = global_normalized_advantages(ppo["advantages"].numpy(), mask.numpy() > 0)
    torch.testing.assert_close(rpp["advantages"], torch.as_tensor(expected, dtype=torch.float32))
    assert ppo["advantages"][mask > 0].abs().max() > 0  # the noisy env gave the group different returns
    # after the first step the ratios are no longer 1 and the three objectives are three losses
    second = [runs[o][1][1]["loss"] for o in OBJECTIVES]
    assert min(abs(a - b) for i, a in enumerate(second) for b in second[i + 1 :]) > 1e-4, second
    # and each objective moved the weights its own way
    weights = {o: torch.cat([p.detach().flatten() for p in runs[o][0].model.parameters()]) for o in OBJECTIVES}
    for a, b in (("ppo_clip", "gspo"), ("ppo_clip", "reinforce_pp"), ("gspo", "reinforce_pp")):
        assert (weights[a] - weights[b]).abs().max() > 1e-6, (a, b)
