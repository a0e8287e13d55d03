"""The config of `--algo ccpo`: two roles of one model (a Thinker and a Solver) trained by LOOP's loss on the rewards
of a two-role credit rule (CCPO, SEPO, the Shapley form, or plain GRPO on the shared reward; docs/papers/ccpo.md).

`TwoRoleConfig` is LoopConfig with:
- `credit`: one of vcbm_gym.credit.ccpo.TWO_ROLE_CREDITS (not a rule of the RULES table), its arguments under
  `credit_kwargs: {ccpo: {bonus: event | difference, lam: 0.2, group_baseline: true}}` or
  `{sepo: {eta: 0.3, credit_weight: 0.2, blame_weight: 0.2}}`;
- `role_schedule`: `alternate` (the reference's: one role trained at a time, switching every `switch_every`
  iterations, the Thinker first) or `both` (every iteration trains both roles: the batch's task groups alternate
  between the roles, so each role gets half of the tasks);
- `objective` (ppo_clip, gspo, reinforce_pp) as for loop, around the rule's GRPO advantages (no std, no KL).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from algorithms.llm.config import LoopConfig
from vcbm_gym.credit.ccpo import TWO_ROLE_CREDITS, credit_arguments

TWO_ROLE_DEFAULT = "ccpo"
ROLE_SCHEDULES = ("alternate", "both")
SWITCH_EVERY = 10  # the reference's: the trained role switches every 10 steps


@dataclass
class TwoRoleConfig(LoopConfig):
    RULE_CREDIT = False  # `credit` names a two-role rule (vcbm_gym.credit.ccpo), built by the trainer itself

    credit: str = field(default=TWO_ROLE_DEFAULT, metadata={"help": f"two-role credit, one of {TWO_ROLE_CREDITS}"})
    role_schedule: str = field(default="alternate", metadata={"help": f"one of {ROLE_SCHEDULES}"})
    switch_every: int = field(default=SWITCH_EVERY, metadata={"help": "iterations per role (role_schedule: alternate)"})

    def check_credit(self) -> None:
        if not isinstance(self.credit_kwargs, dict):
            raise ValueError(f"credit_kwargs={self.credit_kwargs!r}: expected rule name -> mapping of its arguments")
        for name, kwargs in self.credit_kwargs.items():
            if name not in TWO_ROLE_CREDITS or not isinstance(kwargs, dict):
                raise ValueError(
                    f"credit_kwargs[{name!r}]={kwargs!r}: expected rule name -> mapping of its arguments, "
                    f"rule names: {', '.join(TWO_ROLE_CREDITS)}"
                )
            credit_arguments(name, kwargs)
        credit_arguments(self.credit, self.credit_kwargs.get(self.credit))
        if self.role_schedule not in ROLE_SCHEDULES:
            raise ValueError(f"role_schedule={self.role_schedule!r}: expected one of {', '.join(ROLE_SCHEDULES)}")
        if isinstance(self.switch_every, bool) or not isinstance(self.switch_every, int) or self.switch_every < 1:
            raise ValueError(f"switch_every={self.switch_every!r}: expected an integer >= 1 (iterations per role)")
        if self.ratio_sharing != "none":
            raise ValueError(f"ratio_sharing={self.ratio_sharing!r} for ccpo: expected none (a row holds one turn)")

    @property
    def credit_args(self) -> dict:
        """The run's rule's arguments, defaults filled in."""
        return credit_arguments(self.credit, self.credit_kwargs.get(self.credit))


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
