"""The old policy's log-probs from the first epoch's own forward pass, instead of TRL's extra pass.

With 2 epochs per iteration TRL scores each batch once more before training on it, for PPO's pi_old (Eq. 7).
The trainers take pi_old from the first epoch's forward pass instead (algorithms.llm.training.old_logps): the same
numbers, one forward pass fewer per iteration. Checked here against TRL's pass on the same seeds, with two
micro-batches per epoch (gradient accumulation), for LOOP's loss and TRL's GRPO loss.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from algorithms.llm.config import LoopConfig, MultiTurnGRPOConfig  # noqa: E402
from algorithms.llm.training.loop import LoopTrainer  # noqa: E402
from algorithms.llm.training.trainer import MultiTurnGRPOTrainer  # noqa: E402
from tests.llm_tiny import tiny_trainer  # noqa: E402

ITERATIONS, EPOCHS = 2, 2


def _train(algo: str, from_first_epoch: bool, out) -> tuple[object, list, int]:
    """(trainer, the old log-probs each loss call was given (None: none), no-grad training passes) of one run."""
    base = LoopTrainer if algo == "loop" else MultiTurnGRPOTrainer
    config_class = LoopConfig if algo == "loop" else MultiTurnGRPOConfig

    class Recording(base):
        def _old_policy_is_first_epoch(self) -> bool:
            return from_first_epoch and super()._old_policy_is_first_epoch()

        def compute_loss(self, model, inputs, *args, **kwargs):
            old = inputs.get("old_per_token_logps")
            self.given_old.append(None if old is None else old.clone())
            self.completion_masks.append(inputs["completion_mask"].bool())
            return super().compute_loss(model, inputs, *args, **kwargs)

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            self.no_grad_passes += int(not torch.is_grad_enabled() and out[0] is not None)  # None: the pass skipped
            return out

    trainer = tiny_trainer(
        Recording, config_class, out, prompts=16, max_steps=ITERATIONS * EPOCHS, num_iterations=EPOCHS,
        per_device_train_batch_size=4,  # two micro-batches per epoch: one optimizer step accumulates both
    )  # fmt: skip
    trainer.given_old, trainer.completion_masks, trainer.no_grad_passes = [], [], 0
    trainer.train()
    return trainer, trainer.given_old, trainer.no_grad_passes


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["loop", "trl-grpo"])
def test_first_epoch_gives_the_old_log_probs_of_trls_pass(tmp_path, algo):
    trl, trl_old, trl_passes = _train(algo, False, tmp_path / "trl")
    own, own_old, own_passes = _train(algo, True, tmp_path / "own")
    micro_batches = trl.args.steps_per_generation
    assert micro_batches == 2 and len(trl_old) == len(own_old) == ITERATIONS * EPOCHS * micro_batches
    # TRL's pass: one no-grad pass per iteration; here none, and the first epoch's loss gets no old log-probs
    assert trl_passes == ITERATIONS and own_passes == 0
    per_iteration = EPOCHS * micro_batches
    for call, (theirs, ours) in enumerate(zip(trl_old, own_old)):
        assert theirs is not None
        if call % per_iteration < micro_batches:
            assert ours is None  # first epoch: the loss takes this pass's own detached log-probs
        else:  # later epochs: the first epoch's log-probs of the same micro-batch, equal to TRL's pass
            on = own.completion_masks[call]  # past a completion's end each pass may cut the row (0) or score padding
            assert torch.equal(on, trl.completion_masks[call])
            assert on.any()
            torch.testing.assert_close(ours[on], theirs[on], rtol=0, atol=1e-5)
    if algo == "loop":  # the weights moved between epochs, so pi_old mattered
        assert max(h["max_importance_weight"] for h in trl.history) > 1.0 + 1e-4
    # both runs end with the same weights and metrics. The two forward passes differ by float32 rounding (about
    # 1e-6 in a log-prob), which Adam carries to about 3e-6 in a weight after 4 steps; an epoch that takes its own
    # log-probs as pi_old instead of the first epoch's moves weights by about 1.5e-2 here
    for (name, a), b in zip(trl.model.named_parameters(), own.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4, msg=name)
    for key in ("mean_return", "max_importance_weight", "kl_estimate", "max_sampling_logprob_diff"):
        if key in trl.history[0] or key in own.history[0]:
            theirs, ours = [h[key] for h in trl.history], [h[key] for h in own.history]
            assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-6), key
    assert max(h["max_sampling_logprob_diff"] for h in own.history) < 1e-4
