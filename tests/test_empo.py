"""EMPO effect-marginal ratio sharing (docs/papers/empo.md) on synthetic tensors."""

import math

import numpy as np
import pytest
import torch

from vcbm_gym.credit.empo import (
    cell_coverage,
    effect_cell_ids,
    shared_ratios,
)


def test_effect_cells_group_same_context_and_effect():
    contexts = [["s0", "s1"], ["s0", "s1", "s2"], ["s0"]]
    effects = [["repair", "wait"], ["repair", "skip", "wait"], [None]]
    cells = effect_cell_ids(contexts, effects)
    assert cells.shape == (3, 3)
    # (s0, repair) has episodes 0 and 1; (s1, wait) vs (s1, skip) differ; None is never in a cell
    assert cells[0, 0] == cells[1, 0] >= 0
    assert cells[0, 1] == -1 and cells[1, 1] == -1 and cells[1, 2] == -1 and cells[2, 0] == -1
    assert cells[2, 1] == -1 and cells[2, 2] == -1  # padding
    valid = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=bool)
    assert cell_coverage(cells, valid) == pytest.approx(2 / 6)
    assert (effect_cell_ids(contexts, effects, mode="none") == -1).all()


def test_random_cells_keep_the_size_distribution():
    contexts = [["a"] * 4 for _ in range(5)]
    effects = [
        ["x", "y", "z", None],
        ["x", "y", "q", None],
        ["x", "w", "q", None],
        ["v", "u", "t", None],
        ["s1", "s2", "s3", "s4"],
    ]
    cells = effect_cell_ids(contexts, effects)
    sizes = sorted(np.unique(cells[cells >= 0], return_counts=True)[1])
    assert sizes == [2, 2, 3]  # x (3), y (2), q (2)
    for seed in range(5):
        random_cells = effect_cell_ids(contexts, effects, mode="random", rng=np.random.default_rng(seed))
        assert sorted(np.unique(random_cells[random_cells >= 0], return_counts=True)[1]) == sizes
    valid = np.ones((5, 4), dtype=bool)
    assert cell_coverage(random_cells, valid) == cell_coverage(cells, valid) == pytest.approx(7 / 20)


def _batch():
    # Episode 0: prompt token (turn -1) + 2 tokens of turn 0. Episode 1: 3 tokens of turn 0.
    # Episode 2: 2 tokens of turn 0 (not in a cell) + padding. Cell 0 = {(0, 0), (1, 0)}.
    torch.manual_seed(0)
    logp_old = torch.log(torch.rand(3, 4) * 0.5 + 0.25)
    logp_new = (logp_old + 0.3 * torch.randn(3, 4)).requires_grad_(True)
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    turn_ids = torch.tensor([[-1, 0, 0, -1], [0, 0, 0, -1], [0, 0, -1, -1]])
    cell_ids = torch.tensor([[0], [0], [-1]])
    return logp_new, logp_old, mask, turn_ids, cell_ids


@pytest.mark.parametrize("length_norm", [True, False])
def test_cell_members_share_one_ratio_and_gradients_match_hand_derivation(length_norm):
    logp_new, logp_old, mask, turn_ids, cell_ids = _batch()
    ratios = shared_ratios(logp_new, logp_old, mask, turn_ids, cell_ids, length_norm=length_norm)
    delta = (logp_new - logp_old).detach()
    agg = (lambda d: d.mean()) if length_norm else (lambda d: d.sum())
    r0, r1 = math.exp(agg(delta[0, 1:3])), math.exp(agg(delta[1, 0:3]))
    shared = (r0 + r1) / 2
    for b, t in [(0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]:
        assert ratios[b, t].item() == pytest.approx(shared, rel=1e-6)
    # not in a cell: token-level ratios
    torch.testing.assert_close(ratios[2, :2], torch.exp(delta[2, :2]))

    # Unclipped surrogate with per-episode advantages A = (1.0, -0.5, 2.0) on trained tokens:
    # dL/dlogp_new[b, t] for member b of the cell = (sum of A over the cell's tokens) * dR/dlogp_t,
    # dR/dlogp_t = r_b / (2 n_b) (length norm) or r_b / 2 (no length norm); outside: A_b * exp(delta).
    adv = torch.tensor([1.0, -0.5, 2.0])[:, None].expand(3, 4)
    loss = (ratios * adv * mask).sum()
    loss.backward()
    cell_adv = 1.0 * 2 + (-0.5) * 3
    n0, n1 = (2, 3) if length_norm else (1, 1)
    expected = torch.zeros(3, 4, dtype=torch.float64)
    expected[0, 1:3] = cell_adv * r0 / (2 * n0)
    expected[1, 0:3] = cell_adv * r1 / (2 * n1)
    expected[2, :2] = 2.0 * torch.exp(delta[2, :2]).double()
    torch.testing.assert_close(logp_new.grad.double(), expected, rtol=1e-5, atol=1e-6)


def test_no_cells_is_plain_token_ratio():
    logp_new, logp_old, mask, turn_ids, _ = _batch()
    ratios = shared_ratios(logp_new, logp_old, mask, turn_ids, torch.full((3, 1), -1))
    torch.testing.assert_close(ratios, torch.exp(logp_new - logp_old))
    with pytest.raises(ValueError, match="cell_ids"):
        shared_ratios(logp_new, logp_old, mask, turn_ids, torch.full((2, 1), -1))
