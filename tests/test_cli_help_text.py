"""Every command's --help says whole things: its description is a whole sentence (not a docstring's first line cut
mid-sentence) and no option's help leaves a parenthesis, bracket or quote open or stops on a word that leads on."""

from __future__ import annotations

import argparse
import re

import pytest

from algorithms import compare, evaluate, plot, suite, train, tune
from algorithms.credit_reference import cli as credit_reference
from algorithms.tabular import vcbm_batch

COMMANDS = {
    "train --algo vcbm": (train.main, ["--algo", "vcbm"]),
    "train --algo ppo": (train.main, ["--algo", "ppo"]),
    "train --algo vcbm-loop": (train.main, ["--algo", "vcbm-loop"]),
    "train --algo ccpo": (train.main, ["--algo", "ccpo"]),
    "train": (train.main, []),
    "compare": (compare.main, []),
    "suite": (suite.main, []),
    "tune": (tune.main, []),
    "evaluate": (evaluate.main, []),
    "plot": (plot.main, []),
    "credit_reference": (credit_reference.main, []),
    "vcbm_batch": (vcbm_batch.main, []),
}
PAIRS = ("()", "[]", "{}")
# a text that stops on one of these words was cut before its end
LEADING_ON = {"a", "an", "the", "of", "and", "or", "to", "in", "on", "for", "with", "by", "from", "as", "at", "than"}


def _parser_behind_help(main, argv, monkeypatch) -> argparse.ArgumentParser:
    seen: list[argparse.ArgumentParser] = []
    monkeypatch.setattr(argparse.ArgumentParser, "print_help", lambda self, file=None: seen.append(self))
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0 and seen
    return seen[-1]


def text_problem(text: str) -> str | None:
    """Why `text` is not whole: an unbalanced pair or backtick, or a last word that leads on; None when whole."""
    for left, right in PAIRS:
        depth = 0
        for char in text:
            depth += (char == left) - (char == right)
            if depth < 0:
                return f"{right!r} before its {left!r}"
        if depth:
            return f"{left!r} left open"
    if text.count("`") % 2:
        return "a backtick left open"
    words = re.findall(r"[A-Za-z]+", text)
    if words and text.rstrip()[-1].isalpha() and words[-1].lower() in LEADING_ON:
        return f"ends on {words[-1]!r}"
    return None


@pytest.mark.parametrize("command", COMMANDS)
def test_help_description_is_a_whole_sentence_and_every_option_help_is_whole(command, monkeypatch):
    main, argv = COMMANDS[command]
    parser = _parser_behind_help(main, argv, monkeypatch)
    description = " ".join((parser.description or "").split())
    assert description, f"{command}: no description"
    assert text_problem(description) is None and description.endswith((".", "!", "?")), f"{command}: {description!r}"
    for action in parser._actions:
        if action.help and action.help is not argparse.SUPPRESS:
            help_text = action.help % {**vars(action), "prog": parser.prog} if "%" in action.help else action.help
            problem = text_problem(help_text)
            assert problem is None, f"{command} {'/'.join(action.option_strings) or action.dest}: {problem}: {help_text!r}"


@pytest.mark.parametrize(
    "text",
    [
        "Evaluate a policy on an AppWorld split: TGC and SGC overall and per difficulty (Table III of the",
        "data root (default $VCBM_APPWORLD_ROOT",
        "see `zoo_configs",
        "episodes per setting and",
    ],
)
def test_text_problem_catches_a_cut_text(text):
    assert text_problem(text) is not None
