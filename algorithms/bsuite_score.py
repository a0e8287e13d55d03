"""bsuite scores of runs on bsuite envs, computed by bsuite's own loaders and analysis.

A run on a bsuite env (envs/bsuite.py, `BSuiteEnv(log_dir=...)`) leaves bsuite's CSV log in its
log dir, one file per bsuite_id. This module finds those directories, loads them with
`bsuite.logging.csv_load.load_bsuite` and scores them with
`bsuite.experiments.summary_analysis.bsuite_score`, i.e. each experiment's own
`analysis.score` (Osband et al. 2020, "Behaviour Suite for Reinforcement Learning", Section 2 and
the experiments' analysis files): umbrella_length and umbrella_distract, the share of settings
whose regret per episode at the last logged episode is below 0.5; discounting_chain,
1 - 10 (1.1 - mean return), clipped to [0, 1]; memory, the share of settings with regret ratio
below its threshold. Nothing here re-computes a score.

Runs are scored one by one (`by_run=True`, bsuite's `agent_name` is the run's log dir) or pooled
(the rows of all dirs as one agent, e.g. the seeds of one algorithm: each analysis averages the
regret of every row at the same episode). A partially finished run is scored at its last logged
episode, as bsuite does; `finished` says whether every bsuite_id reached the experiment's episodes.

bsuite's loader and analysis score any table they are given (a garbage file ends in a traceback, a header-only
file in no score, an infinite regret in a perfect one), so every log is checked first (`check_log`), one line
for the first bad one: readable as CSV, named for a setting of a supported experiment, with the columns bsuite's
logger writes for that setting, at least one row, finite numbers, and the setting's episode length.

    python -m algorithms.bsuite_score runs/mc/ [--by-run] [--json scores.json]
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.common import cli
from algorithms.common.errors import VcbmGymError

CSV_GLOB = "bsuite_id_-_*.csv"  # bsuite.logging.csv_logging: BSUITE_PREFIX + id + ".csv"


def find_log_dirs(roots: Iterable[str | Path]) -> list[Path]:
    """Every directory at or under `roots` that holds bsuite CSV logs, sorted; VcbmGymError if none."""
    found: set[Path] = set()
    for root in map(Path, roots):
        if not root.is_dir():
            raise VcbmGymError(f"{str(root)!r} is not a directory: expected a run's log dir or a folder of them")
        found.update(path.parent for path in root.rglob(CSV_GLOB) if path.is_file())
    if not found:
        shown = ", ".join(repr(str(root)) for root in roots)
        raise VcbmGymError(f"no bsuite logs ({CSV_GLOB}) under {shown}: expected runs on a bsuite env with log_dir set")
    return sorted(found)


def load_results(log_dirs: Sequence[str | Path]) -> tuple[Any, list[str]]:
    """bsuite's `csv_load.load_bsuite`: (one DataFrame of all rows, with bsuite's sweep metadata; ['agent_name']).
    Every log is checked first (`check_log`): bsuite's loader and analysis take any table."""
    from bsuite.logging import csv_load

    for log_dir in log_dirs:
        for path in sorted(Path(log_dir).glob(CSV_GLOB)):
            check_log(path)
    return csv_load.load_bsuite([str(path) for path in log_dirs])


@functools.cache
def _expected_log(bsuite_id: str) -> tuple[tuple[str, ...], int]:
    """(the columns bsuite's logger writes for `bsuite_id`, its episode length), from the setting's own env."""
    from envs.bsuite import BSuiteEnv

    env = BSuiteEnv(bsuite_id)
    return env.log_columns, env.episode_steps


def check_log(path: Path) -> None:
    """VcbmGymError (one line) unless `path` is a bsuite log bsuite's analysis can score as the setting its name
    says: bsuite's columns for that setting, at least one row, finite numbers, episodes counted from 1 and rising,
    and the setting's episode length (a renamed log of another setting has other columns or another length)."""
    import pandas as pd

    bsuite_id, frame = _read_log(path)
    columns, episode_steps = _expected_log(bsuite_id)
    where = f"bsuite log {str(path)!r}"
    if sorted(frame.columns) != sorted(columns):
        raise VcbmGymError(
            f"{where} has columns {list(frame.columns)}: expected bsuite's columns for {bsuite_id}, {list(columns)} "
            "(a log of another experiment renamed, or not a bsuite log)"
        )
    if frame.empty:
        raise VcbmGymError(f"{where} holds its header only: expected at least one logged episode")
    values = frame.apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    bad_rows, bad_columns = np.nonzero(~np.isfinite(values))
    if len(bad_rows):
        row, column = bad_rows[0], frame.columns[bad_columns[0]]
        raise VcbmGymError(f"{where}: {column}={frame[column].iloc[row]} in data row {row + 1}: expected a finite number")
    _check_episodes(where, frame, bsuite_id, episode_steps)


def _read_log(path: Path) -> tuple[str, Any]:
    """(the bsuite_id `path` is named for, as bsuite's csv_load reads the name; the table pandas reads)."""
    import pandas as pd
    from bsuite.logging import csv_logging

    from envs.bsuite import SEPARATOR, BSuiteIdError, parse_bsuite_id

    bsuite_id = path.name[len(csv_logging.BSUITE_PREFIX) : -len(".csv")].replace(csv_logging.SAFE_SEPARATOR, SEPARATOR)
    try:
        parse_bsuite_id(bsuite_id)
        return bsuite_id, pd.read_csv(path)
    except BSuiteIdError as exc:
        raise VcbmGymError(f"bsuite log {str(path)!r} is named for no known setting: {exc}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # pandas' ParserError and EmptyDataError: ValueErrors
        first = str(exc).strip().splitlines()
        raise VcbmGymError(
            f"bsuite log {str(path)!r} cannot be read as a CSV table ({type(exc).__name__}: {first[0] if first else ''}); "
            "expected bsuite's CSV log of a run"
        ) from None


def _check_episodes(where: str, frame: Any, bsuite_id: str, episode_steps: int) -> None:
    episodes = frame["episode"].to_numpy(dtype=float)
    if episodes[0] < 1 or np.any(np.diff(episodes) <= 0) or np.any(episodes != np.round(episodes)):
        raise VcbmGymError(f"{where}: episode column {episodes.tolist()[:8]}: expected whole episode counts from 1, rising")
    lengths = sorted(set(frame["episode_len"].tolist()))
    if lengths != [episode_steps]:
        raise VcbmGymError(
            f"{where}: episode_len {lengths}: expected {bsuite_id}'s {episode_steps} steps per episode "
            "(a log of another setting, renamed?)"
        )


def score_table(log_dirs: Sequence[str | Path], by_run: bool = False) -> list[dict[str, Any]]:
    """bsuite's `summary_analysis.bsuite_score` of the logs in `log_dirs`, as records: experiment, score,
    finished, and with `by_run` the run (its log dir)."""
    from bsuite.experiments import summary_analysis

    frame, sweep_vars = load_results(log_dirs)
    table = summary_analysis.bsuite_score(frame, sweep_vars if by_run else None)
    records = []
    for row in table.to_dict("records"):
        record = {"experiment": str(row["bsuite_env"]), "score": float(row["score"]), "finished": bool(row["finished"])}
        if by_run:
            record = {"run": str(row["agent_name"]), **record}
        records.append(record)
    return records


def experiment_score(log_dirs: Sequence[str | Path], experiment: str) -> float:
    """bsuite's score of `experiment` over the pooled logs of `log_dirs` (ValueError if they hold none of it)."""
    scores = {record["experiment"]: record["score"] for record in score_table(log_dirs)}
    if experiment not in scores:
        raise ValueError(f"no {experiment} logs in {[str(path) for path in log_dirs]}; found: {', '.join(scores) or 'none'}")
    return scores[experiment]


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m algorithms.bsuite_score", description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", help="run log dirs, or folders holding them (searched recursively)")
    parser.add_argument("--by-run", action="store_true", help="score each log dir on its own (default: pool them)")
    parser.add_argument("--json", default=None, help="also write the scores to this JSON file")
    return parser


def run(argv: list[str]) -> list[dict[str, Any]]:
    args = build_parser().parse_args(argv)
    log_dirs = find_log_dirs(args.roots)
    if args.json is not None:
        if Path(args.json).is_dir():
            raise VcbmGymError(f"--json {args.json!r} is a directory: expected a file path")
        cli.output_dir(Path(args.json).parent, "--json")
    records = score_table(log_dirs, by_run=args.by_run)
    for record in records:
        run_name = f"{record['run']}  " if args.by_run else ""
        status = "finished" if record["finished"] else "unfinished (scored at its last logged episode)"
        print(f"{run_name}{record['experiment']}: {record['score']:.3f}  {status}")
    if args.json is not None:
        cli.atomic_write_json(args.json, {"log_dirs": [str(path) for path in log_dirs], "scores": records})
    return records


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
