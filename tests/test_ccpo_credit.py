"""CCPO, SEPO and the Shapley form (vcbm_gym/credit/ccpo.py): hand-computed cases, the split parser, input
checks, and properties that a wrong sign breaks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcbm_gym.credit import ccpo
from vcbm_gym.credit.ccpo import (
    CREDIT_SPLITS,
    ccpo_difference_bonus,
    ccpo_event_bonus,
    ccpo_rewards,
    group_advantages,
    group_solo_baseline,
    parse_credit_split,
    sepo_bonuses,
    sepo_rewards,
    sepo_scores,
    shapley_credit,
)
from vcbm_gym.credit.registry import RULES, rule_class

# --- CCPO --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, r_joint, baseline, bonus, thinker",
    [
        ("helped", 1, -0.5, 1.0, 1.2),  # right with the thought, mostly wrong alone
        ("hurt", -1, 0.5, -1.0, -1.2),  # wrong with the thought, mostly right alone
        ("neither: both positive", 1, 0.5, 0.0, 1.0),
        ("neither: both negative", -1, -0.5, 0.0, -1.0),
        ("neither: baseline 0", 1, 0.0, 0.0, 1.0),
    ],
)
def test_the_event_bonus_in_each_case(case, r_joint, baseline, bonus, thinker):
    assert ccpo_event_bonus([r_joint], [baseline]).tolist() == [bonus], case
    thinker_reward, solver_reward = ccpo_rewards([r_joint], [baseline])  # lambda 0.2
    assert thinker_reward == pytest.approx([thinker]) and solver_reward.tolist() == [r_joint]


def test_the_group_solo_baseline_is_each_prompts_mean_solo_outcome():
    r_solo = [1, -1, -1, 1, 1]
    groups = ["a", "a", "a", "b", "b"]
    assert group_solo_baseline(r_solo, groups) == pytest.approx([-1 / 3, -1 / 3, -1 / 3, 1, 1])
    # interleaved group ids: each row still gets its own group's mean
    assert group_solo_baseline([1, 1, -1, -1], [7, 3, 7, 3]).tolist() == [0.0, 0.0, 0.0, 0.0]
    assert group_solo_baseline([1, 1, -1, 1], [7, 3, 7, 3]).tolist() == [0.0, 1.0, 0.0, 1.0]


def test_the_difference_bonus_and_its_thinker_reward():
    r_joint, baseline = [1, -1, 1, -1], [-0.5, 0.5, 1.0, -1.0]
    assert ccpo_difference_bonus(r_joint, baseline).tolist() == [0.75, -0.75, 0.0, 0.0]
    thinker, solver = ccpo_rewards(r_joint, baseline, bonus="difference", lam=0.4)
    assert thinker == pytest.approx([1.3, -1.3, 1.0, -1.0]) and solver.tolist() == r_joint


def test_ccpo_end_to_end_on_two_prompts():
    r_joint = [1, 1, -1, 1, -1]
    baseline = group_solo_baseline([-1, -1, 1, 1, 1], [0, 0, 0, 1, 1])  # -1/3 and 1
    thinker, solver = ccpo_rewards(r_joint, baseline)
    assert thinker == pytest.approx([1.2, 1.2, -1.0, 1.0, -1.2])
    # GRPO without std: the Thinker's group of three has mean 1.4 / 3, its group of two mean -0.1
    assert group_advantages(thinker, [0, 0, 0, 1, 1]) == pytest.approx([1.2 - 1.4 / 3, 1.2 - 1.4 / 3, -1 - 1.4 / 3, 1.1, -1.1])
    assert group_advantages(solver, [0, 0, 0, 1, 1]) == pytest.approx([2 / 3, 2 / 3, -4 / 3, 1.0, -1.0])
    assert group_advantages([0.5], [9]).tolist() == [0.0]  # a group of one has no baseline


# --- SEPO --------------------------------------------------------------------------------------------------


def test_the_parser_reads_every_fixed_split_in_every_accepted_form():
    for thinker, solver in CREDIT_SPLITS:
        percent = (round(thinker * 100), round(solver * 100))
        for text in (
            f'{{"outcome": "correct", "pair": [{thinker}, {solver}], "brief_reason": "the plan"}}',
            f"I would say ({thinker}, {solver}).",
            f"[{thinker};{solver}]",
            f"Split: {thinker}/{solver}",
            f"pair = {percent[0]}%, {percent[1]}%",
            f"({percent[0]}% / {percent[1]}%)",
        ):
            assert parse_credit_split(text) == (thinker, solver, True), text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "the Thinker did most of the work",
        "(0.75, 0.25)",  # off the grid
        "(1, 0)",
        "[0.6, 0.6]",  # does not sum to 1
        "pair: 70, 30",  # a bare number above 1 is no share
        "0.7, 0.3",  # neither bracketed nor labelled
        "(0.7, 0.3) on reflection (0.65, 0.35)",  # the last pair is the rating, and it is off the grid
    ],
)
def test_anything_else_falls_back_to_an_even_split(text):
    assert parse_credit_split(text) == (0.5, 0.5, False)


def test_the_last_pair_in_the_text_is_the_rating():
    assert parse_credit_split("Example: (0.9, 0.1). My rating: [0.2, 0.8]") == (0.2, 0.8, True)


def test_sepo_scores_weights_centring_and_rewards_by_hand():
    thinker_splits = [(0.7, 0.3), (0.5, 0.5)]
    solver_splits = [(0.6, 0.4), (0.5, 0.5)]
    s1, s2 = sepo_scores(thinker_splits, solver_splits)  # eta 0.3
    assert s1 == pytest.approx([0.3 * 0.7 + 0.7 * 0.6, 0.5]) and s2 == pytest.approx([0.3 * 0.4 + 0.7 * 0.3, 0.5])
    # w1 = 0.63 / 0.96 = 0.65625 and 0.5; the group mean 0.578125; bonus1 = +-0.078125, bonus2 = -bonus1
    bonus1, bonus2 = sepo_bonuses(s1, s2, [0, 0])
    assert bonus1 == pytest.approx([0.078125, -0.078125]) and bonus2 == pytest.approx([-0.078125, 0.078125])
    thinker, solver = sepo_rewards([1, -1], thinker_splits, solver_splits, [0, 0])
    # right: R + 0.2 bonus; wrong: R - 0.2 bonus
    assert thinker == pytest.approx([1.015625, -0.984375]) and solver == pytest.approx([0.984375, -1.015625])
    # in groups of one every weight is its own mean: no bonus, the verifier's outcome alone
    thinker, solver = sepo_rewards([1, -1], thinker_splits, solver_splits, [0, 1])
    assert thinker.tolist() == [1.0, -1.0] and solver.tolist() == [1.0, -1.0]


def test_sepo_self_weight_eta_mixes_own_and_peer_ratings():
    s1, s2 = sepo_scores([(0.9, 0.1)], [(0.1, 0.9)], eta=1.0)  # each role believes only itself
    assert s1 == pytest.approx([0.9]) and s2 == pytest.approx([0.9])
    s1, s2 = sepo_scores([(0.9, 0.1)], [(0.1, 0.9)], eta=0.0)  # each role believes only its peer
    assert s1 == pytest.approx([0.1]) and s2 == pytest.approx([0.1])


# --- the Shapley form ---------------------------------------------------------------------------------------


def test_the_shapley_form_by_hand_and_its_sum():
    phi_thinker, phi_solver = shapley_credit([1, 1, -1, -1], [1, -1, 1, -1])
    assert phi_thinker.tolist() == [0.0, 1.0, -1.0, 0.0] and phi_solver.tolist() == [1.0, 0.0, 0.0, -1.0]
    assert (phi_thinker + phi_solver).tolist() == [1, 1, -1, -1]


# --- properties a wrong sign breaks ---------------------------------------------------------------------


@st.composite
def two_role_batches(draw):
    n = draw(st.integers(1, 12))
    outcome = st.lists(st.sampled_from([-1.0, 1.0]), min_size=n, max_size=n)
    groups = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    splits = st.lists(st.sampled_from(CREDIT_SPLITS), min_size=n, max_size=n)
    return np.array(draw(outcome)), np.array(draw(outcome)), np.array(groups), draw(splits), draw(splits)


@settings(max_examples=60, deadline=None)
@given(batch=two_role_batches(), row=st.integers(0, 11), bonus=st.sampled_from(ccpo.BONUS_FORMS))
def test_a_better_solver_alone_never_raises_the_thinkers_reward(batch, row, bonus):
    """The counterfactual: where the Solver does better without the thought, the thought earns less."""
    r_joint, r_solo, groups, _, _ = batch
    row = row % len(r_joint)
    before, solver_before = ccpo_rewards(r_joint, group_solo_baseline(r_solo, groups), bonus)
    better = r_solo.copy()
    better[row] = 1.0
    after, solver_after = ccpo_rewards(r_joint, group_solo_baseline(better, groups), bonus)
    assert (after <= before + 1e-12).all() and (solver_after == solver_before).all()
    if bonus == "difference" and r_solo[row] < 0:  # the group's baseline rose: each of its Thinker rewards falls
        assert (after[groups == groups[row]] < before[groups == groups[row]]).all()
    assert (after[groups != groups[row]] == before[groups != groups[row]]).all()


@settings(max_examples=60, deadline=None)
@given(batch=two_role_batches())
def test_shapley_is_efficient_and_the_thought_is_credited_its_marginal_gain(batch):
    r_joint, r_solo, _, _, _ = batch
    phi_thinker, phi_solver = shapley_credit(r_joint, r_solo)
    assert phi_thinker + phi_solver == pytest.approx(r_joint)
    assert (np.sign(phi_thinker) == np.sign(r_joint - r_solo)).all()


@settings(max_examples=60, deadline=None)
@given(batch=two_role_batches())
def test_group_advantages_sum_to_zero_and_keep_the_rewards_order(batch):
    r_joint, _, groups, _, _ = batch
    rewards = r_joint + np.linspace(0, 0.1, len(r_joint))
    advantages = group_advantages(rewards, groups)
    for g in np.unique(groups):
        members = groups == g
        assert advantages[members].sum() == pytest.approx(0.0, abs=1e-12)
        if members.sum() > 1:  # a larger reward is a larger advantage, by the same amount
            diff = np.subtract.outer(rewards[members], rewards[members])
            assert np.subtract.outer(advantages[members], advantages[members]) == pytest.approx(diff)


@settings(max_examples=60, deadline=None)
@given(batch=two_role_batches())
def test_sepo_credit_and_blame_follow_the_centred_share(batch):
    r, _, groups, thinker_splits, solver_splits = batch
    bonus1, bonus2 = sepo_bonuses(*sepo_scores(thinker_splits, solver_splits), groups)
    thinker, solver = sepo_rewards(r, thinker_splits, solver_splits, groups)
    for g in np.unique(groups):
        assert bonus1[groups == g].sum() == pytest.approx(0.0, abs=1e-12)
    assert bonus1 + bonus2 == pytest.approx(np.zeros(len(r)), abs=1e-12)
    # a larger-than-average share: more than R when right, less than R (more blame) when wrong
    for reward, bonus in ((thinker, bonus1), (solver, bonus2)):
        shared = np.abs(bonus) < 1e-9  # an average share: the verifier's outcome alone
        assert reward[shared] == pytest.approx(r[shared])
        assert (np.sign(reward - r)[~shared] == (r * np.sign(bonus))[~shared]).all()


# --- input checks ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: ccpo_event_bonus([1, 0], [0.0, 0.0]), "r_joint[1]=0.0: expected -1 or +1"),
        (lambda: ccpo_event_bonus([[1, -1]], [0.0, 0.0]), "r_joint shape (1, 2): expected (n,)"),
        (lambda: ccpo_event_bonus([1, -1], [0.0]), "baseline shape (1,): expected (2,)"),
        (lambda: ccpo_difference_bonus([1, -1], [0.0, 1.5]), "baseline[1]=1.5: expected a number in [-1, 1]"),
        (lambda: ccpo_rewards([1], [0.0], bonus="events"), "bonus='events': expected one of event, difference"),
        (lambda: ccpo_rewards([1], [0.0], lam=-0.2), "lam=-0.2: expected"),
        (lambda: group_solo_baseline([1, -1, 2], [0, 0, 0]), "r_solo[2]=2.0: expected -1 or +1"),
        (lambda: group_solo_baseline([1, -1], [0, 0, 0]), "group_ids shape (3,): expected (2,)"),
        (lambda: group_advantages([1.0, float("nan")], [0, 0]), "rewards shape (2,): expected (n,) finite"),
        (lambda: parse_credit_split(None), "text=None: expected a str"),
        (lambda: sepo_scores([(0.75, 0.25)], [(0.5, 0.5)]), "thinker_splits[0]=(0.75, 0.25): expected one of the nine"),
        (lambda: sepo_scores([(0.5, 0.5)], [(0.5, 0.5), (0.5, 0.5)]), "solver_splits shape (2, 2): expected (1, 2)"),
        (lambda: sepo_scores([(0.5, 0.5)], [(0.5, 0.5)], eta=1.5), "eta=1.5: expected"),
        (lambda: sepo_rewards([1, -1], [(0.5, 0.5)], [(0.5, 0.5)], [0, 0]), "thinker_splits shape (1, 2): expected (2, 2)"),
        (lambda: sepo_rewards([1], [(0.5, 0.5)], [(0.5, 0.5)], [0], blame_weight=-1), "blame_weight=-1: expected"),
        (lambda: sepo_bonuses(np.array([0.0]), np.array([0.0]), [0]), "s1 + s2 = 0"),
        (lambda: shapley_credit([1, -1], [0.5, -2.0]), "r_solo[1]=-2.0: expected a number in [-1, 1]"),
    ],
)
def test_bad_input_is_one_line_naming_it(call, needle):
    with pytest.raises(ValueError) as excinfo:
        call()
    message = str(excinfo.value)
    assert "\n" not in message and needle in message, message


@pytest.mark.parametrize("name", ["ccpo", "sepo", "shapley"])
def test_the_two_role_rules_are_rules_of_the_registry_built_on_these_functions(name):
    assert RULES[name].startswith("vcbm_gym.credit.ccpo:")
    assert issubclass(rule_class(name), ccpo.RoleCreditRule) and rule_class(name).name == name
