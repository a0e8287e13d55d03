"""Configs of the LLM arm: `MultiTurnGRPOConfig` (episodes of a text env on TRL's GRPOConfig) and
`LoopConfig` (LOOP and VCBM-blended LOOP, "Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032),
Sec. II-C and IV-B).

Names that could be confused:

- `beta` is TRL's KL-penalty coefficient; LOOP has no KL penalty, so it stays 0. The blend weight
  of Eq. 14 is `vcbm_beta`.
- `num_generations` is K, the rollouts per task; `generation_batch_size` is the rollouts per
  iteration (48 in the paper); `num_iterations` is TRL's name for the epochs over each batch
  (2 in the paper). A LOOP *iteration* is one generation batch: its rollouts, then
  `num_iterations` optimizer steps, each over the whole batch (gradient accumulation is set to
  the number of micro-batches per generation batch).
- `epsilon` is the PPO clip range of Eq. 8 (0.1 here, TRL's default is 0.2).
- `max_turns` is the trainer's turn limit; it must be at least the env's own (`max_turns`, or
  AppWorld's `max_interactions`), which the trainer checks when it makes the envs: a shorter
  limit would cut every episode before its reward.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from trl import GRPOConfig

from vcbm_gym.credit.empo import RATIO_SHARING_MODES as RATIO_SHARING

CREDITS = ("loo", "vcbm")


@dataclass
class MultiTurnGRPOConfig(GRPOConfig):
    """GRPOConfig plus the settings of whole multi-turn episodes; TRL's own defaults otherwise.

    Used as is by `--algo trl-grpo` (TRL's GRPO objective and group advantage, the external
    baseline) and extended by LoopConfig.
    """

    max_turns: int = field(default=50, metadata={"help": "turns per episode (>= the env's own limit)"})
    max_new_tokens_per_turn: int = field(default=1500, metadata={"help": "generated tokens per turn"})
    truncation_chars: int = field(default=20_000, metadata={"help": "prompt length that triggers 3-stage truncation"})
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
    # credit (Eq. 6, 12-14)
    credit: str = field(default="loo", metadata={"help": "loo (LOOP) or vcbm (VCBM-blended LOOP)"})
    vcbm_beta: float = field(default=1.0, metadata={"help": "Eq. 14 blend weight (0 = LOOP); used when credit=vcbm"})
    vcbm_tau: float = field(default=0.5, metadata={"help": "Eq. 13 softmax temperature"})
    vcbm_top_k: int = field(default=6, metadata={"help": "Eq. 13 bookmarks retrieved per rollout"})
    vcbm_alpha: float = field(default=0.05, metadata={"help": "Eq. 13 floor weight of non-retrieved tokens"})
    vcbm_few_bookmarks: str = field(
        default="floor", metadata={"help": "<= top_k bookmarks: floor (paper: plain LOO) or retrieve (rank them all)"}
    )
    vcbm_embed_dim: int = field(default=256, metadata={"help": "Eq. 12 hashing dimension d"})
    memory_capacity: int | None = field(
        default=100_000, metadata={"help": "episodic memory size (oldest bookmarks dropped first); None keeps all"}
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
        if self.credit not in CREDITS:
            raise ValueError(f"credit={self.credit!r}: expected one of {CREDITS}")
        if self.ratio_sharing not in RATIO_SHARING:
            raise ValueError(f"ratio_sharing={self.ratio_sharing!r}: expected one of {RATIO_SHARING}")
        if self.vcbm_few_bookmarks not in ("floor", "retrieve"):
            raise ValueError(f"vcbm_few_bookmarks={self.vcbm_few_bookmarks!r}: expected 'floor' or 'retrieve'")
        if not 0.0 <= self.vcbm_beta <= 1.0:
            raise ValueError(f"vcbm_beta={self.vcbm_beta}: expected a value in [0, 1]")
        if self.beta != 0.0:
            raise ValueError(f"beta={self.beta}: LOOP has no KL penalty; the Eq. 14 blend weight is vcbm_beta")
        if self.vcbm_top_k < 1:
            raise ValueError(f"vcbm_top_k={self.vcbm_top_k}: expected an integer >= 1")
        if self.memory_capacity is not None and self.memory_capacity < 1:
            raise ValueError(f"memory_capacity={self.memory_capacity}: expected None or an integer >= 1")
        if self.kl_abort <= 0 or self.vcbm_tau <= 0 or not 0 < self.vcbm_alpha < 1:
            raise ValueError(
                f"kl_abort={self.kl_abort}, vcbm_tau={self.vcbm_tau}, vcbm_alpha={self.vcbm_alpha}: "
                "expected kl_abort > 0, tau > 0, 0 < alpha < 1"
            )
        super().__post_init__()
        if self.ratio_sharing != "none" and self.steps_per_generation > 1:
            warnings.warn(
                f"ratio_sharing={self.ratio_sharing!r} with {self.steps_per_generation} micro-batches per generation "
                "batch: a cell's shared ratio averages only its members within each (shuffled) micro-batch; set "
                "per_device_train_batch_size = generation_batch_size for exact EMPO cells",
                stacklevel=2,
            )
