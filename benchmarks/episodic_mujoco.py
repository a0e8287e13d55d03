"""Episodic-reward MuJoCo: SAC on the episodic reward, SAC + IRCR, SAC + RRD, and SAC on the dense reward.

The protocol of IRCR (Gangwani et al. 2020, "Learning Guidance Rewards with Trajectory-space Smoothing") and RRD
(Ren et al. 2022, "Learning Long-Term Reward Redistribution via Randomized Return Decomposition"), as their
reference code runs it: the whole return paid at an episode's last step (`EpisodicHopper-v5`, ...; the 1,000-step
cap a truncation), SAC with the reference settings (zoo_configs/sac.yml), and the true (dense) return of the
deterministic policy every `--eval-every` steps. Methods:

- `sac`: SAC on the episodic reward (what both papers improve on);
- `sac+ircr`: IRCR's guidance reward, relabelled in the replay buffer (batch 512, polyak 0.999, its reference's);
- `sac+rrd`: RRD's reward model on [s, a, s - s'], relabelled in the replay buffer;
- `sac-dense`: SAC on the dense reward of the same task (the upper reference).

SAC's engine is SBX (SB3's JAX version, the `sbx` extra) unless `--engine sb3` names SB3: the registered distribution
test (zoo_configs/experiments/sbx_engine_distribution.yml, benchmarks/results/sbx_engine_distribution: Hopper, seeds
500-509, 15,000 steps) found SBX's final true return not worse beyond noise for sac (P(improvement) of sbx 0.49 [0.22,
0.76]) and sac+ircr (0.54 [0.28, 0.79]), at 1.98x and 2.28x SB3's steps/s side by side (benchmarks/results/
sbx_speed.md). sac+rrd is 1.35x only, but runs on SBX too, so that every rule is compared with SAC on one engine.
`--engine sb3 sbx` trains each method on both engines side by side (labels `METHOD` and `METHOD@sbx`) and reports
each sbx method's P(improvement) over the same method on sb3.

Runs go through algorithms.experiment's jobs: a finished run of the same config (its hash) is reused, so a stopped
benchmark resumes where it stopped (`--out`), and `--backend ray [--address ...]` runs the same jobs on a Ray
cluster, unchanged. `--measure STEPS` prints each method's steps/s here (one process, one torch thread) and runs
nothing else.

BUDGET, fixed from a measurement before any result: `--measure 3000` on EpisodicHopper-v5, the machine otherwise
idle (2026-12-03): sac 116, sac+ircr 81 (its batch of 512), sac+rrd 91 (the reward model's step per env step),
sac-dense 134 steps/s. 2 envs x 4 methods x 5 seeds = 40 runs on 2 workers is 20 runs a worker; at about 105
steps/s, about 2 hours (the evaluations included) leave 30,000 steps a run: DEFAULT_STEPS, with 5,000 warm-up
steps (the papers' 10,000 would be a third of it) and an evaluation every 5,000. The papers run 1 M (IRCR) to 3 M
(RRD) steps: this budget is 3% of IRCR's, enough to see whether a rule's reward lets SAC start learning from the
episodic reward sooner, not the papers' final returns. The full protocol is `--steps 1000000 --learning-starts 10000
--eval-every 10000` (about 2.6 hours a run at these rates), for `--backend ray` on more machines. Levers measured
side by side (benchmarks/sac_speed_levers.py, benchmarks/results/sac_speed_levers.md: EpisodicHopper-v5, steps
2,500-5,500 of a run, one process at a time, 2026-12-04, the two cores shared with other jobs at load average 3-8):
against SB3 SAC's 69 steps/s, a second torch thread makes 0.07x; sac+rrd as run here 0.10x (7 steps/s), because
numpy's OpenBLAS runs the reward model's products on a thread per core, which contend with everything else; with
OPENBLAS_NUM_THREADS=1 sac+rrd makes 0.9x (53-69 steps/s, 8.7x its default; kept: every SB3 run now limits numpy's
BLAS to its torch_threads, with threadpoolctl; the published runs predate this), and with RRD's `dtype: float32`
option as well 1.2x (77-83 steps/s, 1.2-1.5x float64's at one BLAS thread); sac+ircr 0.9x; SBX's SAC (SB3's JAX
version, not wired into the SB3 arm) 2.1-2.2x, with or without one XLA thread. The relabelling buffer needs one
env per run (no vectorised collection), and a lower update ratio would change the papers' protocol (one gradient
step per env step), so neither was measured. On a lent machine with one H200 GPU and 16 slower CPU cores (2026-12-04,
benchmarks/results/sac_speed_levers_cuda.md, steps 2,500-4,500, 7 of 8 planned runs), SAC's networks on the GPU
(`device: cuda`) made 1.36x its CPU runs there (69-79 against 55 steps/s) and sac+rrd 1.09x (43-46 against 38-45):
RRD's numpy reward model stays on the CPU. This machine has no GPU, so the published runs use the CPU.

MEASURED AFTERWARDS (the first run of the default, 2026-12-03, EpisodicHopper-v5, two runs side by side on two
cores): the budget above does not hold. Wall time per run: sac 255-338 s, sac+ircr 478-593 s, sac+rrd 836-1,611 s,
sac-dense about 280 s, so one (env, seed) is about 40 minutes of one core and the default (2 envs x 5 seeds) about
3.3 hours on 2 cores. `--measure` ran 4,000 steps past a 1,000-step warm-up, where episodes and RRD's lesson buffer
are still short; late in a run RRD makes about 27 steps/s, and py-spy puts half of its time in the reward model's
numpy step (one per env step, the reference's ratio) and most of the rest in SAC's update. The default is kept (runs
already finished are reused by their config hash); on this machine run one env per sitting (`--envs
EpisodicHopper-v5`, then `--envs EpisodicHalfCheetah-v5` into the same --out; each about 1.7 hours).

RE-MEASURED after numpy's BLAS was limited to one thread (2026-12-04, `--envs EpisodicHopper-v5 --seeds 1`, the
two cores otherwise idle): sac 292 s, sac+ircr 511 s, sac+rrd 439 s (836-1,611 s before), sac-dense 292 s, so
1,534 s of one core per (env, seed) and 817 s of wall time on 2 workers. The four final returns equal the published
seed 0's exactly. If HalfCheetah costs the same (not re-measured), the default's 10 (env, seed) groups take about
2.1 hours on 2 cores, close to the budget above.

Outputs in --out: results.json (per env and method: final true return per seed, mean / IQM / median with
bootstrap 95% CIs, P(improvement) of each rule and of dense SAC over `sac` with its CI), table.md,
curves_<env>.png (mean true return and its CI across seeds), run.json (command, commit, versions, wall time, budget).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.common import cli, provenance
from algorithms.common.extras import require_extra
from algorithms.experiment import stats
from algorithms.experiment.jobs import count_finished, seed_jobs, train_jobs
from algorithms.experiment.results import locked, runs_record, save_figure, write_results
from algorithms.registry import get_arm
from algorithms.train import resolve_spec

ENVS = ("EpisodicHopper-v5", "EpisodicHalfCheetah-v5")
METHODS: dict[str, tuple[str, dict[str, Any]]] = {  # label -> (credit rule, SAC settings that differ for it)
    "sac": ("none", {}),
    "sac+ircr": ("ircr", {"batch_size": 512, "tau": 0.001}),
    "sac+rrd": ("rrd", {}),
    "sac-dense": ("none", {}),
}
# Compared with episodic SAC: the two rules, and dense SAC, which bounds what a perfect redistribution (the dense
# reward itself) buys at the same budget.
OVER_BASE = ("sac+ircr", "sac+rrd", "sac-dense")
# The budget fixed before any result was seen (see BUDGET in --help): steps per run and the evaluation cadence.
DEFAULT_STEPS = 30_000
DEFAULT_EVAL_EVERY = 5_000
DEFAULT_LEARNING_STARTS = 5_000


def method_env(method: str, env: str) -> str:
    """`sac-dense` trains on the dense task under the episodic one (EpisodicHopper-v5 -> Hopper-v5)."""
    return env.removeprefix("Episodic") if base_method(method) == "sac-dense" else env


def labels(methods: list[str], engines: list[str]) -> dict[str, tuple[str, str]]:
    """label -> (method, engine): the method's own name under one engine; under several, `METHOD@ENGINE` for each engine
    but sb3 (e.g. `sac` and `sac@sbx`), so that one run compares the engines side by side."""
    if len(engines) == 1:
        return {method: (method, engines[0]) for method in methods}
    return {(method if engine == "sb3" else f"{method}@{engine}"): (method, engine) for engine in engines for method in methods}


def base_method(label: str) -> str:
    return label.split("@")[0]


def sb3_label(label: str) -> str | None:
    """The same method's label under sb3, for a label of another engine (`sac+ircr@sbx` -> `sac+ircr`); else None."""
    return base_method(label) if "@" in label else None


def method_spec(method: str, env: str, steps: int, eval_every: int, learning_starts: int, engine: str = "sb3"):
    credit, settings = METHODS[base_method(method)]
    overrides = {
        "credit": credit,
        "max_steps": steps,
        "eval_every_steps": eval_every,
        "learning_starts": learning_starts,
        **settings,
        **({"engine": engine} if engine != "sb3" else {}),  # the default left out: sb3 runs keep their config hash
    }
    spec = resolve_spec("sac", method_env(method, env), 0, overrides)
    get_arm("sac").validate(spec)  # the model built dry: a refused setting stops the benchmark before any worker starts
    return spec


def evaluations(log_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(steps, mean true return per evaluation) from SB3's evaluations.npz."""
    with np.load(log_dir / "evaluations.npz") as data:
        return data["timesteps"], data["results"].mean(axis=1)


def env_results(env: str, methods: list[str], jobs_of: dict[str, list]) -> tuple[dict[str, Any], np.ndarray, dict]:
    curves = {m: np.stack([evaluations(job.log_dir)[1] for job in jobs_of[m]]) for m in methods}
    steps = evaluations(jobs_of[methods[0]][0].log_dir)[0]
    final = {m: curves[m][:, -1] for m in methods}  # the last evaluation's true return, per seed
    out: dict[str, Any] = {"eval_steps": steps.tolist(), "methods": {}}
    for m in methods:
        out["methods"][m] = {
            "env": method_env(m, env),
            "final_true_return": final[m].tolist(),
            "aggregates": stats.aggregate_estimates(final[m]),
            "curve_mean": curves[m].mean(axis=0).tolist(),
        }
        engine_sac = "sac" + m[len(base_method(m)) :]  # episodic SAC under the same engine
        if base_method(m) in OVER_BASE and engine_sac in final:
            out["methods"][m]["p_improvement_over_sac"] = stats.improvement_estimate(final[m], final[engine_sac], False)
        if sb3_label(m) in final:  # the engines compared: not worse beyond noise is what keeps sbx as a default
            out["methods"][m]["p_improvement_over_sb3"] = stats.improvement_estimate(final[m], final[sb3_label(m)], False)
    return out, steps, curves


def plot(env: str, steps: np.ndarray, curves: dict[str, np.ndarray], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for method, runs in curves.items():
        mean, low, high = stats.mean_ci_curves(runs)
        ax.plot(steps, mean, label=f"{method} ({len(runs)} seeds)")
        ax.fill_between(steps, low, high, alpha=0.2)
    ax.set(xlabel="env steps", ylabel="true return (deterministic policy)", title=env)
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)


def _estimate_text(p: dict[str, Any] | None) -> str:
    return f"{p['estimate']:.2f} [{p['ci_low']:.2f}, {p['ci_high']:.2f}]" if p and p["ci_low"] is not None else "-"


def table(results: dict[str, Any]) -> str:
    engines = any("p_improvement_over_sb3" in r for res in results["envs"].values() for r in res["methods"].values())
    columns = ["env", "method", "final true return, mean [95% CI]", "IQM", "P(improvement) over sac [95% CI]"]
    columns += ["P(improvement) over the same method on sb3 [95% CI]"] if engines else []
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for env, res in results["envs"].items():
        for method, r in res["methods"].items():
            mean, iqm = r["aggregates"]["mean"], r["aggregates"]["iqm"]
            ci = f"[{mean['ci_low']:.1f}, {mean['ci_high']:.1f}]" if mean["ci_low"] is not None else ""
            cells = [env, method, f"{mean['estimate']:.1f} {ci}", f"{iqm['estimate']:.1f}"]
            cells += [_estimate_text(r.get("p_improvement_over_sac"))]
            cells += [_estimate_text(r.get("p_improvement_over_sb3"))] if engines else []
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def measure(env: str, steps: int) -> dict[str, float]:
    """Steps/s of one SAC run past its warm-up (one process, one torch thread), per method, measured side by side."""
    import tempfile

    from algorithms.common.spec import RunOptions
    from algorithms.train import execute

    rates = {}
    for method in METHODS:
        spec = method_spec(method, env, steps + 1_000, steps + 1_000, 1_000)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            execute(spec, Path(tmp) / "run", RunOptions(progress=False))
            rates[method] = (steps + 1_000) / (time.perf_counter() - start)
    return rates


def add_run_arguments(parser: argparse.ArgumentParser, seeds: int, engine: str) -> None:
    """The per-run budget (this benchmark's and benchmarks/reward_fit.py's): seeds, engine, steps, evaluation, warm-up,
    workers."""
    parser.add_argument("--seeds", type=int, default=seeds)
    parser.add_argument("--seed-start", type=int, default=0, help="the first seed (seeds run from it upwards)")
    parser.add_argument(
        "--engine", nargs="+", choices=("sb3", "sbx"), default=[engine],
        help=f"SAC's engine (default {engine}; sbx: the `sbx` extra); two engines run each method under both (METHOD@sbx)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="env steps per run")
    parser.add_argument("--eval-every", type=int, default=DEFAULT_EVAL_EVERY)
    parser.add_argument("--learning-starts", type=int, default=DEFAULT_LEARNING_STARTS)
    parser.add_argument("--workers", type=int, default=2)


def check_run_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("seeds", "steps", "eval_every", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected an integer >= 1")
    if args.seed_start < 0:
        parser.error(f"--seed-start {args.seed_start}: expected an integer >= 0")
    if args.steps % args.eval_every or args.learning_starts >= args.steps:
        parser.error(f"--steps {args.steps}: expected a multiple of --eval-every ({args.eval_every}) above --learning-starts")
    if "sbx" in args.engine and getattr(args, "measure", None) is None:  # --measure times SB3
        default = " (the default; --engine sb3 runs on SB3)" if parser.get_default("engine") == ["sbx"] else ""
        require_extra(f"--engine sbx{default}", "sbx")


def method_jobs(args: argparse.Namespace, out: Path) -> dict[str, dict[str, list]]:
    """env -> method -> its seeds' jobs, every method resolved before anything runs (a bad setting is one line)."""
    jobs_of: dict[str, dict[str, list]] = {}
    for env in args.envs:
        jobs_of[env] = {}
        for label, (method, engine) in labels(args.methods, args.engine).items():
            spec = method_spec(method, env, args.steps, args.eval_every, args.learning_starts, engine)
            where = out / "runs" / env / label
            seeds = range(args.seed_start, args.seed_start + args.seeds)
            jobs_of[env][label] = seed_jobs(label, spec, seeds, lambda s, w=where: w / f"seed{s}")
    return jobs_of


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = cli.ArgumentParser(prog="python benchmarks/episodic_mujoco.py", description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(ENVS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    add_run_arguments(parser, seeds=5, engine="sbx")
    parser.add_argument("--backend", choices=("process", "ray"), default="process")
    parser.add_argument("--address", default=None, help="a Ray cluster's address (with --backend ray)")
    parser.add_argument("--out", default="runs/episodic_mujoco")
    parser.add_argument("--measure", type=int, default=None, metavar="STEPS", help="print each method's steps/s and exit")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    check_run_arguments(parser, args)
    if args.measure is not None and args.measure < 1:  # 0 would fall through to the full benchmark
        parser.error(f"--measure {args.measure}: expected an integer >= 1 (env steps to time past the warm-up)")
    return args


def run(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.measure is not None:
        for env in args.envs:
            print(env, {m: round(r, 1) for m, r in measure(env, args.measure).items()})
        return
    out = cli.check_output_dir(args.out, "--out")
    jobs_of = method_jobs(args, out)
    jobs = [job for per_env in jobs_of.values() for per_method in per_env.values() for job in per_method]
    started = provenance.start()
    out.mkdir(parents=True, exist_ok=True)
    with locked(out, "episodic_mujoco"):
        reused = count_finished(jobs)
        summaries = train_jobs(jobs, args.workers, progress=not args.no_progress, backend=args.backend, address=args.address)
        results: dict[str, Any] = {"protocol": vars(args) | {"out": str(out)}, "bootstrap": stats.bootstrap_description()}
        results["envs"] = {}
        for env in args.envs:
            res, steps, curves = env_results(env, list(jobs_of[env]), jobs_of[env])
            results["envs"][env] = res
            plot(env, steps, curves, out / f"curves_{env}.png")
        write_results(out, results, table(results))
        provenance.write_run_record(
            out, "benchmarks/episodic_mujoco.py", argv, started, workers=args.workers, backend=args.backend,
            **runs_record(len(jobs), reused, summaries),
        )  # fmt: skip
    print(table(results))


def main(argv: list[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
