"""SEPO's ratings are read: the parser on hand-written answers (the variants a model writes, and text with no split),
the two-role warm-start's rating data, the two-role benchmark's report of the parse rate, and the benchmark's own SEPO
run, whose ratings must parse."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from vcbm_gym.credit.ccpo import CREDIT_SPLITS, parse_credit_split

# imported by its module name (benchmarks/ on sys.path), as the benchmarks import each other
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


# --- the parser --------------------------------------------------------------------------------------------
def test_every_split_survives_the_tiny_tokenizers_round_trip():
    from algorithms.llm.model.tiny import build_tiny_tokenizer
    from algorithms.llm.two_role.warm_start import rating_text

    tokenizer = build_tiny_tokenizer(())
    for thinker, solver in CREDIT_SPLITS:
        for text in (f"({thinker}, {solver})", rating_text((thinker, solver))):
            decoded = tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"])
            assert decoded != text  # the word-level tokenizer decodes with a space between tokens: "( 0 . 7 )"
            assert parse_credit_split(decoded) == (thinker, solver, True), decoded


@pytest.mark.parametrize(
    ("text", "split"),
    [
        ("( 0 . 7 )", (0.7, 0.3)),  # the Thinker's share alone, as the rating request asks
        ("(0.3)", (0.3, 0.7)),
        ("[ 80 % ]", (0.8, 0.2)),
        ("( 0 . 7 , 0 . 3 )", (0.7, 0.3)),
        ("(0.7, 0.3)", (0.7, 0.3)),
        ("[ 0 . 2 ; 0 . 8 ]", (0.2, 0.8)),
        ("split : 0 . 9 / 0 . 1", (0.9, 0.1)),
        ("( 40 % , 60 % )", (0.4, 0.6)),
        ("( . 6 , . 4 )", (0.6, 0.4)),
        ("Action : ( 0 . 5 , 0 . 5 )", (0.5, 0.5)),
        ("( 0 . 9 , 0 . 1 ) then ( 0 . 1 , 0 . 9 )", (0.1, 0.9)),  # the last pair is the rating
        ("( 0 . 9 , 0 . 1 ) then ( 0 . 2 )", (0.2, 0.8)),
    ],
)
def test_the_parser_reads_the_variants_a_model_writes(text, split):
    assert parse_credit_split(text) == (*split, True)


@pytest.mark.parametrize(
    "text",
    [
        "Action : Dunmore skip ()",  # what the single-role warm-start answers to the rating request
        "Action : crystal standard ()",
        "()",
        "( 0 . 7 5 )",  # spaces inside the digits after the point: no number
        "( 0 . 7 5 , 0 . 2 5 )",
        "( 0 . 75 )",  # off the grid
        "( 0 )",  # (0, 1) is none of the nine
        "( 7 )",  # a bare number above 1 is no share
        "( 0 . 75 , 0 . 25 )",  # off the grid
        "( 0 . 7 , 0 . 4 )",  # does not sum to 1
        "( 0 . 9 , 0 . 1 , 0 . 8",  # a third number and no closing bracket
        "( 7 , 3 )",
        "0 . 7 , 0 . 3",  # neither bracketed nor labelled
        "",
    ],
)
def test_text_with_no_split_on_the_grid_falls_back_to_an_even_split(text):
    assert parse_credit_split(text) == (0.5, 0.5, False)


# --- the two-role warm-start's data ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def examples():
    from algorithms.llm.two_role.warm_start import RATING_STAGE, two_role_examples

    return two_role_examples(RATING_STAGE)


def test_the_rating_turns_teach_the_splits_format_and_nothing_about_the_credit(examples):
    from algorithms.llm.two_role.trainer import RATING_REQUEST

    ratings = [e for e in examples if len(e["prompt"]) == 4]
    roles = [e for e in examples if len(e["prompt"]) == 2]
    assert len(ratings) == len(roles) == len(examples) / 2
    request_start = RATING_REQUEST.split("{note}")[0]
    thinker_shares = collections.defaultdict(list)
    for rating in ratings:
        system, role_prompt, own, ask = rating["prompt"]
        # the conversation rate_splits builds: the role's turn, then the request quoting the note and the answer
        assert {"prompt": [system, role_prompt], "completion": [own]} in roles
        assert ask["role"] == "user" and ask["content"].startswith(request_start)
        split = parse_credit_split(rating["completion"][0]["content"])
        assert split.parsed
        note, answer = (part.split('"')[0] for part in ask["content"].split(': "')[1:3])
        thinker_shares[note.split()[-1] == answer.split()[-1]].append(split.thinker)  # the two agree or not
    counts = collections.Counter(parse_credit_split(r["completion"][0]["content"])[:2] for r in ratings)
    n = len(ratings)
    assert set(counts) == set(CREDIT_SPLITS)
    # each split within 4 binomial standard deviations of n / 9: drawn uniformly
    assert all(abs(c - n / 9) <= 4 * np.sqrt(n / 9 * 8 / 9) for c in counts.values()), counts
    # the Thinker's share is the same whether the Solver followed the note or not (within 0.15 of the uniform 0.5)
    assert all(abs(np.mean(shares) - 0.5) < 0.15 for shares in thinker_shares.values()), thinker_shares.keys()


def test_the_role_turns_keep_the_warm_starts_format_with_coin_flip_decisions(examples):
    decisions = collections.Counter()
    for e in (e for e in examples if len(e["prompt"]) == 2):
        answer = e["completion"][0]["content"]
        assert answer.startswith("Action: ") and answer.endswith(("repair()", "skip()")), answer
        decisions[answer.split()[-1]] += 1
    n = sum(decisions.values())
    assert abs(decisions["repair()"] - n / 2) <= 4 * np.sqrt(n / 4), decisions


def test_the_single_role_warm_start_data_hold_no_two_role_turn():
    from algorithms.llm.model.warm_start import WarmStartConfig, warm_start_examples

    prompts = [m["content"] for e in warm_start_examples(WarmStartConfig()) for m in e["prompt"]]
    assert not any(p.startswith("Role: ") or "credit" in p for p in prompts)


# --- the benchmark's report --------------------------------------------------------------------------------
def _history(iterations: int, rate: float | None) -> list[dict]:
    step = {"task_goal_completion": 0.5, "solo_task_goal_completion": 0.5, "thinker_help": 0.0, "mean_return": 0.0}
    step["iteration_time_s"] = 1.0
    if rate is not None:
        step.update(split_parse_rate=rate, thinker_split_parse_rate=rate, solver_split_parse_rate=rate)
    return [dict(step) for _ in range(iterations)]


def test_the_benchmarks_report_gives_each_methods_parse_rate():
    import ccpo_learning

    by_method = {"grpo": [_history(4, None)] * 2, "sepo": [_history(4, 0.75), _history(4, 0.25)]}
    results = ccpo_learning.summarise(by_method, window=2)
    sepo, grpo = results["methods"]["sepo"], results["methods"]["grpo"]
    assert sepo["split_parse_rate"] == sepo["thinker_split_parse_rate"] == pytest.approx(0.5)
    assert grpo["split_parse_rate"] is None and "split_parse_rate" not in grpo["curves"]
    rows = {line.split(" | ")[0]: line for line in ccpo_learning.table(results, 2, 4).splitlines() if line.startswith("| ")}
    assert "| 0.50 / 0.50 / 0.50 |" in rows["| sepo"] and "| not asked |" in rows["| grpo"]
    json.dumps(results, allow_nan=False)  # strict JSON: no NaN for the method that asks no rating


# --- the benchmark's own run -------------------------------------------------------------------------------
def test_the_benchmarks_sepo_run_reads_most_ratings(tmp_path):
    """One iteration of the two-role benchmark's SEPO run (its command line, model and settings, seed 0): the ratings
    its model writes are read. About 15 s on a CPU once the warm-started models are cached; building the two-role one
    (its first use on a machine) takes a few CPU-minutes more."""
    import ccpo_learning

    from algorithms.train import run

    run(ccpo_learning.run_argv("sepo", 0, 1, tmp_path / "run", []))
    (step,) = json.loads((tmp_path / "run" / "history.json").read_text())
    assert step["split_parse_rate"] >= 0.5, step
    assert step["thinker_split_parse_rate"] >= 0.5 and step["solver_split_parse_rate"] >= 0.5, step
