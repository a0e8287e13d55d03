"""Does the LLM arm learn at the paper's noise? LOOP, VCBM-blended LOOP and TRL's GRPO, ten seeds each.

    python benchmarks/llm_learning.py --out benchmarks/results/llm_learning   # the acceptance table (see BUDGET)
    python benchmarks/llm_learning.py --settings twr-low --seeds 3 --iterations 20    # a quick look
    python benchmarks/llm_learning.py --estimate                                      # the budget, without running

Each (setting, method, seed) is one `python -m algorithms.train` run of the warm-started tiny model
(`--model tiny`, full fine-tuning) with the zoo entry of its env and algo, plus the setting's
hyperparameters (the same for every method of a setting, so that only the credit differs): the
env's reward noise (`noise_scale`: 1.0 is the paper's noise, 0 none), its turns, the rollouts per
iteration (`generation_batch_size`, 48 as in the paper, K = `num_generations` rollouts per task),
the learning rate and the iteration budget. Methods: `loop` (leave-one-out advantage on every
token, VCBM paper arXiv:2610.24032 Eq. 6), `vcbm-loop` (VCBM-blended LOOP, Eq. 12-14, the zoo
entry's rule), `trl-grpo` (TRL's GRPOTrainer objective with its sequence-level group advantage:
the external baseline), and on the workshop the ablation of the blend's parts
(vcbm_gym/credit/vcbm_blend.py, arguments beta, tau, top_k, alpha, few_bookmarks):

- `vcbm-loop/no-retrieval`: the zoo's blend with top_k = n_stations and few_bookmarks = floor, the
  paper's rule when an episode has no more bookmarks than top_k: retrieval (Eq. 13's ranking by
  similarity to the final observation) is skipped and every token weighs alpha, renormalised to 1;
- `vcbm-loop/beta0`: the zoo's retrieval with blend weight beta = 0 (Eq. 14: the LOO advantage alone).

Both are LOOP's advantage by construction on the workshop (every turn there is a bookmark, so no
token is left for the weights to favour once retrieval is off): their runs are `loop`'s bit for bit
(same seed, same advantages; seen on 2 seeds x 5 iterations, and tested), a check of the blend's
implementation, and `vcbm-loop` against them says whether retrieval with the blend does the work. Since
they can only repeat loop's runs, the default gives them 1 seed each (`ablation_seeds`), not 5;
`--methods loop vcbm-loop trl-grpo` leaves them out.

Settings (SETTINGS; `--settings` picks some, `--seeds` and `--iterations` shrink them; every run of a setting
has the same hyperparameters, so that only the credit differs):
- `twr-low`: TextWatchRepair-v0 at noise 0.25, 10 seeds, 70 iterations of 48 rollouts (K = 8), 2 epochs, lr 5e-4;
- `twr-paper`: at the paper's noise 1.0, 10 seeds, 220 iterations of the same batch at lr 2.5e-4;
- `workshop-low`: TextWatchWorkshop-v0 (8 stations, 8 bookmarks, top-k 6) at noise 0.25, 5 seeds (the
  ablation rows 1), 70 iterations of the same batch and lr 5e-4;
- `twr-noiseless` (not in the default): noise 0, 40 iterations.
TextWatchRepair runs with 2 turns (the decision, then one turn of transport): the return depends
only on the first turn's decision, and each turn more only lengthens every training sequence.
Each of a task's K rollouts draws its own outcome (the trainer's outcome seeds; `shared_outcomes` false,
the default), so the noise is independent across a group, as across the tabular arm's episodes.

BUDGET (the default must finish within 90 minutes on 2 cores; `--estimate` prints this arithmetic for any
selection). A run costs START_S (12 s: process start, imports, model load) plus its iterations times its
setting's seconds per iteration: a run's wall time after its start-up over its iterations, with torch_threads 1,
while a second run used the other core. The rates are those measured over the runs of the table at commit 94f0920
(0.58 s for TextWatchRepair at noise 0.25, 0.56 s at noise 1.0, 4.57 s for the 8-station workshop, all with 48
rollouts and 2 epochs), a slow day's, divided by what skipping TRL's old-policy pass saves
(benchmarks/llm_old_logps.py, side by side: 1.10x on TextWatchRepair, 1.09x on the workshop): 0.53 s, 0.51 s
and 4.19 s. The runs go longest first to `--workers` (2) processes, one core each:
- workshop-low: 17 runs x (12 s + 70 x 4.19 s) = 86.5 run-minutes (3,360 episodes per run);
- twr-paper: 30 runs x (12 s + 220 x 0.51 s) = 62.1 run-minutes (10,560 episodes per run);
- twr-low: 30 runs x (12 s + 70 x 0.53 s) = 24.5 run-minutes (3,360 episodes per run);
- 173 run-minutes on 2 workers: about 87 minutes, plus about a minute of resolving configs.
The tabular arm needs about 1,200 episodes at the paper's noise: 11% of a twr-paper run's budget.
The committed table (benchmarks/results/llm_learning/) is this default, run whole in one invocation at commit
078df1d: 74.2 minutes, on a faster day (0.44-0.47 s and 3.4-3.9 s per iteration).
The table at commit 94f0920 (twr-paper at 180 iterations) ran whole in one invocation in 86.7 minutes; it had been
planned at 77 minutes with the rates before it (0.48 s, 0.45 s and 4.1 s per iteration): this machine's speed
varies by 11-24% from day to day, which is why the rates above are that slow day's.

How the settings were chosen (pilots: docs/notes/2026-12-02-llm-learning-tuning.md, on seeds 100-104,
200-203 and 300-303, outside the benchmark's 0-9), before the committed 10-seed run. Two earlier 10-seed runs (of commits before
the outcome seeds) left loop at 7/10 and 3/10 seeds at 90% at noise 0.25 and 1.0, and the workshop at 2/5:
there the K rollouts of a task shared one draw of the noise, so a group's contrast between repairing and
skipping rested on one draw. With a draw per rollout (third pilot round): at noise 1.0 and lr 5e-4, vcbm-loop
reached 90% at iteration 51 in both pilots and loop rose to 0.7-0.8; at noise 0.25, lr 1e-3 (the earlier
setting) left loop at 90% in 1 of 3 pilots, lr 5e-4 in 3 of 3 (iterations 29-46; vcbm-loop 24-31), so both
noise levels take 5e-4. The workshop learnt in no pilot at the earlier 64 rollouts, 1 epoch, lr 1e-3 (4 runs,
60 iterations); with TextWatchRepair's batch (48 rollouts, K = 8, 2 epochs, lr 5e-4) vcbm-loop reached 90% in
3 of 3 pilots (iterations 32-53) and loop in 1 of 2 (49). The budgets are what 90 minutes leave at the
measured rates. The table these gave, at twr-paper's first budget of 120 iterations and lr 5e-4, left loop at 90% in 2 of
10 seeds and vcbm-loop in 4 (commit e48e6df, 73.5 minutes). The fourth pilot round then fixed twr-paper's budget
at the 200 iterations the 90 minutes leave and compared learning rates there (seeds 200-203): at 5e-4, 3 of 8 runs
reached 90% and 3 stayed near 0.5 (one decision for every brand); at 2.5e-4, 6 of 8 reached it (iterations 83-158),
so twr-paper takes 2.5e-4. Its budget was then cut to 180 iterations (every 2.5e-4 pilot that reached 90% did by
158), twr-low's to 70 (its pilots reached 90% by 46) and the ablation rows to 1 seed, because a first start of the
default ran 15% slower per iteration than the previous table had measured, which would have taken it past 90
minutes; that start was stopped after its first two runs, and no result of it was used. That table (commit 94f0920)
left loop and vcbm-loop at 90% in 5 of 10 seeds each at noise 1.0. The fifth round (seeds 300-303) found one epoch
per batch no better per second, and the 2.5e-4 setting at 90% in 6 of 8 runs by iteration 180 and 8 of 8 by 400:
limited by its budget. Skipping TRL's old-policy pass then made every iteration about 10% cheaper, and the 90
minutes leave twr-paper 220 iterations, fixed by the arithmetic above before any run at that budget.

Runs go to OUT/<setting>/<method>/seed<k>/. A run is reused when its log dir holds a finished
summary of the same resolved config (train's config hash: algo, env, seed and every hyperparameter,
as `algorithms.compare` reuses runs) made with the same warm-started model (its cache key, kept in
the run's request.json); any other run there is rerun from scratch. So an interrupted benchmark
resumes where it stopped, and never reuses a run made under other settings or another model.

Outputs in OUT (each written atomically):
- `results.json`: per setting and method, the per-iteration mean and 95% t-interval across seeds
  of the optimal-decision rate (the envs' task goal completion: the first decision was the optimal
  one; undecided episodes count as failures), return, invalid-turn rate and the share of advantage
  mass on the deciding turns; per seed, iterations to reach 90% optimal decisions (the first
  iteration at which the mean over the last `--window` iterations is >= 0.9; censored at the budget
  and flagged: a censored seed enters every statistic with the budget, a lower bound that favours
  it) and the final optimal rate (mean of the last `--window` iterations); and, per setting, for
  vcbm-loop against each other method: the probability of improvement with its percentile-bootstrap
  95% CI and the Mann-Whitney U test, on both numbers (algorithms.stats, as `algorithms.compare`).
- `results.md`: the tables; `curves.png`: the learning curves with their 95% intervals;
- `run.json`: the command, the git commit, package versions, the warm-start key, wall time, runs reused.
"""

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from algorithms.common import cli  # noqa: E402
from algorithms.common.errors import VcbmGymError  # noqa: E402
from algorithms.experiment.llm_options import add_run_arguments, check_choices, check_counts, estimate_total, makespan  # noqa: E402
from algorithms.experiment.llm_study import (  # noqa: E402
    START_S,
    TARGET,
    Job,
    Trained,
    final_rate,
    finished_history,
    grouped,
    iterations_to_target,
    mean_ci,
    method_rows,
    run_reusing,
    setting_hyperparams,
    train_argv,
    train_one,
    train_reusing,
    write_outputs,
)

__all__ = ["START_S", "TARGET", "Job", "check_choices", "check_counts", "estimate_total", "final_rate", "finished_history",
           "grouped", "iterations_to_target", "makespan", "mean_ci", "run_reusing", "train_one", "train_reusing",
           "write_outputs"]  # fmt: skip  # the shared harness, as branch_credit reads it from here


@dataclass(frozen=True)
class Setting:
    env_id: str
    noise_scale: float
    iterations: int
    seeds: int
    methods: tuple[str, ...]
    turns: int  # TextWatchRepair's max_turns, or the workshop's n_stations (one station per turn)
    rollouts: int  # generation_batch_size: rollouts per iteration
    group: int  # num_generations: K rollouts per task (the LOO group)
    epochs: int  # num_iterations: optimizer steps over each batch
    learning_rate: float
    seconds_per_iteration: float  # measured wall time of one iteration (torch_threads 1), another run on the other core
    ablation_seeds: int | None = None  # seeds of each ablation method (None: `seeds`)

    def seeds_of(self, method: str) -> int:
        return self.ablation_seeds if method in ABLATIONS and self.ablation_seeds is not None else self.seeds

    def hyperparams(self) -> list[str]:
        return setting_hyperparams(self)


RATES = ("task_goal_completion", "invalid_turn_rate")
TWR_METHODS = ("loop", "vcbm-loop", "trl-grpo")
ABLATIONS = ("vcbm-loop/no-retrieval", "vcbm-loop/beta0")
# Chosen by pilots before the committed 10-seed run (module docstring; seconds per iteration: its BUDGET).
SETTINGS = {
    "twr-low": Setting("TextWatchRepair-v0", 0.25, 70, 10, TWR_METHODS, 2, 48, 8, 2, 5.0e-4, 0.53),
    "twr-paper": Setting("TextWatchRepair-v0", 1.0, 220, 10, TWR_METHODS, 2, 48, 8, 2, 2.5e-4, 0.51),
    "workshop-low": Setting(
        "TextWatchWorkshop-v0", 0.25, 70, 5, TWR_METHODS + ABLATIONS, 8, 48, 8, 2, 5.0e-4, 4.19, ablation_seeds=1
    ),
    "twr-noiseless": Setting("TextWatchRepair-v0", 0.0, 40, 10, TWR_METHODS, 2, 48, 8, 2, 5.0e-4, 0.53),
}
DEFAULT_SETTINGS = ("twr-low", "twr-paper", "workshop-low")
METHODS = TWR_METHODS + ABLATIONS
METRICS = {
    "task_goal_completion": "optimal-decision rate",
    "mean_return": "return",
    "invalid_turn_rate": "invalid-turn rate",
    "decision_advantage_mass": "advantage mass on deciding turns",
}


def method_argv(method: str, env_id: str, turns: int) -> list[str]:
    """The algo and the credit arguments of a method (an ablation changes the zoo's vcbm_blend arguments)."""
    algo = method.partition("/")[0]
    if algo == method:
        return ["--algo", algo]
    from algorithms.common.config import zoo_hyperparams

    blend = dict(zoo_hyperparams("vcbm-loop", env_id)["credit_kwargs"]["vcbm_blend"])
    if method == "vcbm-loop/no-retrieval":
        blend.update(top_k=turns, few_bookmarks="floor")  # never more bookmarks than top_k: Eq. 13 is skipped
    elif method == "vcbm-loop/beta0":
        blend.update(beta=0.0)
    else:
        raise ValueError(f"unknown method {method!r}")
    inline = ", ".join(f"{k}: {v}" for k, v in blend.items())
    return ["--algo", algo, "--hyperparams", f"credit_kwargs={{vcbm_blend: {{{inline}}}}}"]


def run_argv(setting: Setting, method: str, seed: int, iterations: int, log_dir: Path, extra: Sequence[str]) -> list[str]:
    """The `algorithms.train` command line of one run."""
    algo = method_argv(method, setting.env_id, setting.turns)
    return train_argv(algo, setting.env_id, seed, iterations, log_dir, [*setting.hyperparams(), *extra])


def comparisons(methods: dict[str, dict]) -> dict[str, dict]:
    """vcbm-loop against every other method: probability of improvement (bootstrap 95% CI) and Mann-Whitney U,
    on iterations to 90% (lower is better, censored at the budget) and on the final optimal rate."""
    from algorithms.stats import improvement_estimate, mann_whitney

    out = {}
    if "vcbm-loop" not in methods:
        return out
    mine = methods["vcbm-loop"]
    for other, theirs in methods.items():
        if other == "vcbm-loop":
            continue
        out[f"vcbm-loop vs {other}"] = {
            "iterations_to_90": {
                "probability_of_improvement": improvement_estimate(
                    mine["iterations_to_90"], theirs["iterations_to_90"], lower_is_better=True
                ),
                "mann_whitney": mann_whitney(mine["iterations_to_90"], theirs["iterations_to_90"]),
            },
            "final_optimal_rate": {
                "probability_of_improvement": improvement_estimate(
                    mine["final_optimal_rate"], theirs["final_optimal_rate"], lower_is_better=False
                ),
                "mann_whitney": mann_whitney(mine["final_optimal_rate"], theirs["final_optimal_rate"]),
            },
        }
    return out


def summarise(histories: dict[str, dict[str, list]], window: int, budgets: dict[str, int]) -> dict:
    out: dict = {}
    for name, by_method in histories.items():
        setting = SETTINGS[name]
        methods: dict[str, dict] = {}
        for method, runs in by_method.items():
            curves = {m: np.array([[h.get(m, np.nan) for h in run] for run in runs], dtype=float) for m in METRICS}
            hits = [iterations_to_target(curves["task_goal_completion"][k], window) for k in range(len(runs))]
            methods[method] = {
                "seeds": len(runs),
                "curves": {m: dict(zip(("mean", "low", "high"), mean_ci(c))) for m, c in curves.items()},
                "iterations_to_90": [n for n, _ in hits],
                "reached_90": [ok for _, ok in hits],
                "final_optimal_rate": [float(c[-window:].mean()) for c in curves["task_goal_completion"]],
                "seconds_per_iteration": float(np.mean([h["iteration_time_s"] for run in runs for h in run])),
            }
        out[name] = {
            "env": setting.env_id,
            "noise_scale": setting.noise_scale,
            "iterations": budgets[name],
            "hyperparameters": setting.hyperparams(),
            "methods": methods,
            "comparisons": comparisons(methods),
        }
    return out


def _ci(estimate: dict) -> str:
    if estimate["ci_low"] is None:
        return f"{estimate['estimate']:.2f}"
    return f"{estimate['estimate']:.2f} [{estimate['ci_low']:.2f}, {estimate['ci_high']:.2f}]"


def _p(test: dict) -> str:
    return "undefined (all tied)" if test["p"] is None else f"{test['p']:.3g}"


def table(results: dict, window: int, wall_s: float | None = None) -> str:
    """The markdown tables of results.json's settings (make_results.py renders RESULTS.md with it). Settings
    written before the comparisons existed (one Mann-Whitney of vcbm-loop against loop) render as they did."""
    lines = method_rows(results, window, noise=True)
    lines.append("")
    compared = {name: r for name, r in results.items() if "comparisons" in r}
    for name, r in results.items():
        if "mann_whitney_vcbm_vs_loop" in r:
            mw = r["mann_whitney_vcbm_vs_loop"]
            p = "undefined (every value tied)" if mw["p"] is None else f"{mw['p']:.3g}"
            lines.append(
                f"- {name}: Mann-Whitney U (vcbm-loop vs loop, iterations to 90%, censored at the budget) U = {mw['U']}, p = {p}"
            )
    for name, r in compared.items():
        lines.append(
            f"- {name}: {r['env']}, budget {r['iterations']} iterations; hyperparameters {' '.join(r['hyperparameters'])}"
        )
    if compared:
        lines += [
            "",
            "Probability of improvement of vcbm-loop (P(vcbm-loop better) + P(tie) / 2 over independent seeds, "
            "percentile bootstrap 95% CI) and the Mann-Whitney U test (two-sided, tie-corrected; censored seeds "
            "count at the budget):",
            "",
            "| setting | comparison | P(improvement), iterations to 90% | U, p | P(improvement), final optimal rate | U, p |",
            "|---|---|---|---|---|---|",
        ]
        for name, r in compared.items():
            for pair, c in r["comparisons"].items():
                it, final = c["iterations_to_90"], c["final_optimal_rate"]
                lines.append(
                    f"| {name} | {pair} | {_ci(it['probability_of_improvement'])} | {it['mann_whitney']['U']:g}, "
                    f"{_p(it['mann_whitney'])} | {_ci(final['probability_of_improvement'])} | "
                    f"{final['mann_whitney']['U']:g}, {_p(final['mann_whitney'])} |"
                )
        lines.append("")
    return markdown(lines, wall_s)


def markdown(lines: list[str], wall_s: float | None) -> str:
    """A results.md: the lines, then the invocation's wall time when given."""
    if wall_s is not None:
        lines.append(f"- wall time {wall_s / 60:.1f} min")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(len(METRICS), len(names), figsize=(4.8 * len(names), 2.6 * len(METRICS)), squeeze=False)
    for col, name in enumerate(names):
        for row, (metric, label) in enumerate(METRICS.items()):
            ax = axes[row][col]
            for method, m in results[name]["methods"].items():
                c = m["curves"][metric]
                x = np.arange(1, len(c["mean"]) + 1)
                ax.plot(x, c["mean"], label=f"{method} ({m['seeds']} seeds)")
                low, high = np.asarray(c["low"]), np.asarray(c["high"])
                if metric in RATES:  # a t-interval of few seeds can leave [0, 1]; a rate cannot
                    low, high = np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)
                ax.fill_between(x, low, high, alpha=0.2)
            if metric == "task_goal_completion":
                ax.axhline(TARGET, color="grey", lw=0.8, ls="--")
            ax.set_title(f"{name} (noise {results[name]['noise_scale']})" if row == 0 else "")
            ax.set_ylabel(label if col == 0 else "")
            ax.set_xlabel("iteration" if row == len(METRICS) - 1 else "")
        axes[0][col].legend(fontsize=7)
    fig.suptitle("mean across seeds with 95% t-intervals", fontsize=9)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def plan(
    settings: Sequence[str],
    seeds: int | None,
    iterations: int | None,
    methods: Sequence[str] | None,
    by_name: dict[str, Setting] | None = None,
    rate: Callable[[Setting, str], float] | None = None,
):
    """(setting, method, seed, budget, cost_s) of every run selected, longest first: settings of `by_name` (SETTINGS),
    seconds per iteration `rate(setting, method)` (the setting's)."""
    by_name = SETTINGS if by_name is None else by_name
    rows = []
    for name in settings:
        setting = by_name[name]
        budget = iterations or setting.iterations
        for method in setting.methods:
            if methods and method not in methods:
                continue
            per_iteration = setting.seconds_per_iteration if rate is None else rate(setting, method)
            for seed in range(seeds or setting.seeds_of(method)):
                rows.append((name, method, seed, budget, START_S + budget * per_iteration))
    return sorted(rows, key=lambda row: -row[4])


def estimate_text(rows: list, workers: int) -> str:
    lines = []
    for name in dict.fromkeys(row[0] for row in rows):
        mine = [row for row in rows if row[0] == name]
        s = SETTINGS[name]
        lines.append(
            f"{name}: {len(mine)} runs x ({START_S:.0f} s + {mine[0][3]} iterations x {s.seconds_per_iteration} s) = "
            f"{sum(r[4] for r in mine) / 60:.1f} run-minutes ({s.rollouts} rollouts/iteration: "
            f"{mine[0][3] * s.rollouts} episodes per run)"
        )
    lines.append(estimate_total([row[4] for row in rows], workers))
    return "\n".join(lines)


DEFAULT_BUDGET_NOTE = estimate_text(plan(DEFAULT_SETTINGS, None, None, None), 2)


def build_parser(
    prog: str = "python benchmarks/llm_learning.py",
    description: str = __doc__.splitlines()[0],
    settings: Sequence[str] = SETTINGS,
    default_settings: Sequence[str] = DEFAULT_SETTINGS,
    methods: Sequence[str] = METHODS,
    out: str = "runs/llm_learning",
    hyperparams: bool = True,
) -> argparse.ArgumentParser:
    """This benchmark's options; branch_credit.py takes the same over its own settings and methods."""
    parser = cli.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--settings", nargs="+", default=list(default_settings), help=f"of: {', '.join(settings)}")
    parser.add_argument("--methods", nargs="+", default=None, help=f"a subset of: {', '.join(methods)}")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per method (default: each setting's)")
    parser.add_argument("--iterations", type=int, default=None, help="every setting's budget (default: each setting's)")
    add_run_arguments(parser, out, 5, "iterations averaged for the 90%% criterion", hyperparams)
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Every argument checked before anything is written."""
    check_choices("--settings", args.settings, list(SETTINGS))
    check_choices("--methods", args.methods or (), METHODS)
    check_counts(args)
    for name in args.settings:
        if not any(not args.methods or m in args.methods for m in SETTINGS[name].methods):
            raise VcbmGymError(f"--methods {' '.join(args.methods)}: none of them runs in setting {name!r}")
    from algorithms.common.config import parse_overrides

    try:
        parse_overrides(args.hyperparams)
    except Exception as exc:  # the parser's own error names the bad item
        raise VcbmGymError(f"--hyperparams: {exc}") from None
    resolve_selected(args, SETTINGS, run_argv, args.hyperparams)
    cli.check_output_dir(args.out, "--out")


def resolve_selected(args: argparse.Namespace, by_name: dict[str, Setting], argv_of, extra: Sequence[str]) -> None:
    """One dry resolve per setting of `by_name` and method selected (`argv_of`: run_argv's signature): a bad override
    fails here, not in a worker."""
    from algorithms.train import resolve_argv

    for name in args.settings:
        setting = by_name[name]
        for method in setting.methods:
            if not args.methods or method in args.methods:
                resolve_argv(argv_of(setting, method, 0, args.iterations or setting.iterations, Path("unused"), extra))


def run(argv: Sequence[str]) -> dict[str, Any]:
    args = build_parser().parse_args(list(argv))
    check_args(args)
    rows = plan(args.settings, args.seeds, args.iterations, args.methods)
    print(estimate_text(rows, args.workers), flush=True)
    if args.estimate:
        return {}
    out = cli.output_dir(args.out, "--out")
    trained = train_reusing(lambda warm_start: jobs_of(rows, out, warm_start, args.hyperparams), args.workers, final_rate)
    results = summarise(grouped(trained, SETTINGS, METHODS), args.window, budgets(trained))
    payload = {
        "warm_start": trained.warm_start,
        "target": TARGET,
        "window": args.window,
        "seeds": args.seeds or ", ".join(f"{SETTINGS[name].seeds} ({name})" for name in args.settings),
        "extra_hyperparams": list(args.hyperparams),
        "settings": results,
        "wall_time_s": trained.wall_s,  # of this invocation: the runs it reused are not counted (run.json says how many)
    }
    from algorithms.common.provenance import command_line

    write_outputs(
        out, command_line("python benchmarks/llm_learning.py", argv), trained, payload,
        table(results, args.window, trained.wall_s), lambda path: plot(results, path),
        extra_hyperparams=list(args.hyperparams),
    )  # fmt: skip
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'curves.png'}, {out / 'run.json'}")
    return payload


def jobs_of(
    rows: list, out: Path, warm_start: str, extra: Sequence[str], by_name: dict[str, Setting] | None = None, argv_of=run_argv
) -> list[Job]:
    """One job per `plan` row of settings `by_name` (SETTINGS), logging to OUT/<setting>/<method>/seed<k>, its command
    line `argv_of` (run_argv's signature)."""
    by_name = SETTINGS if by_name is None else by_name
    jobs = []
    for name, method, seed, budget, cost in rows:
        log_dir = out / name / method / f"seed{seed}"
        argv = tuple(argv_of(by_name[name], method, seed, budget, log_dir, extra))
        jobs.append(Job(name, method, seed, argv, str(log_dir), warm_start, cost))
    return jobs


def budgets(trained: Trained) -> dict[str, int]:
    """Each setting's budget: the iterations its runs made."""
    return {job.setting: len(trained.histories[job]) for job in trained.jobs}


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
