"""SB3 against SBX as the SB3 arm's engine: steps/s of SAC, SAC+IRCR and SAC+RRD past their warm-up, side by side.

    python benchmarks/sbx_speed.py [--env EpisodicHopper-v5] [--learning-starts 1000] [--settle 200] [--steps 1000]
        [--repeats 1] [--seed 0] [--variants sac sac+ircr sac+rrd sac+rrd-jax]
        [--json benchmarks/results/sbx_speed.json] [--markdown benchmarks/results/sbx_speed.md]

Each run is `python -m algorithms.train`'s own build (algorithms/sb3/runner.py) of zoo_configs/sac.yml's entry, with
`--hyperparams engine=sb3` or `engine=sbx` (algorithms/sb3/engines.py), `torch_threads: 1` (torch, numpy's BLAS and,
under sbx, XLA on one thread), the same seed, the same `--learning-starts` and step budget; each in a fresh process,
so that its thread settings are its own (XLA reads them once per process). Both engines of a variant run back to
back, and the order of the variants reverses on every other repeat, so that a drift of the machine's load falls on
both engines alike. The clock runs over `--steps` env steps after `--learning-starts` random steps and `--settle`
learning steps: SBX's JIT compilation and the first allocations fall outside it. The credit runs keep the relabelling
replay buffer's condition (learning_starts >= one episode, 1,000 steps on the MuJoCo tasks).

Besides steps/s, each run reports the share of its clocked time spent in the credit rule's own code (its rewards
for an ended episode, its learning from it, and the relabelling of every sampled batch). RRD's reward model runs on
the CPU whichever engine trains the agent: `sac+rrd` computes it in numpy (`backend: numpy`), `sac+rrd-jax` in JAX
(`backend: jax`, vcbm_gym/credit/rrd_jax.py), on zoo_configs/sac.yml's model otherwise; `--variants` picks the variants
to run (all four by default). The machine's load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from algorithms.common import cli, provenance  # noqa: E402
from benchmarks.sac_speed_levers import add_timing_arguments, check_timing_arguments  # noqa: E402

ENGINES = ("sb3", "sbx")
# label -> (--credit, options over zoo_configs/sac.yml's credit_kwargs for it)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "sac": ("none", {}),
    "sac+ircr": ("ircr", {}),
    "sac+rrd": ("rrd", {"backend": "numpy"}),
    "sac+rrd-jax": ("rrd", {"backend": "jax"}),
}
RULE_METHODS = ("rewards", "observe", "transition_rewards")  # what the credit slot and the buffer call on a rule


class RuleClock:
    """Seconds spent in a rule's own methods since `start()` (wrapped on the instance)."""

    def __init__(self, rule: Any) -> None:
        self.seconds, self.running, self.depth = 0.0, False, 0
        for name in RULE_METHODS if rule is not None else ():
            setattr(rule, name, self._timed(getattr(rule, name)))

    def _timed(self, method):
        @functools.wraps(method)
        def timed(*args, **kwargs):
            began = time.perf_counter()
            self.depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.running and not self.depth:  # a method calling another is timed once
                    self.seconds += time.perf_counter() - began

        return timed


def child(variant: str, engine: str, env_id: str, seed: int, learning_starts: int, settle: int, steps: int) -> dict:
    """One run in this process: steps/s over the clocked window and the rule's share of it."""
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList

    from algorithms.sb3.runner import build
    from algorithms.train import resolve_spec, zoo_hyperparams

    total, start = learning_starts + settle + steps, learning_starts + settle
    credit, options = VARIANTS[variant]
    more = {"engine": engine, "credit": credit, "max_steps": total, "learning_starts": learning_starts}
    if options:
        zoo_options = zoo_hyperparams("sac", env_id).get("credit_kwargs", {})
        more["credit_kwargs"] = {**zoo_options, credit: {**zoo_options.get(credit, {}), **options}}
    spec = resolve_spec("sac", env_id, seed, {**more, "torch_threads": 1})

    with tempfile.TemporaryDirectory() as tmp:
        built = build(spec, tensorboard_log=tmp)
        rule_clock = RuleClock(built.rule)

        class Clock(BaseCallback):
            def __init__(self) -> None:
                super().__init__()
                self.began = float("nan")

            def _on_step(self) -> bool:
                if self.num_timesteps == start:
                    self.began, rule_clock.running = time.perf_counter(), True
                return True

        clock = Clock()
        try:
            built.model.learn(total_timesteps=total, callback=CallbackList([*built.callbacks, clock]))
        finally:
            built.env.close()
        seconds = time.perf_counter() - clock.began
    return {
        "steps_per_s": steps / seconds,
        "seconds": seconds,
        "rule_seconds": rule_clock.seconds,
        "rule_share": rule_clock.seconds / seconds,
        "model_class": f"{type(built.model).__module__}.{type(built.model).__name__}",
        "config_hash": spec.config_hash,
    }


def run_one(variant: str, engine: str, args: argparse.Namespace) -> dict[str, Any]:
    # the run sets its own thread settings from torch_threads: none inherited from this shell
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "XLA_FLAGS")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    numbers = [str(getattr(args, k)) for k in ("seed", "learning_starts", "settle", "steps")]
    command = [sys.executable, __file__, "--child", variant, engine, args.env, *numbers]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"{variant} on engine {engine} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def report(rows: list[dict[str, Any]]) -> list[str]:
    head = ["variant", "sb3 steps/s", "sbx steps/s", "sbx/sb3", "rule share sb3", "rule share sbx"]
    lines = [f"{head[0]:11s} " + " ".join(f"{h:>15s}" for h in head[1:])]
    for variant in VARIANTS:
        mine = {e: [r for r in rows if r["variant"] == variant and r["engine"] == e] for e in ENGINES}
        if not all(mine.values()):
            continue
        rate = {e: mean([r["steps_per_s"] for r in mine[e]]) for e in ENGINES}
        share = {e: mean([r["rule_share"] for r in mine[e]]) for e in ENGINES}
        shares = [f"{share[e]:.1%}" if VARIANTS[variant][0] != "none" else "-" for e in ENGINES]
        cells = [f"{rate['sb3']:.1f}", f"{rate['sbx']:.1f}", f"{rate['sbx'] / rate['sb3']:.2f}x", *shares]
        lines.append(f"{variant:11s} " + " ".join(f"{c:>15s}" for c in cells))
    return lines


def versions() -> dict[str, str]:
    out = {}
    for name in ("sbx-rl", "jax", "jaxlib", "flax", "optax"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def run(argv: list[str]) -> None:
    parser = cli.ArgumentParser(prog="python benchmarks/sbx_speed.py", description=__doc__.splitlines()[0])
    add_timing_arguments(parser, learning_starts=1000, settle=200, steps=1000, repeats=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    check_timing_arguments(args)
    cli.check_seed(args.seed)
    provenance.check_report_files(args.json, args.markdown)
    from algorithms.common.extras import require_extra

    require_extra("benchmarks/sbx_speed.py", "sbx")
    require_extra("benchmarks/sbx_speed.py", "mujoco")
    record = {
        **provenance.environment_record(),
        "jax_versions": versions(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "markdown")},
    }
    record.update(cpus=os.cpu_count(), load_before=os.getloadavg())
    rows: list[dict[str, Any]] = []
    planned = [
        (r, v, e) for r in range(args.repeats) for v in (args.variants if r % 2 == 0 else args.variants[::-1]) for e in ENGINES
    ]
    for repeat, variant, engine in planned:
        rows.append({"variant": variant, "engine": engine, "repeat": repeat, **run_one(variant, engine, args)})
        rows[-1]["load_after"] = os.getloadavg()
        print(f"{variant:11s} {engine}  repeat {repeat}: {rows[-1]['steps_per_s']:.1f} steps/s", flush=True)
        # the report so far after every run: a stopped benchmark keeps what it measured
        record.update(load_after=os.getloadavg(), runs_done=len(rows), runs_planned=len(planned))
        lines = report(rows)
        load = f"load average (1, 5, 15 min) before {record['load_before']}, after {record['load_after']}"
        lines += [f"{load}, {os.cpu_count()} cpus; {len(rows)} of {len(planned)} runs done"]
        title = f"SB3 vs SBX engine on {args.env} (SAC steps/s past warm-up, one thread each, side by side)"
        provenance.write_report(title, parser.prog, argv, record, rows, lines, args.json, args.markdown)
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # one run, started by run_one: its result as the last line of stdout
        variant, engine, env_id, *numbers = argv[1:]
        print(json.dumps(child(variant, engine, env_id, *map(int, numbers))))
        return 0
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
