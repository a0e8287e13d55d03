"""EMPO: effect-marginal ratio sharing.

"One Act, Many Masks: Effect-Marginal Policy Optimization for Long-Horizon Agents" (2026; the
authors and arXiv id are not in the copy this project was built from), Sec. 4.3; the choices this
project made are in docs/papers/empo.md.

Responses generated in the same context that execute the same canonical effect form a *cell*.
Inside the PPO-clip objective, every member of a cell of size >= 2 uses the cell's shared ratio
instead of its token-level ratios, while keeping its own advantage; other responses keep the
token-level ratio exp(logp_new - logp_old). No extra rollouts, critic or model.

The paper's Eq. 14 (the shared ratio) is not in its text; we take the mean of the members' ratios
(docs/papers/empo.md, "Choices this project made"):

    r_i = exp(mean_{t in response i} (logp_new_t - logp_old_t))     (length-normalised; Sec. 5.3)
    r_i = exp(sum_{t in response i} (logp_new_t - logp_old_t))      (--no-length-norm ablation)
    R_K = mean_{i in K} r_i

and the gradient flows through every member's r_i (no stop-gradient), so d R_K / d logp_new_t =
r_i / (|K| n_i) for token t of member i (n_i its token count; r_i / |K| without length norm).

Effects come from the environment, never from parsing here: `info["effect"]` of each turn (the
env contract, vcbm_gym/contract.py; AppWorld's is envs.appworld.effect.code_effect, the text
envs name the tool called). None means "no executable effect": such a response is in no cell.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported by `shared_ratios` only, so the mode list costs nothing
    import torch

RATIO_SHARING_MODES = ("effect", "none", "random")


def effect_cell_ids(
    context_keys: list[list[Hashable]],
    effects: list[list[Hashable | None]],
    mode: str = "effect",
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """(B, n_turns_max) cell id of response (episode b, turn j); -1 = in no cell of size >= 2.

    mode "effect": responses with equal context key and equal non-None effect share a cell (ids
    0..C-1 numbered in order of first appearance). Context keys should identify the decision
    context (e.g. the task id and the turn's prompt text or observation), so that cells only join
    responses that are locally comparable.
    mode "none": every response -1 (no sharing: the ablation).
    mode "random": cells of exactly the same sizes as the effect cells (so the same coverage), but
    filled with responses drawn uniformly without replacement from all B x n_turns real
    responses, ignoring context and effect (the paper's "arbitrary groups" ablation). Needs `rng`
    for reproducibility (default: a fresh unseeded generator).
    """
    if len(context_keys) != len(effects) or any(len(c) != len(e) for c, e in zip(context_keys, effects)):
        raise ValueError("context_keys and effects: expected the same number of episodes and of turns per episode")
    if mode not in RATIO_SHARING_MODES:
        raise ValueError(f"mode={mode!r}: expected one of {', '.join(RATIO_SHARING_MODES)}")
    n_turns = max((len(e) for e in effects), default=0)
    cells = np.full((len(effects), n_turns), -1, dtype=np.int64)
    if mode == "none":
        return cells
    members: dict[tuple, list[tuple[int, int]]] = {}
    for b, (keys, episode_effects) in enumerate(zip(context_keys, effects)):
        for j, (key, effect) in enumerate(zip(keys, episode_effects)):
            if effect is not None:
                members.setdefault((key, effect), []).append((b, j))
    groups = [group for group in members.values() if len(group) >= 2]
    if mode == "random":
        rng = rng if rng is not None else np.random.default_rng()
        positions = [(b, j) for b, e in enumerate(effects) for j in range(len(e))]
        order = rng.permutation(len(positions))
        start, shuffled = 0, []
        for group in groups:
            shuffled.append([positions[k] for k in order[start : start + len(group)]])
            start += len(group)
        groups = shuffled
    for cell, group in enumerate(groups):
        for b, j in group:
            cells[b, j] = cell
    return cells


def cell_coverage(cell_ids: np.ndarray, valid: np.ndarray) -> float:
    """Fraction of valid responses that are in a cell of size >= 2 (what the paper logs)."""
    cell_ids, valid = np.asarray(cell_ids), np.asarray(valid, dtype=bool)
    if cell_ids.shape != valid.shape:
        raise ValueError(f"cell_ids {cell_ids.shape} and valid {valid.shape}: expected equal shapes")
    ids, counts = np.unique(cell_ids[valid & (cell_ids >= 0)], return_counts=True)
    covered = np.isin(cell_ids, ids[counts >= 2]) & valid
    return float(covered.sum() / valid.sum()) if valid.any() else 0.0


def _check_ratio_shapes(logp_new, logp_old, mask, turn_ids, cell_ids) -> None:
    if not (logp_new.shape == logp_old.shape == mask.shape == turn_ids.shape) or logp_new.dim() != 2:
        raise ValueError(
            f"logp_new {tuple(logp_new.shape)}, logp_old {tuple(logp_old.shape)}, mask "
            f"{tuple(mask.shape)}, turn_ids {tuple(turn_ids.shape)}: expected equal (B, T) shapes"
        )
    if cell_ids.dim() != 2 or cell_ids.shape[0] != logp_new.shape[0]:
        raise ValueError(f"cell_ids {tuple(cell_ids.shape)}: expected (B={logp_new.shape[0]}, n_turns)")


def shared_ratios(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    mask: torch.Tensor,
    turn_ids: torch.Tensor,
    cell_ids: torch.Tensor,
    length_norm: bool = True,
) -> torch.Tensor:
    """(B, T) importance ratios for the PPO-clip objective with effect-marginal sharing.

    logp_new, logp_old, mask: (B, T) token log-probs and the trained-token mask; turn_ids: (B, T)
    response (turn) index of each token, -1 = not trained; cell_ids: (B, n_turns) from
    `effect_cell_ids`. Tokens of a response in a cell use the cell's shared ratio R_K (module
    docstring), the others exp(logp_new - logp_old). Only members with at least one trained
    token enter R_K. Gradients flow to logp_new only (logp_old is detached).
    """
    _check_ratio_shapes(logp_new, logp_old, mask, turn_ids, cell_ids)
    import torch

    delta = logp_new - logp_old.detach()
    token_ratio = torch.exp(delta)
    n_turns = cell_ids.shape[1]
    trained = mask.bool() & (turn_ids >= 0) & (turn_ids < n_turns)
    if n_turns == 0 or not trained.any():
        return token_ratio
    batch_index = torch.arange(logp_new.shape[0], device=logp_new.device)[:, None].expand_as(turn_ids)
    response = torch.where(trained, batch_index * n_turns + turn_ids.clamp(min=0), torch.zeros_like(turn_ids))
    token_cell = torch.where(
        trained, cell_ids.to(turn_ids.device)[batch_index, turn_ids.clamp(0, n_turns - 1)], torch.full_like(turn_ids, -1)
    )
    in_cell = token_cell >= 0
    if not in_cell.any():
        return token_ratio

    n_responses = logp_new.shape[0] * n_turns
    flat_response = response[in_cell]
    log_sum = torch.zeros(n_responses, dtype=delta.dtype, device=delta.device).index_add(0, flat_response, delta[in_cell])
    n_tokens = torch.zeros(n_responses, dtype=delta.dtype, device=delta.device).index_add(
        0, flat_response, torch.ones_like(delta[in_cell])
    )
    has_tokens = n_tokens > 0
    response_log_ratio = torch.where(has_tokens, log_sum / n_tokens.clamp(min=1), log_sum) if length_norm else log_sum
    response_ratio = torch.exp(response_log_ratio)

    response_cell = torch.full((n_responses,), -1, dtype=torch.long, device=delta.device)
    response_cell[flat_response] = token_cell[in_cell]
    members = has_tokens & (response_cell >= 0)
    n_cells = int(response_cell.max()) + 1
    cell_sum = torch.zeros(n_cells, dtype=delta.dtype, device=delta.device).index_add(
        0, response_cell[members], response_ratio[members]
    )
    cell_size = torch.zeros(n_cells, dtype=delta.dtype, device=delta.device).index_add(
        0, response_cell[members], torch.ones_like(response_ratio[members])
    )
    cell_ratio = cell_sum / cell_size.clamp(min=1)

    shared = torch.zeros_like(token_ratio)
    shared[in_cell] = cell_ratio[token_cell[in_cell]]
    return torch.where(in_cell, shared, token_ratio)
