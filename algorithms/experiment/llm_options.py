"""The LLM benchmarks' command line: the options each takes after its selection, their checks, and the time budget
`--estimate` prints (runs packed longest first on the workers)."""

from __future__ import annotations

import argparse
from typing import Sequence

from algorithms.common import cli
from algorithms.common.errors import VcbmGymError


def makespan(costs: Sequence[float], workers: int) -> float:
    """Wall time of runs of these costs on `workers` processes, each run started when a worker frees (longest first)."""
    free = [0.0] * workers
    for cost in sorted(costs, reverse=True):
        free[free.index(min(free))] += cost
    return max(free)


def estimate_total(costs: Sequence[float], workers: int) -> str:
    """A budget estimate's last line: the runs' minutes in all, and the wall time on `workers` processes."""
    return f"total {sum(costs) / 60:.1f} run-minutes on {workers} workers: about {makespan(costs, workers) / 60:.0f} min"


def add_run_arguments(parser: argparse.ArgumentParser, out: str, window: int, window_help: str, hyperparams: bool) -> None:
    """The options every LLM benchmark takes after its selection: [--hyperparams], --window, --workers, --out, --estimate."""
    if hyperparams:
        parser.add_argument("--hyperparams", nargs="*", default=[], metavar="KEY=VALUE", help="more train overrides, every run")
    parser.add_argument("--window", type=int, default=window, help=window_help)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=out)
    parser.add_argument("--estimate", action="store_true", help="print the runs' time budget and exit")


def check_choices(flag: str, given: Sequence[str], allowed: Sequence[str]) -> None:
    """Every value given to `flag` one of `allowed`, else one line naming it."""
    for value in given:
        if value not in allowed:
            raise VcbmGymError(f"{flag} {value!r}: expected some of {', '.join(allowed)}")


def check_counts(args: argparse.Namespace) -> None:
    """--workers, --window, --seeds and --iterations (a budget holds at least one window); None: the default's."""
    cli.check_int(args.workers, "--workers", 1)
    cli.check_int(args.window, "--window", 1)
    if args.seeds is not None:
        cli.check_int(args.seeds, "--seeds", 1)
    if args.iterations is not None:
        cli.check_int(args.iterations, "--iterations", args.window)
