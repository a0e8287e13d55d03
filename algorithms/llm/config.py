"""Configs of the LLM arm: `MultiTurnGRPOConfig` (episodes of a text env on TRL's GRPOConfig) and
`LoopConfig` (LOOP and VCBM-blended LOOP, "Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032),
Sec. II-C and IV-B).

Names that could be confused:

- `beta` is TRL's KL-penalty coefficient; LOOP has no KL penalty, so it stays 0. The blend weight
  of Eq. 14 is vcbm_blend's own `beta`, under `credit_kwargs: {vcbm_blend: {beta: ...}}`.
- `credit` is a credit rule's name (vcbm_gym.credit.base.RULES), as SB3's `--credit`; its
  constructor arguments go under `credit_kwargs`, keyed by rule name, so that one config serves
  every `--credit`. `loop` names `loo`, `vcbm-loop` names `vcbm_blend`.
- `num_generations` is K, the rollouts per task; `generation_batch_size` is the rollouts per
  iteration (48 in the paper); `num_iterations` is TRL's name for the epochs over each batch
  (2 in the paper). A LOOP *iteration* is one generation batch: its rollouts, then
  `num_iterations` optimizer steps, each over the whole batch (gradient accumulation is set to
  the number of micro-batches per generation batch).
- `epsilon` is the PPO clip range of Eq. 8 (0.1 here, TRL's default is 0.2).
- `max_episode_tokens` bounds a training sequence (an episode's prompt + completion tokens, which
  otherwise grows with every turn): an answer that would cross it is cut at the bound, the env
  takes the cut answer as that turn's action, and the episode ends there with the return it has
  (as at the turn limit), marked in the `token_bound_rate` metric; a first prompt that already
  fills it is refused. None (the default) bounds by the model's context length
  (`config.max_position_embeddings`), and leaves the sequence unbounded for a model that reports none.
- `max_turns` is the trainer's turn limit; it must be at least the env's own (`max_turns`, or
  AppWorld's `max_interactions`), which the trainer checks when it makes the envs: a shorter
  limit would cut every episode before its reward.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field

from trl import GRPOConfig

from vcbm_gym.credit.empo import RATIO_SHARING_MODES as RATIO_SHARING

# What the LLM arm's EpisodeBatch holds (algorithms/llm/trainer.py:episode_batch), in the terms of
# CreditRule.batch_needs: a rule that needs anything else (observations, coalition values) is refused.
LLM_BATCH_PROVIDES = frozenset(
    {
        "group_ids",
        "step_turn",
        "turn_flags['state_mutating']",
        "turn_texts",
        "final_texts",
        "extras['anchor_keys']",
    }
)
# The LLM arm's defaults for a rule's arguments where the rule's own differ: a bounded episodic memory.
LLM_RULE_DEFAULTS = {"vcbm_blend": {"memory_capacity": 100_000}}


def rule_kwargs(credit: str, credit_kwargs: dict) -> dict:
    """The constructor arguments of rule `credit`: LLM_RULE_DEFAULTS, then credit_kwargs[credit]."""
    return {**LLM_RULE_DEFAULTS.get(credit, {}), **credit_kwargs.get(credit, {})}


def check_credit(credit: str, credit_kwargs: dict) -> None:
    """Refuse (ValueError, one line) a rule that is unknown, badly configured, or needs what the LLM batch lacks."""
    from vcbm_gym.credit.base import RULES, make_rule, unmet_needs

    if credit == "vcbm":
        raise ValueError(
            "credit='vcbm': VCBM-blended LOOP is now credit: vcbm_blend (its settings under "
            "credit_kwargs: {vcbm_blend: {beta: ..., tau: ...}})"
        )
    if credit not in RULES:
        raise ValueError(f"credit={credit!r}: expected a credit rule, one of: {', '.join(RULES)}")
    if not isinstance(credit_kwargs, dict) or not all(k in RULES and isinstance(v, dict) for k, v in credit_kwargs.items()):
        raise ValueError(
            f"credit_kwargs={credit_kwargs!r}: expected rule name -> mapping of its arguments, e.g. {{vcbm_blend: {{beta: 0.5}}}}"
        )
    kwargs = rule_kwargs(credit, credit_kwargs)
    module, _, cls = RULES[credit].partition(":")
    provided = set(LLM_BATCH_PROVIDES)
    missing = unmet_needs(getattr(importlib.import_module(module), cls).batch_needs, provided)
    if not missing:
        try:
            rule = make_rule(credit, **kwargs)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"credit rule {credit!r} (credit_kwargs {kwargs!r}): {exc}") from None
        missing = unmet_needs(rule.needs(), provided)
    if missing:
        raise ValueError(
            f"credit rule {credit!r} needs {', '.join(missing)} in its EpisodeBatch, which the LLM arm "
            f"does not provide (it has: {', '.join(sorted(provided))})"
        )


@dataclass
class MultiTurnGRPOConfig(GRPOConfig):
    """GRPOConfig plus the settings of whole multi-turn episodes; TRL's own defaults otherwise.

    Used as is by `--algo trl-grpo` (TRL's GRPO objective and group advantage, the external
    baseline) and extended by LoopConfig.
    """

    max_turns: int = field(default=50, metadata={"help": "turns per episode (>= the env's own limit)"})
    max_new_tokens_per_turn: int = field(default=1500, metadata={"help": "generated tokens per turn"})
    truncation_chars: int = field(default=20_000, metadata={"help": "prompt length that triggers 3-stage truncation"})
    max_episode_tokens: int | None = field(
        default=None,
        metadata={"help": "bound on an episode's prompt + completion tokens (None: the model's context length)"},
    )
    one_shot: bool = field(default=True, metadata={"help": "include the one-shot ReAct example"})
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "module:function(one_shot) -> an env's own ReAct prompt (None: the generic one)"},
    )
    report_to: str | list[str] | None = "none"
    logging_steps: float = 1
    save_strategy: str = "no"
    gradient_checkpointing: bool | None = None  # deprecated alias in transformers 5
    activation_checkpointing: bool | None = False
    bf16: bool | None = False

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens_per_turn", "truncation_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: expected an integer >= 1")
        if self.max_episode_tokens is not None and (isinstance(self.max_episode_tokens, bool) or self.max_episode_tokens < 2):
            raise ValueError(f"max_episode_tokens={self.max_episode_tokens}: expected None or an integer >= 2")
        self.max_completion_length = self.max_turns * self.max_new_tokens_per_turn
        super().__post_init__()
        # One optimizer step per pass over the generation batch: the iteration's `num_iterations`
        # epochs are exactly `num_iterations` optimizer steps.
        self.gradient_accumulation_steps = self.steps_per_generation

    @property
    def optimizer_steps_per_iteration(self) -> int:
        return self.num_iterations


@dataclass
class LoopConfig(MultiTurnGRPOConfig):
    # credit: a rule of vcbm_gym.credit (LOOP: loo, Eq. 6; VCBM-LOOP: vcbm_blend, Eq. 12-14)
    credit: str = field(default="loo", metadata={"help": "credit rule name (vcbm_gym.credit.base.RULES)"})
    credit_kwargs: dict = field(
        default_factory=dict, metadata={"help": "rule name -> its constructor arguments, e.g. {vcbm_blend: {beta: 1.0}}"}
    )
    # optimisation safeguards (Sec. V-B1, V-B3)
    kl_abort: float = field(default=20.0, metadata={"help": "discard an iteration whose KL estimate exceeds this (nats)"})
    outlier_grad_factor: float = field(
        default=10.0, metadata={"help": "an outlier-gradient event: pre-clip grad norm > factor x median of the last norms"}
    )
    outlier_grad_window: int = field(default=20, metadata={"help": "how many past grad norms the median covers"})
    # EMPO ratio sharing (docs/papers/empo.md)
    ratio_sharing: str = field(default="none", metadata={"help": "none, effect (EMPO cells) or random (ablation)"})
    length_norm: bool = field(default=True, metadata={"help": "EMPO: length-normalised response ratios"})

    # LOOP defaults where TRL's differ
    epsilon: float = 0.1
    beta: float = 0.0
    scale_rewards: str = "none"
    learning_rate: float = 5e-5
    lr_scheduler_type: str = "constant"
    weight_decay: float = 0.01
    max_grad_norm: float = 0.1
    num_iterations: int = 2
    num_generations: int | None = 8
    generation_batch_size: int | None = 48
    per_device_train_batch_size: int = 8
    vllm_importance_sampling_mode: str = "token_truncate"

    def __post_init__(self) -> None:
        check_credit(self.credit, self.credit_kwargs)
        if self.ratio_sharing not in RATIO_SHARING:
            raise ValueError(f"ratio_sharing={self.ratio_sharing!r}: expected one of {RATIO_SHARING}")
        if self.beta != 0.0:
            raise ValueError(
                f"beta={self.beta}: LOOP has no KL penalty; the Eq. 14 blend weight is "
                "credit_kwargs: {vcbm_blend: {beta: ...}}"
            )
        if self.kl_abort <= 0:
            raise ValueError(f"kl_abort={self.kl_abort}: expected kl_abort > 0")
        super().__post_init__()
        if self.ratio_sharing != "none" and self.steps_per_generation > 1:
            warnings.warn(
                f"ratio_sharing={self.ratio_sharing!r} with {self.steps_per_generation} micro-batches per generation "
                "batch: a cell's shared ratio averages only its members within each (shuffled) micro-batch; set "
                "per_device_train_batch_size = generation_batch_size for exact EMPO cells",
                stacklevel=2,
            )
