"""The ReAct prompt (one fixed one-shot example) and the three-stage prompt truncation.

"Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032), Sec. V-B1:
once the running prompt exceeds `max_chars` (20,000)
characters it is shortened in three stages, each applied only if the previous one was not enough:

1. blank old observations: every environment message except the task (first user message) and
   the `keep_recent` most recent ones becomes a short placeholder;
2. truncate long observations: any remaining environment message longer than `obs_chars` keeps its
   head and tail;
3. drop the oldest blocks: (assistant, user) pairs after the task are removed oldest first.

The system prompt and the task are never touched. Messages are chat dicts {"role", "content"}.
"""

from __future__ import annotations

SYSTEM_PROMPT = (
    "You are an agent acting in a text environment. Each turn you read the latest observation, think "
    "briefly, then call exactly one tool. Answer in two lines:\n"
    "Thought: your reasoning in one or two sentences\n"
    "Action: the tool call, for example inspect()\n"
    "Only the action line changes anything. Invalid actions are answered with an error and waste a turn."
)

ONE_SHOT_EXAMPLE = (
    "Example (a different task, to show the format):\n"
    "Observation: A lamp in the hall flickers. Tools: fix() replaces the bulb, leave() ignores it, "
    "look() describes the lamp.\n"
    "Thought: I should learn what kind of lamp it is before deciding.\n"
    "Action: look()\n"
    "Observation: look(): an old lamp; a new bulb costs little and the hall is used every night.\n"
    "Thought: Fixing is cheap and useful here.\n"
    "Action: fix()\n"
    "Observation: fix() done: the lamp works."
)

BLANKED = "[old observation omitted]"


# Prompts include the one-shot ReAct example unless a config says otherwise (MultiTurnGRPOConfig.one_shot).
WITH_ONE_SHOT = True


TINY_SYSTEM_PROMPT = "You act in a text environment. Answer each observation with one tool call: Action: <subject> <tool>()"


def tiny_system_prompt(one_shot: bool = False) -> str:
    """The system prompt of the tiny models (`system_prompt: tiny`; their answer format: algorithms.llm.model.warm_start).

    One line instead of the generic ReAct prompt: a model this small does not read instructions,
    and every prompt token dilutes the attention that its decision has to pay to the brand.
    """
    return TINY_SYSTEM_PROMPT


# The system prompts a config can name (`system_prompt: NAME`): name -> the function(one_shot) that writes it. A config
# is data: its string is looked up here and nothing else is imported, so a config file from elsewhere cannot run code.
PROMPTS: dict[str, str] = {
    "tiny": "algorithms.llm.generation.prompting:tiny_system_prompt",  # the warm-started tiny models' one-line prompt
    "appworld": "envs.appworld.prompt:system_prompt",  # AppWorld's ReAct prompt with its API docs and worked example
    "textgame": "envs.textworld_express:system_prompt",  # TextWorld(Express) games: answer with one listed valid action
}
# Each registered function's own module:function path, accepted as another name of the same prompt (looked up in
# this table, never imported), so that a config.yml that spells it so still reruns; so is the path by which config.yml
# files of earlier versions name the tiny prompt.
PROMPT_ALIASES: dict[str, str] = {
    **{target: name for name, target in PROMPTS.items()},
    "algorithms.llm.warm_start:tiny_system_prompt": "tiny",
}


def prompt_name(value: object) -> str | None:
    """The registered name of `value` (a name of PROMPTS or one of PROMPT_ALIASES), None for None (the generic
    prompt); ValueError (one line naming the registered names) for anything else."""
    if value is None:
        return None
    if isinstance(value, str) and value in PROMPTS:
        return value
    if isinstance(value, str) and value in PROMPT_ALIASES:
        return PROMPT_ALIASES[value]
    raise ValueError(
        f"system_prompt={value!r} is not a registered prompt: expected one of {', '.join(PROMPTS)} "
        "(algorithms.llm.generation.prompting.PROMPTS), or null for the generic ReAct prompt"
    )


def system_prompt_text(name: str | None, one_shot: bool = WITH_ONE_SHOT) -> str | None:
    """The system prompt registered as `name` (None: None, the generic prompt of initial_messages)."""
    name = prompt_name(name)
    if name is None:
        return None
    import importlib

    module, _, function = PROMPTS[name].partition(":")
    return getattr(importlib.import_module(module), function)(one_shot)


def initial_messages(observation: str, one_shot: bool = WITH_ONE_SHOT, system_prompt: str | None = None) -> list[dict[str, str]]:
    """[system, first observation]; `system_prompt` (an env's own, e.g. AppWorld's) replaces the generic one."""
    system = system_prompt if system_prompt is not None else SYSTEM_PROMPT + ("\n\n" + ONE_SHOT_EXAMPLE if one_shot else "")
    return [{"role": "system", "content": system}, {"role": "user", "content": observation}]


def prompt_chars(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages)


def truncate_messages(
    messages: list[dict[str, str]], max_chars: int = 20_000, keep_recent: int = 2, obs_chars: int = 2_000
) -> list[dict[str, str]]:
    """A copy of `messages` no longer than `max_chars` content characters where at all possible."""
    out = [dict(m) for m in messages]
    if prompt_chars(out) <= max_chars:
        return out
    head = 2 if len(out) >= 2 and out[0]["role"] == "system" else 1  # system + task stay untouched
    env_idx = [i for i in range(head, len(out)) if out[i]["role"] == "user"]
    for i in env_idx[: max(len(env_idx) - keep_recent, 0)]:  # stage 1
        out[i]["content"] = BLANKED
    if prompt_chars(out) <= max_chars:
        return out
    half = obs_chars // 2
    for i in env_idx:  # stage 2
        text = out[i]["content"]
        if len(text) > obs_chars:
            out[i]["content"] = f"{text[:half]}\n[... {len(text) - obs_chars} characters cut ...]\n{text[-half:]}"
    while prompt_chars(out) > max_chars and len(out) > head + 1:  # stage 3: drop oldest (assistant, user) block
        del out[head : head + 2]
    return out
