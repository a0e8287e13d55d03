"""LOOP's per-token loss (VCBM paper, arXiv:2610.24032, Sec. II-C, Eq. 7-8) and the KL estimate that
guards it.

The loss is the per-token PPO-clip of Eq. 8 (eps 0.1, no critic, no KL penalty) on the importance ratio
of Eq. 7, or on EMPO's shared ratios (docs/papers/empo.md), averaged over the generated tokens of the
generation batch.

KL estimate (`kl_old_new`): KL(pi_old || pi_theta) per rollout, the sum over its generated tokens
of the k3 estimator r - 1 - log r with r = pi_theta / pi_old = exp(-d), d = logp_old - logp_new.
The tokens were sampled from pi_old, under which this estimator is unbiased for KL(pi_old || pi_theta)
and never negative. Averaged over the micro-batch's rollouts; the iteration's estimate is the
largest over its micro-batches.
"""

from __future__ import annotations

import torch


def kl_old_new(logp_old: torch.Tensor, logp_new: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-rollout KL(pi_old || pi_theta) from tokens sampled under pi_old: sum_t (r_t - 1 - log r_t) * mask_t.

    r_t = exp(logp_new - logp_old) is the importance ratio; E_old[r] = 1 and E_old[-log r] is the KL,
    so the k3 estimator is unbiased for this direction (and each term is >= 0).
    """
    log_r = (logp_new - logp_old) * mask
    return ((torch.exp(log_r) - 1.0 - log_r) * mask).sum(-1)


def token_ratios(logps, old, mask, ratio_sharing: str, turn_ids, cell_ids, length_norm: bool) -> torch.Tensor:
    """Eq. 7's importance ratio pi_theta / pi_old per token, or EMPO's shared ratios (`ratio_sharing` effect / random)."""
    if ratio_sharing == "none":
        return torch.exp(logps - old)
    from vcbm_gym.credit.empo import shared_ratios

    return shared_ratios(logps, old, mask, turn_ids, cell_ids, length_norm=length_norm)


def ppo_clip_token_loss(ratio: torch.Tensor, advantages: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Eq. 8 per token, negated to be minimised: -min(r A, clip(r, 1 - eps, 1 + eps) A)."""
    return -torch.min(ratio * advantages, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantages)
