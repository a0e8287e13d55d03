"""check_rule (vcbm_gym/credit/check.py): every built-in rule keeps the CreditRule promises, and a rule that breaks
one is refused with one line naming it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import load_file
from vcbm_gym.credit import RuleCheckError, check_rule
from vcbm_gym.credit.base import REWARDS, EpisodeBatch, RewardRule
from vcbm_gym.credit.ccpo import CREDIT_SPLITS, ROLES
from vcbm_gym.credit.registry import RULES, rule_class

# the plugin example's rules, loaded from their file under a name of their own (tests/test_rule_plugins.py installs
# the package itself and checks that nothing else imports it by name)
example_rules = load_file("examples/credit_rule_plugin/vcbm_credit_example/rules.py", "credit_rule_example_rules")


class _Sound(example_rules.DecayedReturnRule):
    """G - running mean on every trained step (the example's running mean, its observe and state, without its decay):
    a rule that keeps every promise (the broken ones below change one thing)."""

    name = "sound"

    def __init__(self) -> None:
        super().__init__(decay=1.0)

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        return batch.broadcast(batch.returns - (self.mean if self.count else 0.0))


class _NaN(_Sound):
    def advantages(self, batch):
        out = super().advantages(batch)
        out[batch.mask.argmax(axis=1) == 0] = np.nan
        return np.where(batch.mask, out, 0.0)


class _PerEpisode(_Sound):
    def advantages(self, batch):
        return batch.returns - self.mean  # (B,): one value per episode, not per step


class _CreditOnPadding(_Sound):
    def advantages(self, batch):
        return np.broadcast_to((batch.returns - self.mean)[:, None], batch.mask.shape).copy()


class _LearnsInAdvantages(_Sound):
    def advantages(self, batch):
        credit = super().advantages(batch)
        self.observe(batch)  # the running mean moves every time the batch is scored
        return credit


class _ForgetsItsMean(_Sound):
    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = int(state["count"])


class _ReadsUndeclaredGroups(_Sound):
    def advantages(self, batch):
        _, inverse = np.unique(batch.group_ids, return_inverse=True)
        means = (np.bincount(inverse, batch.returns) / np.bincount(inverse))[inverse]
        return batch.broadcast(batch.returns - means)


class _DeclaresUnread(_Sound):
    batch_needs = ("observations",)


class _RewardsWithoutRewardRule(_Sound):
    emits = REWARDS


class _TensorState(_Sound):
    def state_dict(self):
        import torch

        return {"count": self.count, "mean": torch.tensor(self.mean)}


class _UnknownInfoKey(_Sound):
    batch_needs = ("turn_flags['door_opened']",)
    info_needs = ("door_opened",)


class _SpreadReward(RewardRule):
    name = "spread"

    def rewards(self, batch):
        return batch.broadcast(batch.returns / np.maximum(batch.mask.sum(axis=1), 1))


def _outcomes(batch, rng):
    return rng.choice([-1.0, 1.0], size=batch.batch_size)


def _splits(batch, rng):
    return [CREDIT_SPLITS[i] for i in rng.integers(len(CREDIT_SPLITS), size=batch.batch_size)]


# the two-role rules' rows, as the two-role LLM arm fills them (vcbm_gym/credit/ccpo.py, RoleCreditRule)
TWO_ROLE_EXTRAS = {
    "role": lambda batch, rng: [str(role) for role in rng.choice(ROLES, size=batch.batch_size)],
    "r_joint": _outcomes,
    "r_solo": _outcomes,
    "thinker_split": _splits,
    "solver_split": _splits,
}


@pytest.mark.parametrize("name", sorted(RULES))
def test_every_built_in_rule_keeps_the_credit_rule_promises(name):
    check_rule(rule_class(name), make_extras=TWO_ROLE_EXTRAS)


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("broadcast", {"baseline": "given"}),
        ("broadcast", {"baseline": "group_mean"}),
        ("ircr", {"baseline": "given"}),
        ("vcbm_bookmark", {"advantage": "given"}),
        ("rudder", {"seed": 3, "batch_seed": 1}),
        ("rrd", {"seed": 1, "batch_seed": 2}),
    ],
)
def test_built_in_rules_keep_the_promises_with_options_and_other_batches(name, kwargs):
    check_rule(rule_class(name), **kwargs)


def test_a_sound_rule_and_a_reward_rule_pass():
    check_rule(_Sound)
    check_rule(_SpreadReward)


@pytest.mark.parametrize(
    "broken, needles",
    [
        (_NaN, ["advantages gave nan", "expected finite values"]),
        (_PerEpisode, ["advantages returned (6,)", "expected a (B, T) = (6, 7) array"]),
        (_CreditOnPadding, ["a padding step (mask False)", "expected 0 on every unmasked step"]),
        (_LearnsInAdvantages, ["when scored twice without observe", "expected a rule to learn in observe only"]),
        (_ForgetsItsMean, ["a fresh rule that loaded state_dict()", "gives other credit"]),
        (_ReadsUndeclaredGroups, ["changes when the batch holds group_ids", "expected batch_needs to name every field"]),
        (_DeclaresUnread, ["declares 'observations'", "never read it"]),
        (_RewardsWithoutRewardRule, ["may emit rewards", "has no rewards(batch)"]),
        (_TensorState, ["state['mean'] (Tensor)", "expected plain Python and numpy values"]),
        (_UnknownInfoKey, ["info_needs names ['door_opened']", "INFO_KEYS"]),
    ],
)
def test_a_rule_that_breaks_a_promise_is_one_line_naming_it(broken, needles):
    with pytest.raises(RuleCheckError) as caught:
        check_rule(broken)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"credit rule '{broken.name}' ({__name__}.{broken.__qualname__}): ")
    for needle in needles:
        assert needle in message, message


def test_an_extras_entry_it_cannot_generate_is_asked_for_and_then_used():
    class NeedsBonus(_Sound):
        batch_needs = ("extras['bonus']",)

        def advantages(self, batch):
            return batch.broadcast(batch.returns + np.asarray(batch.extras["bonus"]))

    with pytest.raises(RuleCheckError, match=r"cannot generate extras\['bonus'\].*make_extras=\{'bonus': fn\(batch, rng\)\}"):
        check_rule(NeedsBonus)
    check_rule(NeedsBonus, make_extras={"bonus": lambda batch, rng: rng.normal(size=batch.batch_size)})


def test_a_rule_that_cannot_be_built_or_is_not_a_rule_is_one_line():
    with pytest.raises(RuleCheckError, match=r"cannot be built with \{'decay': 2\}: TypeError"):
        check_rule(_Sound, decay=2)
    with pytest.raises(RuleCheckError, match="expected a subclass of vcbm_gym.credit.base.CreditRule"):
        check_rule(dict)


def test_a_rule_that_fails_on_a_batch_without_an_undeclared_field_is_told_which_it_read():
    class ReadsObservations(_Sound):
        def advantages(self, batch):
            return batch.broadcast(batch.returns + np.asarray(batch.observations).reshape(batch.batch_size, -1)[:, 0])

    with pytest.raises(
        RuleCheckError, match=r"advantages raised .* on episodes batch 0 .*\(it read observations, which its needs do not name\)$"
    ):
        check_rule(ReadsObservations)
