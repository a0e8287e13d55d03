"""Runner for `--algo ccpo` (the LLM arm with two roles of one model: algorithms/llm/two_role/trainer.py).

    python -m algorithms.train --algo ccpo --env TextThinkSolve-v0 --credit sepo --model tiny --iterations 3

`--credit` names a rule of the credit registry that the two-role trainer takes (two_role/config.py's `TWO_ROLE_CREDIT`,
checked as every arm's is): `ccpo` (the default; event bonus, or `credit_kwargs: {ccpo: {bonus: difference}}`), `sepo`,
`shapley`, or `grpo` (both roles paid the shared reward: the baseline). `--objective` picks the base objective as for
loop; `--role-schedule alternate|both` and `--switch-every N` the roles' schedule (two_role/config.py). Everything
else (model, budget, checkpoints, several processes) is the LLM arm's (algorithms/llm/runner.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from algorithms.common.config import make_env
from algorithms.common.credit_slot import CreditFit
from algorithms.common.errors import ConfigError
from algorithms.common.spec import RunSpec
from algorithms.llm.runner import LLMArm, check_model, check_system_prompt
from algorithms.llm.two_role.config import ROLE_SCHEDULES, TWO_ROLE_CREDIT, TWO_ROLE_DEFAULT


class TwoRoleArm(LLMArm):
    """The LLM arm's `ccpo`: its rules are those that fit the two-role trainer (`TWO_ROLE_CREDIT`)."""

    batch_provides = TWO_ROLE_CREDIT.batch_provides
    info_provides = TWO_ROLE_CREDIT.info_provides

    def credit_fit(self, algo: str | None = None) -> CreditFit:
        return TWO_ROLE_CREDIT

    def default_credit(self, algo: str) -> str:
        return TWO_ROLE_DEFAULT

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_arguments(parser)
        group = parser.add_argument_group("two roles (ccpo)")
        group.add_argument("--role-schedule", choices=ROLE_SCHEDULES, default=None, help="alternate roles, or both at once")
        group.add_argument("--switch-every", type=int, default=None, help="iterations per role (alternate; default 10)")

    def flag_hyperparams(self, args: argparse.Namespace) -> dict[str, Any]:
        out = super().flag_hyperparams(args)
        for flag in ("role_schedule", "switch_every"):
            if getattr(args, flag, None) is not None:
                out[flag] = getattr(args, flag)
        return out

    def validate(self, spec: RunSpec) -> None:
        """The model path, the env's two-role reset option and turn limit, the system prompt."""
        from algorithms.llm.training.trainer import check_turn_limits

        cfg = spec.config.trainer
        check_model(spec.config.run.model)
        env = make_env(spec.env, spec.config.run.env_kwargs)
        try:
            if "solo" not in env.metadata.get("reset_options", ()):
                raise ConfigError(
                    f"--algo ccpo on {spec.env}: the env takes no reset option 'solo' (the Solver's turn without the "
                    "Thinker's); expected a two-role env such as TextThinkSolve-v0"
                )
            check_turn_limits(cfg.max_turns, env, spec.env)
        finally:
            env.close()
        check_system_prompt(cfg.system_prompt)


ARM = TwoRoleArm()
