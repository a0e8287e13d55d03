"""`python -m algorithms.plot RUN_DIRS... --metric TAG --out FILE.png`: learning curves across seeds, per method.

Reads the TensorBoard event files of every run found under RUN_DIRS (a run is a directory holding the
config.yml that `algorithms.train` writes; each given directory may be a run or hold runs at any depth:
a `compare --out`, a `tune --out`, a benchmark's output) with TensorBoard's own `EventAccumulator`, groups
the runs by method (the algo in config.yml, `ALGO+RULE` for a run whose credit rule is not its algo's
default: the arm's `method_label`; or, with `--group-by parent`, the name of the run's parent directory) and
draws per method the mean across seeds and its 95% bootstrap CI (percentile, seeds resampled,
scipy.stats.bootstrap) as a band.
Writes FILE.png, FILE.svg and FILE.json (the curves drawn, the runs and the settings they came from).

`--metric` is a TensorBoard scalar tag, or one of the names that mean the same thing in every arm, each arm's
tag for it being its `metric_tags`: `correct` (tabular: train/correct_moving_average, SB3:
rollout/correct_moving_average, LLM: loop/task_goal_completion) and `return` (train/episode_return,
rollout/ep_rew_mean, loop/mean_return). The x axis is the arm's budget unit: episodes for the tabular and SB3
arms (SB3 logs against timesteps; its `rollout/episodes` scalar, logged at the same steps, gives the episode
count) and iterations for the LLM arm.

Runs end at different points (a tabular or SB3 run stops when it converges): each run is read as a step
function of its logged values, and after its last logged point it holds its last value (a converged run
holds the rate at which it converged), so that every seed counts at every point of the x axis.

Every event file is read first with TensorBoard's own record reader, which checks each record's masked
CRC-32C of its length and of its data: a damaged file (a flipped byte, a file cut inside a record) is
refused with one line naming the file and the byte at which its first bad record starts, since
`EventAccumulator` would silently stop there and the run would end early in the across-seed curve.
With `--allow-truncated` the records before the damage are used, and a warning line says so.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from algorithms.common import cli
from algorithms.common.errors import VcbmGymError
from algorithms.common.spec import Arm
from algorithms.experiment.results import save_figure
from algorithms.registry import ALGOS, get_arm

METRICS = ("correct", "return")  # names of one metric in every arm (Arm.metric_tags)
UNKNOWN_ARM_X_LABEL = "step"
SB3_EPISODES_TAG = "rollout/episodes"
GROUP_BY = ("algo", "parent")
DEFAULT_POINTS = 200


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Every run directory (one holding config.yml) at or under each path, in a stable order."""
    runs: list[Path] = []
    for given in paths:
        path = Path(given)
        if not path.is_dir():
            raise VcbmGymError(
                f"run dir {str(path)!r} {'is not a directory' if path.exists() else 'does not exist'}: "
                "expected a run's log dir or a directory holding runs"
            )
        found = sorted({p.parent for p in path.rglob("config.yml")} | ({path} if (path / "config.yml").is_file() else set()))
        # a run's own subdirectories (checkpoints, SB3's event dirs) are part of it, not runs of their own
        found = [p for p in found if not any(q != p and q in p.parents for q in found)]
        if not found:
            raise VcbmGymError(
                f"run dir {str(path)!r} holds no run (no config.yml at any depth): expected log dirs "
                "written by algorithms.train, algorithms.compare or algorithms.tune"
            )
        runs.extend(p for p in found if p not in runs)
    return runs


def _record(run_dir: Path) -> dict[str, Any]:
    from algorithms.common.log_dir import read_record

    record = read_record(run_dir)
    if record is None:
        raise VcbmGymError(
            f"{str(run_dir / 'config.yml')!r} is not the config.yml of a run: expected one written by algorithms.train"
        )
    return record


def arm_of(record: dict[str, Any]) -> Arm | None:
    """The arm that trained the run, or None for an algo this checkout does not know."""
    algo = str(record.get("algo"))
    return get_arm(algo) if algo in ALGOS else None


def method_label(run_dir: Path, record: dict[str, Any], group_by: str = "algo") -> str:
    """The run's method: its algo, `ALGO+RULE` where its credit rule is not the algo's default (the arm's
    method_label); or, with group_by "parent", its parent directory's name."""
    if group_by == "parent":
        return run_dir.parent.name
    arm = arm_of(record)
    if arm is None:
        return str(record["algo"])
    return arm.method_label(str(record["algo"]), (record.get("hyperparams") or {}).get("credit"))


ALLOW_TRUNCATED = "--allow-truncated"
RECORD_FRAMING_BYTES = 16  # TFRecord: 8-byte length, its 4-byte masked CRC, the data, the data's 4-byte masked CRC


@dataclass(frozen=True)
class EventFileDamage:
    """The first record of an event file that TensorBoard's reader refuses: where it starts, and what is before it."""

    path: Path
    offset: int  # the byte at which the bad record starts (= the bytes of good records before it)
    records_before: int
    reason: str  # TensorBoard's reader's words, e.g. "failed event crc32 check"

    def describe(self) -> str:
        kind = "truncated" if "truncated" in self.reason else "corrupt"
        return f"{self.path}: {kind} record at byte {self.offset} (record {self.records_before + 1}: {self.reason})"

    def as_dict(self) -> dict[str, Any]:
        return {"file": str(self.path), "offset": self.offset, "records_kept": self.records_before, "reason": self.reason}


def check_event_file(path: Path) -> EventFileDamage | None:
    """Read every record of a TensorBoard event file with TensorBoard's own record reader (the one
    `EventAccumulator` uses without TensorFlow), which checks the masked CRC-32C of each record's length
    and data; the first record it refuses, or None for an intact file. `EventAccumulator` itself takes
    such a record for the end of the file, which is why this check comes first."""
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    reader = PyRecordReader_New(str(path))
    offset = records = 0
    try:
        while True:
            try:
                reader.GetNext()
            except errors.OutOfRangeError:  # the end of the file, at a record boundary
                return None
            except errors.DataLossError as exc:
                reason = str(exc.message).removeprefix(str(path)).strip().removeprefix("has ")
                return EventFileDamage(path, offset, records, reason)
            offset += RECORD_FRAMING_BYTES + len(reader.record())
            records += 1
    finally:
        reader.file_handle.close()


def _scalars_of_file(path: Path, merged: dict[str, dict[int, float]]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    accumulator = EventAccumulator(str(path), size_guidance={SCALARS: 0})
    accumulator.Reload()
    for tag in accumulator.Tags()["scalars"]:
        points = merged.setdefault(tag, {})
        for event in accumulator.Scalars(tag):
            points[int(event.step)] = float(event.value)  # a step logged twice (a restart) keeps the later value


def read_scalars(
    run_dir: Path, allow_truncated: bool = False, damaged: list[EventFileDamage] | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """tag -> (steps, values) over every event file of the run (all points: no reservoir sampling).

    A damaged event file (check_event_file) is refused (VcbmGymError, one line naming it and the byte);
    with `allow_truncated` its records before the damage are read instead, a warning line goes to stderr
    and the damage is appended to `damaged`."""
    merged: dict[str, dict[int, float]] = {}
    for path in sorted(run_dir.rglob("events.out.tfevents.*")):
        damage = check_event_file(path)
        if damage is None:
            _scalars_of_file(path, merged)
            continue
        if not allow_truncated:
            raise VcbmGymError(
                f"{damage.describe()}: refusing a damaged event file (read up to it, the run would silently end "
                f"there); pass {ALLOW_TRUNCATED} to use the {damage.records_before} records before it"
            )
        print(
            f"warning: {damage.describe()}: using the {damage.records_before} records ({damage.offset} bytes) "
            f"before it ({ALLOW_TRUNCATED}); the run's curve ends there",
            file=sys.stderr,
        )
        if damaged is not None:
            damaged.append(damage)
        with tempfile.TemporaryDirectory(prefix="vcbm-plot-") as tmp:
            intact = Path(tmp) / path.name  # the name keeps "tfevents": EventAccumulator reads it as one file
            with open(path, "rb") as src:
                intact.write_bytes(src.read(damage.offset))
            _scalars_of_file(intact, merged)
    return {tag: (np.array(sorted(p), dtype=float), np.array([p[k] for k in sorted(p)])) for tag, p in merged.items()}


def run_curve(
    run_dir: Path,
    record: dict[str, Any],
    metric: str,
    allow_truncated: bool = False,
    damaged: list[EventFileDamage] | None = None,
) -> tuple[np.ndarray, np.ndarray, str, str]:
    """(x, y, the tag read, the x unit) of one run (`allow_truncated`, `damaged`: as in read_scalars)."""
    arm = arm_of(record)
    if metric in METRICS:
        if arm is None:
            raise VcbmGymError(
                f"--metric {metric!r}: run {str(run_dir)!r} (algo {record.get('algo')!r}) is of no known "
                f"arm; expected a TensorBoard tag instead"
            )
        tag = arm.metric_tags[metric]
    else:
        tag = metric
    scalars = read_scalars(run_dir, allow_truncated, damaged)
    if tag not in scalars or not len(scalars[tag][0]):
        known = ", ".join(sorted(scalars)) or "none"
        raise VcbmGymError(f"--metric {metric!r}: run {str(run_dir)!r} logged no scalar {tag!r}; expected one of: {known}")
    steps, values = scalars[tag]
    if arm is not None and arm.name == "sb3":  # logged against timesteps
        if SB3_EPISODES_TAG not in scalars:
            raise VcbmGymError(
                f"run {str(run_dir)!r} logged no {SB3_EPISODES_TAG!r}: expected an SB3 run of "
                "algorithms.train (its x axis is episodes)"
            )
        episode_steps, episodes = scalars[SB3_EPISODES_TAG]
        steps = np.interp(steps, episode_steps, episodes)  # logged at the same steps: exact there
    return steps, values, tag, UNKNOWN_ARM_X_LABEL if arm is None else arm.budget_unit


def hold_on_grid(x: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The step function of (x, y) at each grid point: the last value logged at or before it (the last value
    after the run ended; the first before it began)."""
    index = np.searchsorted(x, grid, side="right") - 1
    return y[np.clip(index, 0, len(y) - 1)]


def learning_curves(
    groups: dict[str, list[Path]], metric: str, points: int = DEFAULT_POINTS, allow_truncated: bool = False
) -> dict[str, Any]:
    """Per method: the grid, the mean across its runs and the 95% bootstrap CI of that mean; `damaged_event_files`
    lists the event files read only up to their damage (with `allow_truncated`; without it a damaged file is refused)."""
    from algorithms.experiment.stats import bootstrap_description, mean_ci_curves

    curves: dict[str, list[tuple[Path, np.ndarray, np.ndarray]]] = {}
    tags: dict[str, set[str]] = {}
    units: dict[str, set[str]] = {}
    damaged: list[EventFileDamage] = []
    for label, run_dirs in groups.items():
        for run_dir in run_dirs:
            x, y, tag, unit = run_curve(Path(run_dir), _record(Path(run_dir)), metric, allow_truncated, damaged)
            curves.setdefault(label, []).append((Path(run_dir), x, y))
            tags.setdefault(label, set()).add(tag)
            units.setdefault(unit, set()).add(label)
    if len(units) > 1:
        mixed = "; ".join(f"{unit} for {', '.join(sorted(labels))}" for unit, labels in units.items())
        raise VcbmGymError(f"the runs' x axes differ ({mixed}): expected runs of one arm in one figure")
    start = max(float(x[0]) for runs in curves.values() for _, x, _ in runs)
    end = max(float(x[-1]) for runs in curves.values() for _, x, _ in runs)
    grid = np.linspace(start, end, points) if end > start else np.array([start])
    out: dict[str, Any] = {
        "metric": metric,
        "x_label": next(iter(units)),
        "after_end": "a run holds its last logged value after it ended (converged runs stop early)",
        "bootstrap": {**bootstrap_description(), "n_resamples": 2_000, "statistic": "mean across runs at each point"},
        "damaged_event_files": [damage.as_dict() for damage in damaged],
        "methods": {},
    }
    for label, runs in curves.items():
        values = np.stack([hold_on_grid(x, y, grid) for _, x, y in runs])
        mean, low, high = mean_ci_curves(values)
        out["methods"][label] = {
            "tags": sorted(tags[label]),
            "runs": [str(p) for p, _, _ in runs],
            "ended_at": [float(x[-1]) for _, x, _ in runs],
            "x": grid.tolist(),
            "mean": mean.tolist(),
            "ci_low": low.tolist(),
            "ci_high": high.tolist(),
        }
    return out


def draw(data: dict[str, Any], png: Path, title: str | None = None) -> None:
    """Mean line and CI band per method; writes png and the same figure as .svg beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (label, m) in enumerate(data["methods"].items()):
        color = f"C{i}"
        n = len(m["runs"])
        ax.plot(m["x"], m["mean"], color=color, label=f"{label} ({n} run{'s' if n != 1 else ''})")
        if n > 1:
            ax.fill_between(m["x"], m["ci_low"], m["ci_high"], color=color, alpha=0.2, linewidth=0)
    tags = sorted({t for m in data["methods"].values() for t in m["tags"]})
    ax.set_xlabel(data["x_label"])
    ax.set_ylabel(data["metric"] if data["metric"] not in METRICS else f"{data['metric']} ({', '.join(tags)})")
    ax.set_title(title or f"{data['metric']}: mean and 95% bootstrap CI across runs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(
        0.01,
        -0.02,
        "Band: 95% percentile-bootstrap CI of the mean over runs. A run that ended early (e.g. converged) holds its last value.",
        fontsize=7,
        ha="left",
        va="top",
    )
    fig.tight_layout()
    save_figure(fig, png, dpi=150, bbox_inches="tight")
    save_figure(fig, png.with_suffix(".svg"), dpi=150, bbox_inches="tight")
    plt.close(fig)


def plot_learning_curves(
    groups: dict[str, list[Path]],
    metric: str,
    png: str | Path,
    title: str | None = None,
    points: int = DEFAULT_POINTS,
    settings: dict[str, Any] | None = None,
    allow_truncated: bool = False,
) -> dict[str, Any]:
    """Compute, draw and write PNG + SVG + JSON (the curves and `settings`) for runs already grouped by method
    (`allow_truncated`: read a damaged event file up to its damage instead of refusing it)."""
    png = Path(png)
    data = learning_curves(groups, metric, points, allow_truncated)
    cli.output_dir(png.parent, "--out's directory")  # created once the runs are read: a refusal leaves nothing
    draw(data, png, title)
    cli.atomic_write_json(png.with_suffix(".json"), {"settings": settings or {}, **data})
    return data


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m algorithms.plot", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run log dirs, or directories holding runs")
    parser.add_argument("--metric", default="correct", help=f"a TensorBoard tag, or one of: {', '.join(METRICS)}")
    parser.add_argument("--out", default="curves.png", help="the PNG to write (.svg and .json are written beside it)")
    parser.add_argument("--group-by", default="algo", help=f"one of: {', '.join(GROUP_BY)} (method label of a run)")
    parser.add_argument("--points", type=int, default=DEFAULT_POINTS, help="points on the x axis")
    parser.add_argument("--title", default=None)
    parser.add_argument(
        ALLOW_TRUNCATED,
        action="store_true",
        help="read a damaged event file (a record failing its CRC, or cut short) up to the damage, with a warning, "
        "instead of refusing it",
    )
    return parser


def run(argv: Sequence[str]) -> dict[str, Any]:
    args = build_parser().parse_args(list(argv))
    if args.group_by not in GROUP_BY:
        raise VcbmGymError(f"--group-by {args.group_by!r}: expected one of {', '.join(GROUP_BY)}")
    cli.check_int(args.points, "--points", 2, 100_000)
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise VcbmGymError(f"--out {args.out!r}: expected a file name ending in .png (the .svg and .json go beside it)")
    cli.check_output_dir(out.parent, "--out's directory")
    groups: dict[str, list[Path]] = {}
    for run_dir in find_runs(args.run_dirs):
        groups.setdefault(method_label(run_dir, _record(run_dir), args.group_by), []).append(run_dir)
    settings = {
        "command": [*"python -m algorithms.plot".split(), *argv],
        "run_dirs": list(args.run_dirs),
        "metric": args.metric,
        "group_by": args.group_by,
        "points": args.points,
        "allow_truncated": args.allow_truncated,
    }
    data = plot_learning_curves(groups, args.metric, out, args.title, args.points, settings, args.allow_truncated)
    for label, m in data["methods"].items():
        print(
            f"{label}: {len(m['runs'])} run(s), {', '.join(m['tags'])}; final mean {m['mean'][-1]:.4g} "
            f"[{m['ci_low'][-1]:.4g}, {m['ci_high'][-1]:.4g}] at {data['x_label']} {m['x'][-1]:,.0f}"
        )
    print(f"wrote {out}, {out.with_suffix('.svg')}, {out.with_suffix('.json')}")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
