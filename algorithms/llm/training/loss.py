"""LOOP's per-token loss (VCBM paper, arXiv:2610.24032, Sec. II-C, Eq. 7-8), the base objectives that can replace it
(GSPO, REINFORCE++; docs/papers/base_objectives.md) and the KL estimate that guards them.

The loss is the per-token PPO-clip of Eq. 8 (eps 0.1, no critic, no KL penalty) on the importance ratio
of Eq. 7, or on EMPO's shared ratios (docs/papers/empo.md), averaged over the generated tokens of the
generation batch. `objective` (LoopConfig) picks the base objective around the credit rule's advantages:

- `ppo_clip`: the above (LOOP's objective; GRPO's token-level clip on per-token advantages);
- `gspo`: GSPO's sequence ratio in its GSPO-token form (`gspo_token_ratios`), each sequence's token mean,
  then the mean over sequences (`sequence_mean_loss`);
- `reinforce_pp`: the advantages normalised over the whole generation batch (`global_normalized_advantages`),
  then the PPO-clip above.

KL penalty (`kl_to_reference`, with `beta` > 0 only; LOOP has none): GRPO's per-token estimate of
KL(pi_theta || pi_ref) toward the model the run started from, added to each token's loss times `beta`, and times the
token's importance ratio where `use_bias_correction_kl` (TRL's default) makes its gradient the unbiased one.

KL estimate (`kl_old_new`): KL(pi_old || pi_theta) per rollout, the sum over its generated tokens
of the k3 estimator r - 1 - log r with r = pi_theta / pi_old = exp(-d), d = logp_old - logp_new.
The tokens were sampled from pi_old, under which this estimator is unbiased for KL(pi_old || pi_theta)
and never negative. Averaged over the micro-batch's rollouts; the iteration's estimate is the
largest over its micro-batches.
"""

from __future__ import annotations

import numpy as np
import torch

OBJECTIVES = ("ppo_clip", "gspo", "reinforce_pp")
# REINFORCE++'s floor on the batch variance (OpenRLHF's `var.clamp(min=1e-8).rsqrt()`): a batch of equal advantages
# stays finite (all zero after centring) instead of dividing by zero.
MIN_VARIANCE = 1e-8


def kl_old_new(logp_old: torch.Tensor, logp_new: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-rollout KL(pi_old || pi_theta) from tokens sampled under pi_old: sum_t (r_t - 1 - log r_t) * mask_t.

    r_t = exp(logp_new - logp_old) is the importance ratio; E_old[r] = 1 and E_old[-log r] is the KL,
    so the k3 estimator is unbiased for this direction (and each term is >= 0).
    """
    log_r = (logp_new - logp_old) * mask
    return ((torch.exp(log_r) - 1.0 - log_r) * mask).sum(-1)


def kl_to_reference(ref_logps: torch.Tensor, logps: torch.Tensor) -> torch.Tensor:
    """GRPO's per-token KL penalty (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, Eq. 4):
    pi_ref / pi_theta - log(pi_ref / pi_theta) - 1, never negative and 0 where the two agree (TRL's `beta` term).

    Its gradient in log pi_theta is 1 - pi_ref / pi_theta: positive where the policy gives the token more
    probability than the reference, so minimising it pulls the policy back toward the reference.
    """
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1.0


def token_ratios(logps, old, mask, ratio_sharing: str, turn_ids, cell_ids, length_norm: bool) -> torch.Tensor:
    """Eq. 7's importance ratio pi_theta / pi_old per token, or EMPO's shared ratios (`ratio_sharing` effect / random)."""
    if ratio_sharing == "none":
        return torch.exp(logps - old)
    from vcbm_gym.credit.empo import shared_ratios

    return shared_ratios(logps, old, mask, turn_ids, cell_ids, length_norm=length_norm)


def ppo_clip_token_loss(ratio: torch.Tensor, advantages: torch.Tensor, epsilon: float, epsilon_high: float | None = None):
    """Eq. 8 per token, negated to be minimised: -min(r A, clip(r, 1 - eps, 1 + eps_high) A) (eps_high: eps if None)."""
    high = epsilon if epsilon_high is None else epsilon_high
    return -torch.min(ratio * advantages, torch.clamp(ratio, 1 - epsilon, 1 + high) * advantages)


def gspo_token_ratios(logps: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token's ratio (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071, Sec. 4.3):
    s_{i,t} = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)], with the sequence ratio of Sec. 4.1
    s_i = (pi_theta(y_i) / pi_old(y_i))^(1 / |y_i|) = exp(mean_t (log pi_theta - log pi_old)).

    Its value is s_i on every generated token; its gradient is s_i * grad log pi_theta(y_t), so each token's own
    advantage weighs its own log-probability. With one advantage per sequence (GSPO's A_i) the clipped loss and
    its gradient are GSPO's (Sec. 4.1-4.2), which TRL computes as importance_sampling_level="sequence"
    (tests/test_llm_objectives.py); with a credit rule's per-token advantages the credit stays on its tokens, where
    TRL's sequence form would spread the sequence's mean advantage over all of them.
    """
    log_s = ((logps - old) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return torch.exp(log_s.detach() + logps - logps.detach())


def sequence_mean_loss(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's aggregation (Sec. 4.1, 4.3): each sequence's mean over its generated tokens, then the mean over sequences.

    Summing tokens instead would weigh each sequence's ratio by its length, which GSPO's length normalisation
    of s_i is there to remove.
    """
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def global_normalized_advantages(advantages: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """REINFORCE++'s global advantage normalisation (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for
    Aligning Large Language Models", arXiv:2501.03262, its "Global Advantage Normalization"; the variant "with
    baseline" when the credit rule already subtracts a group baseline, as LOO and GRPO do): A' = (A - mean) / std,
    the mean and (population) std over every generated token of every response of the batch, not per group
    (as OpenRLHF's replay buffer `normalize` does). Tokens outside `mask` get 0.
    """
    on = np.asarray(mask, bool)
    values = np.asarray(advantages, np.float64)[on]
    if values.size == 0:
        return np.zeros(on.shape)
    mean = values.mean()
    scale = 1.0 / np.sqrt(max(((values - mean) ** 2).mean(), MIN_VARIANCE))
    return np.where(on, (np.asarray(advantages, np.float64) - mean) * scale, 0.0)
