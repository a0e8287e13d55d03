"""VCBM-blended LOO (Eq. 12-14 of the VCBM paper, arXiv:2610.24032; docs/papers/vcbm.md) against hand-computed numbers."""

import dataclasses
import math

import numpy as np
import pytest

from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.loo import loo_advantages
from vcbm_gym.credit.registry import make_rule
from vcbm_gym.credit.vcbm_blend import EpisodicMemory, VCBMBlendRule, blend, hash_embed, retrieval_weights


def test_hash_embed_of_a_fixed_string():
    # tokens: repair x2, the, watch, it; md5[:8] mod 256: repair 0x9ab776b9 -> 185, the 0x8fc42c6d -> 109,
    # watch 0xd2974c96 -> 150, it 0x0d149b90 -> 144. counts (2, 1, 1, 1) / sqrt(7).
    z = hash_embed("Repair the WATCH, repair it!")
    expected = np.zeros(256)
    expected[185], expected[109], expected[150], expected[144] = 2, 1, 1, 1
    np.testing.assert_allclose(z, expected / math.sqrt(7))
    assert hash_embed("--- !!!").sum() == 0.0
    assert hash_embed("abc", d=16).shape == (16,)


def test_loo_for_four_returns():
    # G = (1, 2, 3, 6): baselines (11/3, 10/3, 3, 2)
    np.testing.assert_allclose(loo_advantages(np.array([1.0, 2.0, 3.0, 6.0])), [-8 / 3, -4 / 3, 0.0, 4.0])


def _eight_bookmark_rollout():
    """10 turns of 2 generated tokens, each followed by 1 masked env token; turns 0-7 are bookmarks.

    Unit 2-d keys with cosines to the query e0 of (0.5, 1.0, 0.3, 0.9, 0.8, 0.4, 0.7, 0.6).
    """
    turns, mask = [], []
    for t in range(10):
        turns += [t, t, t]
        mask += [True, True, False]
    sims = np.array([0.5, 1.0, 0.3, 0.9, 0.8, 0.4, 0.7, 0.6])
    keys = np.stack([sims, np.sqrt(1 - sims**2)], axis=1)
    return np.array(turns), np.array(mask), list(range(8)), keys, np.array([1.0, 0.0]), sims


def test_eq13_weights_eight_bookmarks_top6():
    step_turn, mask, bookmarks, keys, query, sims = _eight_bookmark_rollout()
    w = retrieval_weights(step_turn, mask, bookmarks, keys, query, top_k=6, tau=0.5, alpha=0.05)
    # top-6 excludes turns 2 (0.3) and 5 (0.4). softmax(sim / 0.5) over the six retrieved:
    top = [1, 3, 4, 6, 7, 0]
    z = sum(math.exp(sims[i] / 0.5) for i in top)
    # raw sum: 2 tokens x (sum of softmax = 1) + 8 floor tokens x 0.05 = 2.4; 20 generated tokens
    scale = 20 / 2.4
    for turn in range(10):
        expected = math.exp(sims[turn] / 0.5) / z * scale if turn in top else 0.05 * scale
        np.testing.assert_allclose(w[(step_turn == turn) & mask], [expected, expected])
    assert np.all(w[~mask] == 0)
    assert w.sum() == pytest.approx(20.0)
    np.testing.assert_allclose(w[step_turn == 1][0], math.exp(2.0) / z * scale)


def test_few_bookmarks_skip_retrieval_and_zero_bookmarks_give_loo():
    step_turn, mask, bookmarks, keys, query, _ = _eight_bookmark_rollout()
    for n in (0, 3, 6):  # <= top_k: every token at the floor -> all ones after renormalising
        w = retrieval_weights(step_turn, mask, bookmarks[:n], keys[:n], query, top_k=6)
        np.testing.assert_array_equal(w, mask.astype(float))
    # the opt-in "retrieve" mode ranks all 3: softmax over them, 20 tokens, 6 of them retrieved
    w = retrieval_weights(step_turn, mask, bookmarks[:3], keys[:3], query, top_k=6, few_bookmarks="retrieve")
    assert w.sum() == pytest.approx(20.0)
    assert w[step_turn == 1][0] > w[step_turn == 0][0] > w[step_turn == 9][0]
    np.testing.assert_allclose(w[step_turn == 9][0], 0.05 * 20 / (2 + 14 * 0.05))


def test_blend_endpoints():
    w = np.array([[3.0, 0.5, 0.5]])
    np.testing.assert_allclose(blend(np.array([2.0]), w, 0.0), [[2.0, 2.0, 2.0]])
    np.testing.assert_allclose(blend(np.array([2.0]), w, 1.0), [[6.0, 1.0, 1.0]])
    np.testing.assert_allclose(blend(np.array([2.0]), w, 0.5), [[4.0, 1.5, 1.5]])


def _token_batch(returns, n_bookmarks=8):
    """K episodes of the 8-bookmark layout; the return sits on the last generated token."""
    step_turn, mask, _, _, _, _ = _eight_bookmark_rollout()
    k, t = len(returns), len(step_turn)
    rewards = np.zeros((k, t))
    last = np.flatnonzero(mask)[-1]
    rewards[:, last] = returns
    flags = [np.array([i < n_bookmarks for i in range(10)]) for _ in range(k)]
    texts = [[f"executed call {i} result {i * 7} items" for i in range(10)] for _ in range(k)]
    return EpisodeBatch(
        rewards=rewards,
        mask=np.tile(mask, (k, 1)),
        group_ids=np.zeros(k, dtype=int),
        step_turn=np.tile(step_turn, (k, 1)),
        turn_flags={"state_mutating": flags},
        turn_texts=texts,
        final_texts=["result 21 items executed call 3"] * k,
    )


def test_rule_beta0_is_exactly_loo_and_weights_sum_to_token_count():
    batch = _token_batch([1.0, 2.0, 3.0, 6.0])
    loo = make_rule("loo").advantages(batch)
    np.testing.assert_array_equal(VCBMBlendRule(beta=0.0).advantages(batch), loo)
    rule = VCBMBlendRule(beta=1.0)
    w = rule.token_weights(batch)
    np.testing.assert_allclose(w.sum(axis=1), batch.mask.sum(axis=1))
    adv = rule.advantages(batch)
    # per-episode advantage mass is preserved: sum_t A_t = A_k x (number of generated tokens)
    np.testing.assert_allclose(adv.sum(axis=1), loo.sum(axis=1))
    assert np.all(adv[~batch.mask] == 0)
    # the bookmark whose output shares most words with the terminal observation ("call 3 ... 21") wins
    first = adv[3][batch.mask[3]]
    turn_of = batch.step_turn[3][batch.mask[3]]
    assert np.argmax(first) in np.flatnonzero(turn_of == 3)


def test_memory_observe_save_load_and_capacity():
    rule = VCBMBlendRule()
    batch = _token_batch([1.0, 2.0, 3.0, 6.0])
    rule.observe(batch)
    assert len(rule.memory) == 4 * 8
    np.testing.assert_array_equal(rule.memory.turn_idx[:8], np.arange(8))
    np.testing.assert_allclose(rule.memory.returns[8:16], 2.0)
    np.testing.assert_allclose(rule.memory.embeddings[2], hash_embed(batch.turn_texts[0][2]), rtol=1e-6)
    state = rule.state_dict()
    other = VCBMBlendRule()
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.memory.embeddings, rule.memory.embeddings)
    np.testing.assert_array_equal(other.memory.returns, rule.memory.returns)
    bounded = EpisodicMemory(dim=4, capacity=3)
    bounded.add([0, 1], np.eye(4)[:2], [1.0, 2.0])
    bounded.add([2, 3], np.eye(4)[2:], [3.0, 4.0])
    np.testing.assert_array_equal(bounded.turn_idx, [1, 2, 3])
    np.testing.assert_array_equal(bounded.returns, [2.0, 3.0, 4.0])


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="beta=1.5"):
        VCBMBlendRule(beta=1.5)
    with pytest.raises(ValueError, match="few_bookmarks='always'"):
        VCBMBlendRule(few_bookmarks="always")


def test_retrieval_share_counts_the_rollouts_whose_bookmarks_were_ranked():
    batch = _token_batch([1.0, 2.0, 3.0, 6.0])
    flags = [np.array([i < n for i in range(10)]) for n in (8, 7, 6, 0)]
    batch = dataclasses.replace(batch, turn_flags={"state_mutating": flags})
    floor = VCBMBlendRule()
    assert math.isnan(floor.summary()["retrieval_share"])  # no batch yet
    floor.token_weights(batch)
    assert floor.summary()["retrieval_share"] == 0.5  # 8 and 7 bookmarks are more than top_k (6); 6 and 0 are LOO
    every = VCBMBlendRule(few_bookmarks="retrieve")
    every.token_weights(batch)
    assert every.summary()["retrieval_share"] == 0.75  # every rollout that has a bookmark
