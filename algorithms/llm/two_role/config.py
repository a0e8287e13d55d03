"""The config of `--algo ccpo`: two roles of one model (a Thinker and a Solver) trained by LOOP's loss on the rewards
of a two-role credit rule (CCPO, SEPO, the Shapley form, or plain GRPO on the shared reward; docs/papers/ccpo.md).

`TwoRoleConfig` is LoopConfig with:
- `credit`: a rule of the credit registry that fits the two-role trainer (`TWO_ROLE_CREDIT`, checked as every arm's
  rule is: algorithms/common/credit_slot.py): the two-role rules `ccpo`, `sepo`, `shapley` (vcbm_gym/credit/ccpo.py)
  and `grpo`, both roles paid the shared reward (the baseline), or another rule that needs only the prompt groups;
  its arguments under `credit_kwargs: {ccpo: {bonus: event | difference, lam: 0.2, group_baseline: true}}` or
  `{sepo: {eta: 0.3, credit_weight: 0.2, blame_weight: 0.2}}`;
- `role_schedule`: `alternate` (the reference's: one role trained at a time, switching every `switch_every`
  iterations, the Thinker first) or `both` (every iteration trains both roles: the batch's task groups alternate
  between the roles, so each role gets half of the tasks);
- `objective` (ppo_clip, gspo, reinforce_pp) as for loop, around the rule's GRPO advantages (no std, no KL).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from algorithms.common.credit_slot import CreditFit
from algorithms.llm.config import LLM_CREDIT, LoopConfig
from vcbm_gym.credit.ccpo import ROLE_EXTRAS, SPLIT_EXTRAS

TWO_ROLE_DEFAULT = "ccpo"
# What the two-role trainer gives a credit rule (algorithms/llm/two_role/trainer.py): each row's prompt group and its
# role's inputs in the batch's extras (every rollout's credit splits, which it asks for under a rule that reads them),
# the shared reward R_joint on the row's last token; it takes advantages, through LOOP's loss. No other batch field
# or env info key: its rows are single turns of plays it runs itself, so a rule that reads turns, texts or branches
# is refused. `grpo` without std is the baseline of the paper (both roles paid R_joint, as CCPO trains each role).
TWO_ROLE_CREDIT = CreditFit(
    arm="ccpo (two-role LLM)",
    learner="the two-role trainer (its PPO-clip loss reads advantages; it has no critic to take rewards)",
    batch_provides=frozenset({"group_ids", *(f"extras[{key!r}]" for key in (*ROLE_EXTRAS, *SPLIT_EXTRAS))}),
    info_provides=frozenset(),
    consumes=LLM_CREDIT.consumes,
    rule_defaults={"grpo": {"normalise_std": False}},
    own_credit=False,
)
ROLE_SCHEDULES = ("alternate", "both")
SWITCH_EVERY = 10  # the reference's: the trained role switches every 10 steps


@dataclass
class TwoRoleConfig(LoopConfig):
    CREDIT_FIT = TWO_ROLE_CREDIT

    credit: str = field(default=TWO_ROLE_DEFAULT, metadata={"help": "credit rule name (vcbm_gym.credit.registry)"})
    role_schedule: str = field(default="alternate", metadata={"help": f"one of {ROLE_SCHEDULES}"})
    switch_every: int = field(default=SWITCH_EVERY, metadata={"help": "iterations per role (role_schedule: alternate)"})

    def check_credit(self) -> None:
        super().check_credit()
        if self.role_schedule not in ROLE_SCHEDULES:
            raise ValueError(f"role_schedule={self.role_schedule!r}: expected one of {', '.join(ROLE_SCHEDULES)}")
        if isinstance(self.switch_every, bool) or not isinstance(self.switch_every, int) or self.switch_every < 1:
            raise ValueError(f"switch_every={self.switch_every!r}: expected an integer >= 1 (iterations per role)")
        if self.ratio_sharing != "none":
            raise ValueError(f"ratio_sharing={self.ratio_sharing!r} for ccpo: expected none (a row holds one turn)")


def role_of_iteration(iteration: int, schedule: str, switch_every: int) -> str:
    """The role trained at `iteration` (0-based): under `alternate` the Thinker for iterations [0, switch_every),
    the Solver for the next switch_every, and so on; under `both`, "both"."""
    if schedule == "both":
        return "both"
    return "thinker" if (iteration // switch_every) % 2 == 0 else "solver"


def row_roles(role: str, n_rows: int, group_size: int) -> list[str]:
    """The role of each of `n_rows` rows (groups of `group_size` consecutive rows, one task each) for the
    iteration's `role`: all of it, or under "both" the groups alternating Thinker, Solver, Thinker, ..."""
    if role != "both":
        return [role] * n_rows
    return ["thinker" if (k // group_size) % 2 == 0 else "solver" for k in range(n_rows)]
