"""Format warm-start: the tiny model's stand-in for an instruct model (`--model tiny`).

Real LLM RL starts from an instruct model that already answers in the tool-call format; the RL
stage only has to learn *which* call to make. A randomly initialised tiny model answers with
random words, so most turns are invalid and the little that RL learns is about format. This
module gives the tiny model that starting point: a short supervised stage (TRL's `SFTTrainer`) on
well-formed tool-call turns of the embedded text environments, played by a scripted policy whose
decisions are coin flips: in TextWatchRepair it decides at the first turn, repair or skip 50/50
whatever the brand; at a workshop station it picks either tool 50/50. The data thus teach the
format and *carry no information about which decision is right*: after warm-start the model
repairs each brand about as often as it skips, and RL must learn the rest.

Two choices make the result a model that RL can move brand by brand (measured):

- **The model reads the brand.** A real instruct model's state at the decision carries what the
  prompt says; a tiny model trained only on brand-independent targets learns to ignore the brand
  (its share of the final hidden state's variance across brands was below 1%). Then every policy
  gradient step moves all brands together: the larger expected gain of repairing brands 1 and 2
  drags brands 0 and 3 along, until all four repair and the groups of 0 and 3 hold no skip left to
  learn from. So after its decision, the scripted policy follows a brand routine: inspect() for
  Alder and Corvina, wait() for Borealis and Dunmore. That split is orthogonal to the right
  decision (repair pays for Borealis and Corvina), so it teaches the model to tell the brands
  apart without telling it which to repair.
- **Untied output layer, input embeddings drawn with std 1** (`tie_embeddings`, `embedding_std`):
  with the default tied N(0, 0.02^2) embeddings the token in front of the decision (the brand) is a
  small part of the residual stream; drawn larger and untied from the output rows, it stays
  visible at the decision. With the tied model and the same data, of three LOOP and VCBM-LOOP
  runs at noise 0.25 one still repaired every brand after 100 iterations and the other two had
  learned at most three brands; untied, four of four reached 90% optimal decisions within 75.

Answers are one line, `Action: <subject> <tool>()`: what the call acts on (the watch's brand, or
the workshop station), copied from the observation, then the call. It is the shortest ReAct turn
that restates the object of the decision, which a model of this size needs: with the brand one
token before the call, a brand-dependent choice is a direct path through the network instead of
an attention pattern over a hundred tokens of prompt that RL would first have to discover (with
a bare `Action: tool()` the tiny model learned "repair every brand" and never the brand). It also
keeps CPU rollouts fast. The data (a few thousand turns) are built offline in about a second; the
trained model is cached under `$VCBM_GYM_CACHE` (default `~/.cache/vcbm_gym`) in a folder named
by the hash of the data, the model's config and the training settings, written atomically, so a
changed env text, tokenizer or setting builds a new one and never reuses a stale one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.llm.generation.prompting import initial_messages, tiny_system_prompt

WARM_START_ENVS = ("TextWatchRepair-v0", "TextWatchWorkshop-v0")
MARKER = "warm_start.json"


@dataclass(frozen=True)
class WarmStartConfig:
    episodes_per_env: int = 160  # random-policy episodes of each env in WARM_START_ENVS
    max_steps: int = 300  # SFT optimizer steps
    hidden_size: int = 128  # 64 never learned to copy the brand (20%, chance); 128 copies it 99% of the time
    batch_size: int = 16
    learning_rate: float = 3e-3
    model_seed: int = 0  # the random initialisation before SFT (one "instruct model" for all runs)
    data_seed: int = 0
    tie_embeddings: bool = False  # see the module docstring
    embedding_std: float = 1.0


# After its decision the scripted policy inspects Alder and Corvina watches and waits on Borealis and
# Dunmore ones: a brand routine orthogonal to the right decision (repair pays for brands 1 and 2).
BRAND_ROUTINE = ("inspect", "wait", "inspect", "wait")


def format_answer(subject: str, tool: str) -> str:
    return f"Action: {subject} {tool}()"


def _scripted_call(env_id: str, env, decided: bool, rng: np.random.Generator) -> tuple[str, str]:
    """(subject, tool) of the scripted policy at this point of an episode."""
    from envs.text_watch_repair import BRAND_NAMES

    core = env.unwrapped
    brand = BRAND_NAMES[core._brand]
    if env_id == "TextWatchWorkshop-v0":
        from envs.text_watch_workshop import COSMETIC_TOOLS, MOVEMENT, MOVEMENT_TOOLS

        station = core._stations[core._turn]
        subject, calls = (brand, MOVEMENT_TOOLS) if station == MOVEMENT else (station, COSMETIC_TOOLS)
        return subject, str(rng.choice(list(calls)))
    if decided:
        return brand, BRAND_ROUTINE[core._brand]
    return brand, "repair" if rng.random() < 0.5 else "skip"


def warm_start_examples(cfg: WarmStartConfig = WarmStartConfig()) -> list[dict[str, Any]]:
    """Conversational prompt/completion pairs, one per turn of the scripted policy's episodes.

    TextWatchRepair: repair() or skip() 50/50 at the first turn, then the brand routine
    (BRAND_ROUTINE). Workshop: either tool of the station, 50/50. No decision depends on the brand.
    """
    import gymnasium as gym

    import vcbm_gym  # noqa: F401

    rng = np.random.default_rng(cfg.data_seed)
    examples = []
    for env_id in WARM_START_ENVS:
        env = gym.make(env_id)
        for episode in range(cfg.episodes_per_env):
            obs, _ = env.reset(seed=10_000 + episode)
            messages = initial_messages(str(obs), system_prompt=tiny_system_prompt())
            decided, done = False, False
            while not done:
                subject, tool = _scripted_call(env_id, env, decided, rng)
                answer = {"role": "assistant", "content": format_answer(subject, tool)}
                examples.append({"prompt": [dict(m) for m in messages], "completion": [answer]})
                obs, _, terminated, truncated, info = env.step(answer["content"])
                decided = decided or bool(info.get("is_decision_turn"))
                messages += [answer, {"role": "user", "content": str(obs)}]
                done = terminated or truncated
    return examples


def _cache_root() -> Path:
    return Path(os.environ.get("VCBM_GYM_CACHE", Path.home() / ".cache" / "vcbm_gym"))


def warm_start_key(cfg: WarmStartConfig, examples: list[dict[str, Any]], model_config: dict, vocab: dict, *more: Any) -> str:
    digest = hashlib.sha256()
    for part in (dataclasses.asdict(cfg), examples, model_config, sorted(vocab.items()), *more):
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def _train(model, tokenizer, examples: list[dict[str, Any]], cfg: WarmStartConfig, out_dir: str) -> dict[str, float]:
    """SFT of `model` on `examples`: the loss over all steps (`mean_sft_loss`) and over the last tenth of them
    (`last_sft_loss`, what the model ends at; the mean also counts the random start's loss)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=out_dir,
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=10,
        weight_decay=0.0,
        logging_steps=max(1, cfg.max_steps // 10),
        save_strategy="no",
        report_to="none",
        seed=cfg.model_seed,
        data_seed=cfg.data_seed,
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        completion_only_loss=True,
        max_length=None,
        dataloader_num_workers=0,
        # SFTConfig recomputes activations by default; a tiny model has no memory to save, and the recompute cost a
        # quarter of each step (the trained weights are the same bit for bit either way)
        activation_checkpointing=False,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples), processing_class=tokenizer)
    result = trainer.train()
    logged = [float(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]
    return {"mean_sft_loss": float(result.training_loss), "last_sft_loss": logged[-1] if logged else float("nan")}


def cached_warm_start(
    cfg: WarmStartConfig = WarmStartConfig(),
    cache_dir: str | Path | None = None,
    base: Path | None = None,
    examples: list[dict[str, Any]] | None = None,
) -> Path:
    """The cache folder of the warm-started tiny model, built now if absent. Its name is the cache key
    (a hash of the settings, the SFT data, the model config and the vocabulary).

    `base` and `examples` make a further stage (the two-role arm's rating turns: algorithms/llm/two_role/warm_start.py):
    SFT under `cfg` of the model saved in the folder `base` (one of this cache's) on `examples`, in place of the
    random model on the envs' turns; base's name enters the key, so a rebuilt base makes a new stage."""
    import torch

    from algorithms.llm.model.tiny import build_tiny

    if base is None:
        model, tokenizer = build_tiny(
            cfg.model_seed, hidden_size=cfg.hidden_size, tie_embeddings=cfg.tie_embeddings, embedding_std=cfg.embedding_std
        )
    else:
        model, tokenizer = load_warm_start(base)
    examples = warm_start_examples(cfg) if examples is None else examples
    config, more = model.config.to_dict(), ()
    if base is not None:  # the base's path depends on where the cache lies: its name (its own key) is hashed instead
        config.pop("_name_or_path", None)
        more = (Path(base).name,)
    key = warm_start_key(cfg, examples, config, tokenizer.get_vocab(), *more)
    root = Path(cache_dir) if cache_dir is not None else _cache_root()
    folder = root / "tiny_warm_start" / key
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds; the others wait and then load
        if not (folder / MARKER).is_file():
            staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder.parent))
            try:
                previous = torch.get_num_threads()
                with contextlib.redirect_stdout(open(os.devnull, "w")):
                    losses = _train(model, tokenizer, examples, cfg, str(staging / "trainer"))
                torch.set_num_threads(previous)
                shutil.rmtree(staging / "trainer", ignore_errors=True)
                model.save_pretrained(staging)
                tokenizer.save_pretrained(staging)
                record = {"config": dataclasses.asdict(cfg), "examples": len(examples), **losses}
                (staging / MARKER).write_text(json.dumps({**record, **({"base": Path(base).name} if base else {})}))
                if folder.exists():  # an incomplete earlier attempt (no marker)
                    shutil.rmtree(folder)
                os.rename(staging, folder)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return folder


def warm_started_tiny(cfg: WarmStartConfig = WarmStartConfig(), cache_dir: str | Path | None = None):
    """The warm-started tiny model and its tokenizer, from the cache or built (and cached) now."""
    return load_warm_start(cached_warm_start(cfg, cache_dir))


def load_warm_start(folder: str | Path):
    """The model and tokenizer saved in a folder of this cache, generating until the tokenizer's end of turn."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
