"""Credit rules (vcbm_gym.credit): properties over random batches, and hand-computed cases."""

from __future__ import annotations

import copy
import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tests.helpers import make_batch
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.broadcast import BroadcastRule
from vcbm_gym.credit.ccpo import CREDIT_SPLITS, ROLES
from vcbm_gym.credit.grpo import GroupMeanRule, group_relative_advantages
from vcbm_gym.credit.registry import RULES, make_rule
from vcbm_gym.credit.vcbm_bookmark import VCBMBookmarkRule, bookmark_weights


def _importable(name: str) -> bool:
    try:
        importlib.import_module(RULES[name].partition(":")[0])
        return True
    except ModuleNotFoundError:
        return False


# Constructor arguments of every registered rule in the shared contract test (rudder gets
# WatchRepair's featurizer there, as its batches have WatchRepair's 5 components).
RULE_KWARGS = {
    "broadcast": {},
    "loo": {},
    "grpo": {},
    "gigpo": {},
    "vcbm_bookmark": {"warmup_transitions": 0, "z_thresh": 1.0},
    "vcbm_blend": {"few_bookmarks": "retrieve", "top_k": 2},
    "casi": {},
    "rudder": {},
    "ircr": {},
    "rrd": {"min_buffer_episodes": 1, "train_steps": 2, "episodes_per_step": 4, "subsequence_size": 3},
    "vineppo": {},
    "rice": {},
    "ccpo": {},
    "sepo": {},
    "shapley": {},
}
WORDS = ["repair", "skip", "wait", "corvina", "bumps", "sold"]


@st.composite
def batches(draw, n_components: int = 3, max_value: int = 2, prefix: bool = False) -> EpisodeBatch:
    """Random batches; `prefix`: every episode is a non-empty prefix of its row (SB3, rudder).

    Every step is its own turn; the batch also holds the turn-level inputs of the LLM rules
    (state_mutating flags, turn and final texts, GiGPO anchors, the branch rules' continuations), CASI's
    coalition tables and the two-role rules' rows (each row's role, joint and solo outcomes, credit splits).
    """
    b = draw(st.integers(1, 6))
    t = draw(st.integers(1, 7))
    rewards = draw(hnp.arrays(np.float64, (b, t), elements=st.floats(-50, 50, allow_nan=False)))
    if prefix:
        lengths = draw(hnp.arrays(np.int64, (b,), elements=st.integers(1, t)))
        mask = np.arange(t)[None, :] < lengths[:, None]
    else:
        mask = draw(hnp.arrays(np.bool_, (b, t)))
    groups = draw(hnp.arrays(np.int64, (b,), elements=st.integers(0, 2)))
    obs = draw(hnp.arrays(np.int64, (b, t, n_components), elements=st.integers(0, max_value)))
    actions = draw(hnp.arrays(np.int64, (b, t), elements=st.integers(0, 1)))
    flags = [draw(hnp.arrays(np.bool_, (t,))) for _ in range(b)]
    words = st.lists(st.sampled_from(WORDS), min_size=0, max_size=3).map(" ".join)
    texts = [draw(st.lists(words, min_size=t, max_size=t)) for _ in range(b)]
    tables = [draw(hnp.arrays(np.float64, (2**t,), elements=st.floats(-5, 5, allow_nan=False))) for _ in range(b)]
    outcomes = st.floats(-50, 50, allow_nan=False)
    branches = [  # the branch rules' continuations (vcbm_gym/credit/branch.py): 3 at the start of every turn
        {j: (draw(hnp.arrays(np.float64, (3,), elements=outcomes)), draw(hnp.arrays(np.bool_, (3,)))) for j in range(t)}
        for _ in range(b)
    ]
    outcome = st.sampled_from([-1.0, 1.0])
    split = st.sampled_from(CREDIT_SPLITS)
    roles = {
        "role": draw(st.lists(st.sampled_from(ROLES), min_size=b, max_size=b)),
        **{key: draw(st.lists(outcome, min_size=b, max_size=b)) for key in ("r_joint", "r_solo")},
        **{key: draw(st.lists(split, min_size=b, max_size=b)) for key in ("thinker_split", "solver_split")},
    }
    return EpisodeBatch(
        np.where(mask, rewards, 0.0),
        mask,
        groups,
        observations=obs,
        actions=actions,
        turn_flags={"state_mutating": flags},
        turn_texts=texts,
        final_texts=[draw(words) for _ in range(b)],
        extras={
            "anchor_keys": [[str(o) for o in obs[i, :, 0]] for i in range(b)],
            "coalition_values": tables,
            "branches": branches,
            **roles,
        },
    )


def only_needs(batch: EpisodeBatch, needs) -> EpisodeBatch:
    """The batch with only what `needs` names (the first of each "a | b"), besides rewards, mask, groups and turns."""
    named = {need.split("|")[0].strip() for need in needs}
    return EpisodeBatch(
        batch.rewards,
        batch.mask,
        batch.group_ids,
        batch.step_turn,
        turn_flags={k: v for k, v in batch.turn_flags.items() if f"turn_flags[{k!r}]" in named},
        turn_texts=batch.turn_texts if "turn_texts" in named else None,
        final_texts=batch.final_texts if "final_texts" in named else None,
        observations=batch.observations if "observations" in named else None,
        actions=batch.actions if "actions" in named else None,
        extras={k: v for k, v in batch.extras.items() if f"extras[{k!r}]" in named},
    )


def _contract_rule(name):
    if name not in ("rudder", "rrd"):
        return make_rule(name, **RULE_KWARGS[name])
    from envs.watch_repair import WatchRepairFeaturizer

    return make_rule(name, featurizer=WatchRepairFeaturizer(), **RULE_KWARGS[name])


def test_the_contract_test_covers_every_registered_rule():
    assert set(RULE_KWARGS) == set(RULES)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("name", sorted(RULES))
def test_shapes_masks_and_state_round_trip(name, data):
    """The shared contract, for every registered rule: fed a batch that holds only what its `needs()`
    names, (B, T) finite advantages, 0 off the mask, and a state that round-trips."""
    if not _importable(name):
        pytest.skip(f"{RULES[name]} not importable here")
    shape = {"n_components": 5, "max_value": 3, "prefix": True} if name in ("rudder", "rrd") else {}
    rule = _contract_rule(name)
    first, second = (only_needs(data.draw(batches(**shape)), rule.needs()) for _ in range(2))
    rule.observe(first)
    out = rule.advantages(first)
    assert out.shape == first.rewards.shape and np.isfinite(out).all()
    assert np.all(out[~first.mask] == 0.0)

    restored = _contract_rule(name)
    restored.load_state_dict(copy.deepcopy(rule.state_dict()))
    np.testing.assert_array_equal(restored.advantages(second), rule.advantages(second))
    rule.observe(second)
    restored.observe(second)
    np.testing.assert_array_equal(restored.advantages(second), rule.advantages(second))


def _hand_loo(returns, groups):
    out = []
    for k, (g_k, grp) in enumerate(zip(returns, groups)):
        others = [g for j, (g, h) in enumerate(zip(returns, groups)) if j != k and h == grp]
        out.append(g_k - sum(others) / len(others) if others else 0.0)
    return np.array(out)


@settings(max_examples=40, deadline=None)
@given(batch=batches())
def test_loo_equals_hand_formula_and_sums_to_zero_per_group(batch):
    out = make_rule("loo").advantages(batch)
    expected = _hand_loo(batch.returns.tolist(), batch.group_ids.tolist())
    np.testing.assert_allclose(out, batch.broadcast(expected), rtol=1e-9, atol=1e-9)
    for g in np.unique(batch.group_ids):
        np.testing.assert_allclose(expected[batch.group_ids == g].sum(), 0.0, atol=1e-7)


@settings(max_examples=40, deadline=None)
@given(
    batch=batches(), alpha=st.floats(0.01, 1.0), baseline=st.sampled_from(["running_mean", "batch_mean", "group_mean", "none"])
)
def test_vcbm_bookmark_preserves_broadcast_sums_and_equals_it_at_alpha_one(batch, alpha, baseline):
    bookmark = VCBMBookmarkRule(alpha=alpha, baseline=baseline, warmup_transitions=0, z_thresh=1.0)
    broadcast = BroadcastRule(baseline)
    for rule in (bookmark, broadcast):
        rule.observe(batch)
    ours, flat = bookmark.advantages(batch), broadcast.advantages(batch)
    np.testing.assert_allclose(ours.sum(axis=1), flat.sum(axis=1), rtol=1e-9, atol=1e-9)
    if alpha == 1.0:
        np.testing.assert_array_equal(ours, flat)
    exact = VCBMBookmarkRule(alpha=1.0, baseline=baseline, warmup_transitions=0, z_thresh=1.0)
    exact.observe(batch)
    np.testing.assert_allclose(exact.advantages(batch), flat, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(batch=batches())
def test_group_mean_centres_each_group(batch):
    centred = GroupMeanRule(normalise_std=False).advantages(batch)
    per_episode = group_relative_advantages(batch.returns, batch.group_ids, normalise_std=False)
    np.testing.assert_array_equal(centred, batch.broadcast(per_episode))
    for g in np.unique(batch.group_ids):
        np.testing.assert_allclose(per_episode[batch.group_ids == g].sum(), 0.0, atol=1e-7)


def test_broadcast_running_mean_by_hand():
    rule = BroadcastRule("running_mean")
    first = make_batch([[1.0, 0.0], [0.0, 3.0]])
    rule.observe(first)  # mean of {1, 3} = 2
    np.testing.assert_array_equal(rule.advantages(first), [[-1.0, -1.0], [1.0, 1.0]])
    second = EpisodeBatch(np.array([[5.0, 0.0]]), np.array([[True, False]]))
    rule.observe(second)  # mean of {1, 3, 5} = 3
    np.testing.assert_array_equal(rule.advantages(second), [[2.0, 0.0]])


def test_broadcast_given_baseline_and_bad_inputs():
    batch = make_batch([[1.0, 2.0], [4.0, 0.0]], extras={"baseline": np.array([1.0, 5.0])})
    np.testing.assert_array_equal(BroadcastRule("given").advantages(batch), [[2.0, 2.0], [-1.0, -1.0]])
    with pytest.raises(ValueError, match="extras"):
        BroadcastRule("given").advantages(make_batch(np.zeros((2, 1))))
    with pytest.raises(ValueError, match="baseline='median'"):
        BroadcastRule("median")


def test_loo_by_hand():
    batch = make_batch([[1.0], [2.0], [6.0], [5.0]], group_ids=np.array([0, 0, 0, 1]))
    np.testing.assert_array_equal(make_rule("loo").advantages(batch)[:, 0], [1 - 4, 2 - 3.5, 6 - 1.5, 0.0])


def test_grpo_by_hand():
    batch = make_batch([[1.0], [3.0], [2.0], [2.0]], group_ids=np.array([0, 0, 1, 1]))
    std = np.sqrt(2.0)  # sample std of {1, 3}
    np.testing.assert_allclose(GroupMeanRule(eps=1e-4).advantages(batch)[:, 0], [-1 / (std + 1e-4), 1 / (std + 1e-4), 0.0, 0.0])
    np.testing.assert_array_equal(GroupMeanRule(normalise_std=False).advantages(batch)[:, 0], [-1.0, 1.0, 0.0, 0.0])


def _toy_repair_batch() -> EpisodeBatch:
    """Components [flag, t]; action 0 at t = 0 sets the flag. Four 3-step episodes."""
    actions = np.array([[0, 1, 0], [1, 0, 1], [0, 0, 1], [1, 1, 0]])
    flags = np.array([[0, 1, 1], [0, 0, 0], [0, 1, 1], [0, 0, 0]])
    obs = np.stack([flags, np.tile(np.arange(3), (4, 1))], axis=-1)
    rewards = np.array([[-1.0, 0.0, 5.0], [0.0, 0.0, 0.0], [-1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    return make_batch(rewards, observations=obs, actions=actions)


def test_vcbm_bookmark_by_hand():
    # Transitions: n0 = n1 = 4; the flag changed on 2 of the action-0 ones: rho = (0.5, 0), pooled
    # p = 0.25, z = 0.5 / sqrt(0.25 * 0.75 * 0.5) = 1.63 > 1 -> controlled; t always changes -> clock.
    batch = _toy_repair_batch()
    rule = VCBMBookmarkRule(alpha=0.5, baseline="running_mean", warmup_transitions=0, z_thresh=1.0)
    rule.observe(batch)
    assert [str(r) for r in rule.roles] == ["controlled", "clock"]
    assert rule.contexts == {(0, 0)}
    np.testing.assert_array_equal(rule.bookmarks(batch), np.tile([True, False, False], (4, 1)))
    # Returns (4, 0, 0, 0), baseline 1: A_k = (3, -1, -1, -1); weights (1, .5, .5) * 3 / 2.
    expected = np.array([3.0, -1.0, -1.0, -1.0])[:, None] * np.array([1.5, 0.75, 0.75])
    np.testing.assert_allclose(rule.advantages(batch), expected)


def test_vcbm_bookmark_is_broadcast_before_warmup_and_checks_inputs():
    batch = _toy_repair_batch()
    rule = VCBMBookmarkRule(alpha=0.1, warmup_transitions=1000)
    rule.observe(batch)
    assert rule.roles is None
    np.testing.assert_array_equal(rule.advantages(batch), batch.broadcast(batch.returns - 1.0))  # running mean 1
    with pytest.raises(ValueError, match="observations"):
        rule.observe(make_batch(np.zeros((1, 2))))
    with pytest.raises(ValueError, match="alpha"):
        VCBMBookmarkRule(alpha=0.0)


def test_bookmark_weights_by_hand():
    mask = np.array([[True, True, True, True], [True, True, False, False]])
    marks = np.array([[False, True, False, False], [False, False, False, False]])
    weights = bookmark_weights(mask, marks, alpha=0.25)
    np.testing.assert_allclose(weights, [[4 * 0.25 / 1.75, 4 / 1.75, 4 * 0.25 / 1.75, 4 * 0.25 / 1.75], [1.0, 1.0, 0.0, 0.0]])


def test_make_rule_rejects_unknown_names():
    with pytest.raises(KeyError, match="unknown credit rule 'nope'"):
        make_rule("nope")


@pytest.mark.skipif(not _importable("rudder"), reason="vcbm_gym.credit.rudder not written yet")
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_rudder_shapes_masks_and_state_round_trip(data):
    from envs.watch_repair import WatchRepairFeaturizer

    first, second = (data.draw(batches(n_components=5, max_value=3, prefix=True)) for _ in range(2))
    rule = make_rule("rudder", featurizer=WatchRepairFeaturizer())
    rule.observe(first)
    out = rule.advantages(first)
    assert out.shape == first.rewards.shape and np.all(out[~first.mask] == 0.0)
    restored = make_rule("rudder", featurizer=WatchRepairFeaturizer())
    restored.load_state_dict(copy.deepcopy(rule.state_dict()))
    np.testing.assert_array_equal(restored.advantages(second), rule.advantages(second))


def test_vcbm_bookmark_weights_given_step_advantages_by_hand():
    batch = _toy_repair_batch()
    steps = np.arange(12, dtype=float).reshape(4, 3) - 5.0
    with_steps = EpisodeBatch(
        batch.rewards, batch.mask, observations=batch.observations, actions=batch.actions, extras={"advantages": steps}
    )
    rule = VCBMBookmarkRule(alpha=0.5, advantage="given", warmup_transitions=0, z_thresh=1.0)
    rule.observe(with_steps)
    np.testing.assert_allclose(rule.advantages(with_steps), steps * np.array([1.5, 0.75, 0.75]))
    flat = VCBMBookmarkRule(alpha=1.0, advantage="given", warmup_transitions=0, z_thresh=1.0)
    flat.observe(with_steps)
    np.testing.assert_array_equal(flat.advantages(with_steps), steps)
    with pytest.raises(ValueError, match="extras"):
        rule.advantages(batch)


@settings(max_examples=30, deadline=None)
@given(batch=batches(n_components=4, max_value=2))
def test_vectorised_transition_counts_equal_change_statistics_update(batch):
    from vcbm_gym.credit.causal_roles import ChangeStatistics
    from vcbm_gym.credit.vcbm_bookmark import record_transitions

    states, actions = batch.observations[:, :-1].reshape(-1, 4), batch.actions[:, :-1].reshape(-1)
    nexts = batch.observations[:, 1:].reshape(-1, 4)
    fast, slow = ChangeStatistics(4), ChangeStatistics(4)
    record_transitions(fast, states, actions, nexts)
    for s, a, n in zip(states, actions, nexts):
        slow.update(s, int(a), n)
    np.testing.assert_array_equal(fast.change_counts, slow.change_counts)
    np.testing.assert_array_equal(fast.action_counts, slow.action_counts)
    assert fast.pre_change_states == slow.pre_change_states


def test_vcbm_bookmark_counts_the_last_step_given_next_observations():
    batch = _toy_repair_batch()
    nxt = np.concatenate([batch.observations[:, 1:], batch.observations[:, -1:] + np.array([0, 1])], axis=1)
    with_next = EpisodeBatch(
        batch.rewards, batch.mask, observations=batch.observations, actions=batch.actions, extras={"next_observations": nxt}
    )
    rule = VCBMBookmarkRule(warmup_transitions=0)
    rule.observe(with_next)
    assert rule.stats.transitions == 12  # 3 per episode instead of 2
    np.testing.assert_array_equal(rule.stats.action_counts, [6, 6])
