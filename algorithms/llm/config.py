"""Configs of the LLM arm: `MultiTurnGRPOConfig` (episodes of a text env on TRL's GRPOConfig) and
`LoopConfig` (LOOP and VCBM-blended LOOP, "Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032),
Sec. II-C and IV-B).

Names that could be confused:

- `beta` is TRL's KL-penalty coefficient: GRPO's penalty toward the reference policy (the model the run
  starts from). LOOP has none, so it defaults to 0; beta > 0 adds it (beyond the paper). The blend weight
  of Eq. 14 is vcbm_blend's own `beta`, under `credit_kwargs: {vcbm_blend: {beta: ...}}`.
- `credit` is a credit rule's name (vcbm_gym.credit.registry.RULES), as SB3's `--credit`; its
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
- `objective` is the base objective around the credit rule's advantages (docs/papers/base_objectives.md):
  `ppo_clip` (Eq. 7-8, the default), `gspo` (GSPO's sequence ratio; its paper's clip range is `epsilon: 3.0e-4`,
  `epsilon_high: 4.0e-4`, set like any other setting, as in TRL) or `reinforce_pp` (REINFORCE++'s global advantage
  normalisation). It is recorded in config.yml only when set, so the runs from before it keep their config hash.
  `epsilon_high` (TRL's upper clip range, None: `epsilon`) applies to every objective.
- `max_turns` is the trainer's turn limit; it must be at least the env's own (`max_turns`, or
  AppWorld's `max_interactions`), which the trainer checks when it makes the envs: a shorter
  limit would cut every episode before its reward.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trl import GRPOConfig

from algorithms.common.credit_slot import CreditFit, CreditSlot
from algorithms.common.validation import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Range, Validated
from algorithms.llm.generation.prompting import WITH_ONE_SHOT, prompt_name
from algorithms.llm.training.loss import OBJECTIVES
from vcbm_gym.credit.base import ADVANTAGES
from vcbm_gym.credit.empo import RATIO_SHARING_MODES as RATIO_SHARING

# The credit rule of each LOOP algorithm when no config names one (trl-grpo keeps TRL's own advantage).
DEFAULT_CREDIT = {"loop": "loo", "vcbm-loop": "vcbm_blend"}
# What the LLM arm's EpisodeBatch holds (algorithms/llm/training/batch.py:episode_batch), in the terms of
# CreditRule.batch_needs: a rule that needs anything else (observations, coalition values) is refused.
LLM_BATCH_PROVIDES = frozenset(
    {
        "group_ids",
        "step_turn",
        "turn_flags['state_mutating']",
        "turn_texts",
        "final_texts",
        "extras['anchor_keys']",
        "extras['branches']",  # the continuations of a branch-based rule (vineppo, rice), played by LoopTrainer
    }
)
# The env info keys the rollout reads into the batch (algorithms/llm/generation/rollout.py), in the terms of
# CreditRule.info_needs, and those it has a stand-in for when an env does not report them: an env
# need not report these for a rule that learns from them.
LLM_INFO_PROVIDES = frozenset({"state_mutating", "execution_output", "effect"})
INFO_STAND_INS = {"execution_output": "the turn's observation text"}
FINETUNE_MODES = ("auto", "lora", "full")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TINY_MODELS = ("tiny", "tiny-random")


# What the LLM trainer gives a credit rule and takes from it (algorithms/common/credit_slot.py): LOOP's loss reads
# per-token advantages, and it has no estimator of its own to take rewards; the arm's defaults for a rule's
# arguments where the rule's own differ (a bounded episodic memory).
LLM_CREDIT = CreditFit(
    arm="llm",
    learner="the LLM trainer (its PPO-clip loss reads advantages; it has no critic to take rewards)",
    batch_provides=LLM_BATCH_PROVIDES,
    info_provides=LLM_INFO_PROVIDES,
    consumes=frozenset({ADVANTAGES}),
    rule_defaults={"vcbm_blend": {"memory_capacity": 100_000}},
)


def credit_slot(credit: str, credit_kwargs: dict) -> CreditSlot:
    """The run's rule as a recipe; `credit: vcbm` (the earlier name of vcbm-loop's rule) is one line saying where
    its settings went."""
    if credit == "vcbm":
        raise ValueError(
            "credit='vcbm': VCBM-blended LOOP is now credit: vcbm_blend (its settings under "
            "credit_kwargs: {vcbm_blend: {beta: ..., tau: ...}})"
        )
    return CreditSlot(credit, credit_kwargs)


@dataclass
class LoopRunConfig(Validated):
    """The run's settings outside the trainer's config: model, budget, env, LoRA, checkpoints."""

    RANGES = {
        "iterations": AT_LEAST_ONE,
        "checkpoint_every": NON_NEGATIVE,
        "n_tasks": AT_LEAST_ONE,
        "torch_threads": NON_NEGATIVE,
        "lora_r": AT_LEAST_ONE,
        "lora_alpha": POSITIVE,
        "lora_dropout": Range(0, 1, hi_open=True),
    }

    iterations: int = 200
    model: str = "tiny"
    finetune: str = "auto"  # auto: full for the tiny models, LoRA otherwise
    env_kwargs: dict = field(default_factory=dict)
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: list = field(default_factory=lambda: list(LORA_TARGETS))
    checkpoint_every: int = 0
    n_tasks: int = 1024  # task seeds drawn from the run seed; independent of --iterations so that resumes match
    torch_threads: int = 0  # 0: torch's default; 1 is often fastest for tiny models on shared CPUs
    # Settings that replace the entry's own on a machine without a CUDA GPU (e.g. the paper's bf16 / vLLM AppWorld
    # setting becomes a tiny CPU run); folded into their own layer when the run is resolved (the user's flags and
    # --hyperparams still win), so config.yml shows the values they gave and this stays empty
    cpu_overrides: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.finetune not in FINETUNE_MODES:
            raise ValueError(f"finetune={self.finetune!r}: expected one of {FINETUNE_MODES}")

    @property
    def full_finetune(self) -> bool:
        """Every parameter trained (not LoRA): `full`, or `auto` on a tiny model."""
        return self.finetune == "full" or (self.finetune == "auto" and self.model in TINY_MODELS)


@dataclass(frozen=True)
class LLMConfig:
    """`RunSpec.config` of an LLM run, built once when the run is resolved (algorithms/llm/resolve.py).

    `trainer` is complete but for what the run itself decides (its output dir, seed and progress bar:
    `algorithms.llm.build.trainer_config_for_run`); the credit rule's recipe is the trainer config's `credit`
    and `credit_kwargs` (`slot`), and the run builds the rule (algorithms/common/credit_slot.py)."""

    run: LoopRunConfig
    trainer: Any  # LoopConfig (loop, vcbm-loop) or MultiTurnGRPOConfig (trl-grpo)

    @property
    def slot(self) -> CreditSlot | None:
        """The credit rule's recipe; None for trl-grpo (TRL's own group advantage: its config names no rule)."""
        if not isinstance(self.trainer, LoopConfig):
            return None
        return CreditSlot(self.trainer.credit, self.trainer.credit_kwargs)

    @property
    def credit_fit(self) -> CreditFit | None:
        """What the run's trainer gives a credit rule and takes from it (None for trl-grpo)."""
        return self.trainer.CREDIT_FIT if isinstance(self.trainer, LoopConfig) else None


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
    one_shot: bool = field(default=WITH_ONE_SHOT, metadata={"help": "include the one-shot ReAct example"})
    shared_outcomes: bool = field(
        default=False,
        metadata={
            "help": "the K rollouts of a task share one draw of the env's outcome (its task seed fixes it); False: each "
            "rollout draws its own, where the env takes the reset option outcome_seed"
        },
    )
    system_prompt: str | None = field(
        default=None,
        metadata={
            "help": "a registered prompt's name (algorithms.llm.generation.prompting.PROMPTS: tiny, appworld; "
            "None: the generic one)"
        },
    )
    report_to: str | list[str] | None = "none"
    logging_steps: float = 1
    save_strategy: str = "no"
    gradient_checkpointing: bool | None = None  # deprecated alias in transformers 5
    activation_checkpointing: bool | None = False
    bf16: bool | None = False

    def __post_init__(self) -> None:
        self.system_prompt = prompt_name(self.system_prompt)  # a name in the registry, never a module to import
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
    # what this trainer gives a credit rule and takes from it (the two-role trainer's differs: two_role/config.py)
    CREDIT_FIT: ClassVar[CreditFit] = LLM_CREDIT

    # credit: a rule of vcbm_gym.credit (LOOP: loo, Eq. 6; VCBM-LOOP: vcbm_blend, Eq. 12-14)
    credit: str = field(default=DEFAULT_CREDIT["loop"], metadata={"help": "credit rule name (vcbm_gym.credit.registry)"})
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
    objective: str = field(default="ppo_clip", metadata={"help": f"base objective, one of {OBJECTIVES}"})

    def check_credit(self) -> None:
        """Refuse a credit rule this trainer cannot run (one line); the run builds the rule itself."""
        credit_slot(self.credit, self.credit_kwargs).check(self.CREDIT_FIT)

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
        self.check_credit()
        if self.ratio_sharing not in RATIO_SHARING:
            raise ValueError(f"ratio_sharing={self.ratio_sharing!r}: expected one of {RATIO_SHARING}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r}: expected one of {OBJECTIVES}")
        if self.objective == "gspo" and self.ratio_sharing != "none":
            raise ValueError(
                f"objective='gspo' with ratio_sharing={self.ratio_sharing!r}: GSPO's sequence ratio replaces the "
                "per-token ratio that EMPO shares; expected ratio_sharing: none"
            )
        if not (math.isfinite(self.beta) and self.beta >= 0.0):
            raise ValueError(
                f"beta={self.beta}: expected beta >= 0, the weight of the KL penalty toward the starting model (0: "
                "LOOP's none); the Eq. 14 blend weight is credit_kwargs: {vcbm_blend: {beta: ...}}"
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
