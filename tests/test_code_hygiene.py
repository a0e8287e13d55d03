"""The code says why, not when, and each library file stays small enough to read at once.

History narration (a review round, an issue number, a commit hash, what the code was before) ages the moment it is
written and tells a reader nothing about the code in front of them; git keeps the history. Library code
(algorithms/, envs/, vcbm_gym/), the zoo's YAML and the test names carry none. A library file longer than
`MAX_LIBRARY_LINES` is split by concern, except a pure data table listed in `LONG_DATA_TABLES` with its reason."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("algorithms", "envs", "vcbm_gym")
MAX_LIBRARY_LINES = 500
# path (from the repository root) -> why it may be longer: only a file whose excess is a table of data
LONG_DATA_TABLES: dict[str, str] = {}  # none: the contract's info-key table lives in vcbm_gym/info_keys.py

# Phrases that narrate history rather than explain. A capitalised word before "issue N" cites another project's
# tracker (e.g. "Gymnasium issue #94"), which is a reference, not history.
HISTORY = re.compile(
    r"\b(?:pilot|fault|review) rounds?\b"
    r"|\bround \d+\b"
    r"|\bissues? ?#?\d+"
    r"|\b(?:PR|pull request) ?#\d+"
    r"|\b(?:previously|formerly)\b"
    r"|\bbefore (?:the|this) (?:fix|change|refactor|rewrite|split|move)\b"
    r"|\bcommit [0-9a-f]{7,40}\b"
    r"|\b[0-9a-f]{7,40}[\^~]",
    re.IGNORECASE,
)
EXTERNAL_CITATION = re.compile(r"\b[A-Z][\w.-]*\s+$")
# the same in a snake_case name: test_fault_round3, test_issue_36_...
HISTORY_IN_NAME = re.compile(r"(?:pilot|fault|review)_?rounds?|(?:^|_)round_?\d|(?:^|_)issues?_?\d|(?:^|_)pr_?\d")


def _library_files() -> list[Path]:
    return sorted(path for top in LIBRARY for path in (REPO / top).rglob("*.py") if "__pycache__" not in path.parts)


def _zoo_files() -> list[Path]:
    return sorted(path for pattern in ("*.yml", "*.yaml") for path in (REPO / "zoo_configs").rglob(pattern))


def history_narration(text: str) -> list[tuple[int, str]]:
    """(line number, matched phrase) for each piece of history narration in `text`."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in HISTORY.finditer(line):
            is_issue = match.group().lower().startswith("issue")
            if is_issue and EXTERNAL_CITATION.search(line[: match.start()]):
                continue
            found.append((number, match.group()))
    return found


def _test_names() -> list[str]:
    names = []
    for path in sorted((REPO / "tests").glob("*.py")):
        names.append(path.name)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(f"{path.name}::{node.name}")
    return names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"""Fault round 3 (issue 36, defects 1-11): bad logs."""', ["Fault round", "issue 36"]),
        ("# the hash it had before RunSpec (commit 5b14e0a)", ["commit 5b14e0a"]),
        ("# as at 5b14e0a^ and 0123abcd~2", ["5b14e0a^", "0123abcd~"]),
        ("x = 1  # issue16: was a TypeError before the fix", ["issue16", "before the fix"]),
        ("# measured in the pilot round 2; previously 0.3", ["pilot round", "previously"]),
        ("# see PR #12", ["PR #12"]),
    ],
)
def test_history_narration_is_found(text, expected):
    assert [phrase for _, phrase in history_narration(text)] == expected


@pytest.mark.parametrize(
    "text",
    [
        "its maintainers point to pickling the env, Gymnasium issue #94",
        "one batched generation per round, at most `max_turns` rounds",
        "_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected",
        '"bwrap": "4b9bd2a03bfadf2904d42f9652f6799b6bd2e3cb1d8ccff37d2d836b39f533b4",',
        "states whose projection was seen just before a controlled change",
        "A pilot of `pilot` permutations estimates the variance; the state_dict round-trips",
        "# tuned: docs/notes/2026-12-04-bsuite-baselines-tuning.md, on umbrella_length only (seeds 100-101)",
    ],
)
def test_explanations_and_citations_are_not_taken_for_history(text):
    assert history_narration(text) == []


def test_library_code_and_zoo_yaml_narrate_no_history():
    found = [
        f"{path.relative_to(REPO)}:{number}: {phrase!r}"
        for path in [*_library_files(), *_zoo_files()]
        for number, phrase in history_narration(path.read_text())
    ]
    assert not found, "say why, not when:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("name", "narrates"),
    [
        ("test_fault_round3.py", True),
        ("test_issue_36_acceptance", True),
        ("test_pr12_regression", True),
        ("test_state_round_trip_continues_identically", False),
        ("test_float32_loss_equals_float64_to_float32_rounding", False),
        ("test_credit_rule_options.py", False),
    ],
)
def test_history_in_a_test_name_is_found(name, narrates):
    assert bool(HISTORY_IN_NAME.search(name.lower())) is narrates


def test_test_files_and_functions_are_named_by_what_they_test():
    found = [name for name in _test_names() if HISTORY_IN_NAME.search(name.lower())]
    assert not found, f"name a test by the unit and behaviour it tests: {found}"


def test_no_library_file_is_longer_than_the_limit():
    lengths = {str(path.relative_to(REPO)): len(path.read_text().splitlines()) for path in _library_files()}
    assert set(LONG_DATA_TABLES) <= set(lengths), "an allowed data table no longer exists: drop it from the list"
    too_long = {path: n for path, n in lengths.items() if n > MAX_LIBRARY_LINES and path not in LONG_DATA_TABLES}
    assert not too_long, f"split by concern (at most {MAX_LIBRARY_LINES} lines a library file): {too_long}"
