"""A tiny random Qwen2 model and a word-level tokenizer, built offline and deterministically.

For tests and laptops: no download, a few hundred thousand parameters, a training step well under
a second on a CPU. The tokenizer is trained by the `tokenizers` library on the project's own
prompt texts and on texts that the embedded text environments print when played at random, so
every tool name and observation word is one token. `algorithms.llm.model.warm_start` turns this random
model into the stand-in for an instruct model (`--model tiny`); `--model tiny-random` is the
model as built here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from algorithms.llm.generation.prompting import ONE_SHOT_EXAMPLE, SYSTEM_PROMPT

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]")
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = (
    SYSTEM_PROMPT,
    ONE_SHOT_EXAMPLE,
    "system user assistant Thought Action Observation",
    "repair() skip() inspect() wait() repair skip inspect wait",
    "A customer brings in a watch that has stopped. You may repair it now and ship it to the buyer, "
    "or skip the repair and return it untouched. You have turns. Turn of ; turns left.",
    "invalid action expected one of done refused already handled In transport for hours minor bumps drops",
    "Resale price after repair repair costs about shipping costs about each bump costs each drop",
    "The episode is over. Final result: the repaired watch earned nothing earned or lost You wait",
    "Alder Borealis Corvina Dunmore 0 1 2 3 4 5 6 7 8 9 + - . , : ; ( ) ' ?",
)


def _played_texts(episodes_per_env: int = 40) -> list[str]:
    """Observations of the embedded text envs under random tool calls (a fixed seed)."""
    import gymnasium as gym

    import vcbm_gym  # noqa: F401  (registers the envs)
    from envs.text_watch_workshop import TOOL_NAMES

    texts, rng = [], np.random.default_rng(0)
    tools = sorted(set(TOOL_NAMES) | {"inspect", "wait"})
    for env_id in ("TextWatchRepair-v0", "TextWatchWorkshop-v0"):
        env = gym.make(env_id)
        for episode in range(episodes_per_env):
            obs, _ = env.reset(seed=episode)
            texts.append(obs)
            done = False
            while not done:
                obs, _, terminated, truncated, _ = env.step(f"{rng.choice(tools)}()")
                texts.append(obs)
                done = terminated or truncated
    return texts


SHARED_LOSSLESS = False  # the shared tiny vocabulary's words are split at whitespace (build_tiny_tokenizer)


def build_tiny_tokenizer(extra_texts: Sequence[str], lossless: bool = SHARED_LOSSLESS) -> PreTrainedTokenizerFast:
    """Word-level tokenizer over the corpus above and the played env texts, ChatML tokens and template; `extra_texts`
    add the words of an env whose texts the embedded envs' do not cover (algorithms/llm/model/sokoban.py).

    Its words are split at whitespace, which decoding puts back as one space: "Action: Alder repair()" survives,
    code does not (newlines, indentation). `lossless` words are GPT-2's byte-level pieces instead, each with the
    whitespace before it ("\n    for", " note"), so that decode(encode(text)) is text wherever no piece is unknown."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.normalizer = normalizers.NFKC()
    if lossless:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    else:
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS), min_frequency=1)
    corpus = list(_CORPUS) + _played_texts() + list(extra_texts)
    tok.train_from_iterator(sorted(set(" ".join(corpus).split())) + corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
        additional_special_tokens=["<|im_start|>"],
        **({"clean_up_tokenization_spaces": False} if lossless else {}),  # " ." stays " ." in code
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


# The untrained tiny model's shape (`--model tiny-random`); the warm-started one sets its own (WarmStartConfig).
TINY_HIDDEN_SIZE = 64
TINY_TIED_EMBEDDINGS = True


def build_tiny_model(
    vocab_size: int,
    seed: int = 0,
    hidden_size: int = TINY_HIDDEN_SIZE,
    num_layers: int = 2,
    tie_embeddings: bool = TINY_TIED_EMBEDDINGS,
    embedding_std: float | None = None,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 (2 layers, hidden 64), identical for identical arguments.

    `tie_embeddings=False` gives the output layer its own weights; `embedding_std` re-draws the
    input embeddings from N(0, embedding_std^2) instead of the default N(0, 0.02^2).
    """
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=tie_embeddings,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen2ForCausalLM(config)
        if embedding_std is not None:
            with torch.no_grad():
                model.model.embed_tokens.weight.normal_(0.0, embedding_std)
    finally:
        torch.random.set_rng_state(generator_state)
    return model


def build_tiny(
    seed: int = 0,
    hidden_size: int = TINY_HIDDEN_SIZE,
    tie_embeddings: bool = TINY_TIED_EMBEDDINGS,
    embedding_std: float | None = None,
    extra_texts: Sequence[str] = (),
    lossless: bool = SHARED_LOSSLESS,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    tokenizer = build_tiny_tokenizer(extra_texts, lossless)
    model = build_tiny_model(
        len(tokenizer), seed, hidden_size=hidden_size, tie_embeddings=tie_embeddings, embedding_std=embedding_std
    )
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def load_tokenizer(name_or_path: str):
    """The tokenizer of a model name or folder: AutoTokenizer's, except for a generic fast tokenizer.

    A folder saved from the tiny models (warm-started, trained by this project, or a LoRA adapter
    beside them) records `tokenizer_class: TokenizersBackend`; transformers 5's AutoTokenizer maps
    it to the class of the model type instead (Qwen2's, with a byte-level decoder), which decodes the
    tiny word-level vocabulary without spaces: "Action: Alder repair()" comes back as
    "Action:Alderrepair()" and every answer is an invalid action. Such folders load as the generic class.
    """
    import json
    from pathlib import Path

    from transformers import AutoTokenizer

    config = Path(name_or_path) / "tokenizer_config.json"
    if config.is_file() and json.loads(config.read_text()).get("tokenizer_class") in (
        "TokenizersBackend",
        "PreTrainedTokenizerFast",
    ):
        return PreTrainedTokenizerFast.from_pretrained(name_or_path)
    return AutoTokenizer.from_pretrained(name_or_path)
