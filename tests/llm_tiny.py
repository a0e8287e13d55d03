"""A tiny LLM trainer on TextWatchRepair-v0 for tests that record what the trainer's methods are given.

The model is built locally (`tiny-random`, no download); the prompts are seeds drawn from a fixed generator, so two
trainers built alike train alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

ENV = "TextWatchRepair-v0"


def tiny_trainer(trainer_class: type, config_class: type, out, *, prompts: int, **config: Any):
    """`trainer_class` on the tiny random model: 8 rollouts of 4 per prompt group, two turns of 8 new tokens at most,
    learning rate 3e-3 on the CPU; `config` sets the rest (steps, epochs, micro-batch size, objective)."""
    from datasets import Dataset

    from algorithms.llm.build import model_and_tokenizer

    model, tokenizer = model_and_tokenizer("tiny-random", seed=0, bf16=False)
    args = config_class(
        output_dir=str(out),
        seed=0,
        generation_batch_size=8,
        num_generations=4,
        max_turns=2,
        max_new_tokens_per_turn=8,
        one_shot=False,
        learning_rate=3e-3,
        disable_tqdm=True,
        use_cpu=True,
        **config,
    )
    seeds = np.random.default_rng(0).integers(0, 2**31 - 1, size=prompts)
    torch.manual_seed(0)
    return trainer_class(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [str(int(s)) for s in seeds]}),
        processing_class=tokenizer,
        env_id=ENV,
        env_kwargs={"max_turns": 2, "noise_scale": 1.0},
    )
