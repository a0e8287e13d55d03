"""Set-level credit rules (CASI, docs/papers/casi.md) against hand-computed games, and SetRetrieval-v0."""

import math

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import vcbm_gym  # noqa: F401
from envs.set_retrieval import (
    InvalidSetError,
    SetRetrievalEnv,
    TextSetRetrievalEnv,
    parse_items,
    sample_request,
)
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.registry import make_rule
from vcbm_gym.credit.set_credit import (
    banzhaf_credit,
    broadcast_credit,
    coalition_table,
    loo_credit,
    shape_step_advantages,
    shapley,
    shapley_exact,
    shapley_sampled,
    singleton_credit,
    token_span_ids,
    zero_sum_shaping,
)


def glove_game(subset: frozenset) -> float:
    """v(S) = 1 if player 0 and at least one other player are in S (3 players)."""
    return float(0 in subset and len(subset) >= 2)


def test_three_player_shapley_and_banzhaf_by_hand():
    # Player 0 is pivotal in {1}, {2}, {1,2} (weights 1/6, 1/6, 1/3): 2/3. Player 1 only in {0}
    # (weight 1/6): 1/6. Banzhaf averages the 4 marginals equally: 3/4 and 1/4.
    np.testing.assert_allclose(shapley_exact(glove_game, 3), [2 / 3, 1 / 6, 1 / 6])
    np.testing.assert_allclose(banzhaf_credit(glove_game, 3), [3 / 4, 1 / 4, 1 / 4])
    np.testing.assert_allclose(singleton_credit(glove_game, 3), [0, 0, 0])
    np.testing.assert_allclose(loo_credit(glove_game, 3), [1, 0, 0])
    np.testing.assert_allclose(broadcast_credit(glove_game, 3), [1 / 3] * 3)


def test_table_and_callable_agree_and_bitmask_order():
    table = coalition_table(glove_game, 3)
    # bitmask 3 = {0, 1}, 6 = {1, 2}, 7 = N
    assert table[3] == 1 and table[6] == 0 and table[7] == 1 and table[0] == 0
    np.testing.assert_allclose(shapley_exact(table), shapley_exact(glove_game, 3))
    with pytest.raises(ValueError, match="2\\^m"):
        coalition_table(np.zeros(6))


def test_shapley_efficiency_on_random_games():
    rng = np.random.default_rng(0)
    for m in (2, 4, 7):
        table = rng.normal(size=1 << m)
        assert shapley_exact(table).sum() == pytest.approx(table[-1] - table[0])


def test_additive_game_all_rules_agree():
    weights = np.array([0.3, -1.0, 2.5, 0.7])
    game = lambda s: 5.0 + sum(weights[i] for i in s)  # noqa: E731
    for rule in (shapley_exact, singleton_credit, loo_credit, banzhaf_credit):
        np.testing.assert_allclose(rule(game, 4), weights)


def test_permutation_shapley_within_stated_error_for_m8():
    rng = np.random.default_rng(3)
    m = 8
    table = coalition_table(lambda s: len(s) ** 1.5 + rng.normal(), m)  # a fixed random non-additive game
    exact = shapley_exact(table)
    estimate, se, n = shapley_sampled(lambda s: table[sum(1 << i for i in s)], m, target_se=0.05, rng=np.random.default_rng(11))
    assert n >= 32 and se.max() < 0.05 * 1.5  # the requested error is (about) met
    assert np.all(np.abs(estimate - exact) <= 4 * se)  # |z| <= 4 for each of 8 players
    assert estimate.sum() == pytest.approx(table[-1] - table[0])  # permutation estimates stay efficient
    # for m > 10 the dispatcher samples
    big = shapley(lambda s: float(len(s)), 12, target_se=0.01, rng=np.random.default_rng(0))
    np.testing.assert_allclose(big, np.ones(12))


@pytest.mark.parametrize("mode", ["project", "scale"])
def test_zero_sum_shaping_sums_to_zero_and_respects_bound(mode):
    rng = np.random.default_rng(1)
    for _ in range(50):
        credit = rng.normal(scale=3.0, size=rng.integers(2, 9))
        z = zero_sum_shaping(credit, bound=1.0, mode=mode)
        assert abs(z.sum()) < 1e-9 and np.abs(z).max() <= 1.0 + 1e-12
        order = np.argsort(credit)
        assert np.all(np.diff(z[order]) >= -1e-12)  # weak order kept (ties where clipped)
    # inside the bound after centring: unchanged
    np.testing.assert_allclose(zero_sum_shaping(np.array([1.0, 1.2, 0.8]), 1.0), [0.0, 0.2, -0.2])


def test_projection_by_hand():
    # [5, 0, 0, 1]: clip the outlier at +1; the rest shift by the same lam so that the sum is 0:
    # 1 + 3 * (-lam) + 1 = 0 ... (0 - lam) * 2 + (1 - lam) = -1  => lam = 2/3
    np.testing.assert_allclose(zero_sum_shaping(np.array([5.0, 0.0, 0.0, 1.0]), 1.0), [1, -2 / 3, -2 / 3, 1 / 3])
    np.testing.assert_allclose(
        zero_sum_shaping(np.array([5.0, 0.0, 0.0, 1.0]), 1.0, mode="scale"), np.array([3.5, -1.5, -1.5, -0.5]) / 3.5
    )


def test_shape_step_advantages_and_token_spans():
    spans = token_span_ids([(0, 2), (2, 4), (4, 6), (6, 9), (9, 12)], [(0, 4), (6, 12)])
    np.testing.assert_array_equal(spans, [0, 0, -1, 1, 1])
    out = shape_step_advantages(0.5, spans, np.array([0.2, -0.2]), beta=2.0)
    np.testing.assert_allclose(out, [0.9, 0.9, 0.5, 0.1, 0.1])


def test_casi_rule_on_token_batch():
    # Two episodes of one task: returns 1 and 0 -> LOO broadcast advantages +1 and -1.
    rewards = np.array([[0, 0, 0, 0, 1.0], [0, 0, 0, 0, 0.0]])
    mask = np.ones_like(rewards, dtype=bool)
    step_turn = np.array([[0, 0, -1, 1, 1], [0, -1, 1, 1, -1]])
    tables = [coalition_table(glove_game, 3)[:4], np.array([0.0, 0.0, 0.0, 0.0])]  # 2-player tables
    batch = EpisodeBatch(rewards, mask, group_ids=np.array([0, 0]), step_turn=step_turn, extras={"coalition_values": tables})
    adv = make_rule("casi", beta=1.0, bound=10.0).advantages(batch)
    # episode 0: v({})=0, v({0})=0, v({1})=0, v({0,1})=1 -> Shapley (0.5, 0.5) -> centred 0
    np.testing.assert_allclose(adv[0], [1, 1, 1, 1, 1])
    asym = [np.array([0.0, 0.6, 0.0, 1.0]), np.zeros(4)]  # Shapley (0.8, 0.2) -> z = (0.3, -0.3)
    batch = EpisodeBatch(rewards, mask, group_ids=np.array([0, 0]), step_turn=step_turn, extras={"coalition_values": asym})
    adv = make_rule("casi", beta=2.0, bound=10.0).advantages(batch)
    np.testing.assert_allclose(adv[0], [1.6, 1.6, 1.0, 0.4, 0.4])
    np.testing.assert_allclose(adv[1], [-1, -1, -1, -1, -1])


def test_set_retrieval_passes_check_env_and_evaluators():
    env = gym.make("SetRetrieval-v0").unwrapped
    check_env(env, skip_render_check=True)
    check_env(TextSetRetrievalEnv(), skip_render_check=True)
    env.reset(seed=5)
    _, reward, terminated, _, info = env.step([0, 1, 2, 3, 3])
    assert terminated and info["n_unique"] == 4
    assert reward == pytest.approx(env.snapshot_value([0, 1, 2, 3]))
    assert info["set_value"] == pytest.approx(env.reference_value([3, 2, 1, 0]))
    table = info["coalition_values"]
    assert table[0b11000] == pytest.approx(env.snapshot_value([3]))  # duplicate slots: the same item once
    with pytest.raises(InvalidSetError, match="pool indices"):
        env.step([0, 1, 2, 3, 10])


def test_set_retrieval_value_has_redundant_and_complementary_pairs():
    env = SetRetrievalEnv(eval_noise_sd=0.0, eval_bias_sd=0.0, n_intents=3, complementary_intents=((0, 1),))
    request = sample_request(env.params, np.random.default_rng(0))
    np.testing.assert_allclose(request.snapshot_table, request.reference_table)  # no noise, no bias: exact
    c, w, intent = request.coverage, request.weights, request.intents
    i, j = int(np.flatnonzero(intent == 0)[0]), int(np.flatnonzero(intent == 1)[0])
    # complementary intents: coverage of the union plus the pair's bonus, which neither earns alone
    assert request.reference_value([i, j]) == pytest.approx(w @ (1 - (1 - c[i]) * (1 - c[j])) + request.bonus[0])
    assert request.reference_value([i]) == pytest.approx(w @ c[i])
    # paraphrases of one intent are redundant: together worth less than the sum of their values
    a, b = next(
        (int(x), int(y))
        for x in range(10)
        for y in range(x + 1, 10)
        if intent[x] == intent[y] and c[x] @ w > 0 and {x, y} != {i, j}
    )
    assert request.reference_value([a, b]) < request.reference_value([a]) + request.reference_value([b])
    # so Singleton, LOO and Shapley credit differ on a set with both
    table = request.slot_coalition_values(sorted({i, j, a, b}), "reference")
    assert not np.allclose(singleton_credit(table), shapley_exact(table))
    assert not np.allclose(loo_credit(table), shapley_exact(table))


def test_text_form_parses_items_and_spans():
    items, spans = parse_items("I choose c1, C3 and c12 (not in pool), c4, c4, c7, c8", pool_size=10, set_size=5)
    assert items == [1, 3, 4, 4, 7]
    assert spans[0] == (9, 11)
    env = TextSetRetrievalEnv()
    prompt, _ = env.reset(seed=0)
    assert "\nc9 (intent " in prompt
    answer = "c0, c2, c5, c6, c9"
    _, reward, _, _, info = env.step(answer)
    assert [answer[s:e] for s, e in info["item_spans"]] == ["c0", "c2", "c5", "c6", "c9"]
    assert len(info["coalition_values"]) == 32 and reward == pytest.approx(info["coalition_values"][-1])
    assert math.isclose(info["set_value"], env.request.reference_value([0, 2, 5, 6, 9]))
