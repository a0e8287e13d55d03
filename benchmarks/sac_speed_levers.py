"""Speed levers for SAC on episodic MuJoCo: steps/s of each variant past its warm-up, measured side by side.

    python benchmarks/sac_speed_levers.py [--env EpisodicHopper-v5] [--learning-starts 2000] [--settle 500]
        [--steps 3000] [--repeats 2] [--json benchmarks/results/sac_speed_levers.json] [--markdown ...md]

Each variant is one SAC run of benchmarks/episodic_mujoco.py's settings (zoo_configs/sac.yml: batch 256, one
gradient step per env step, 256-256 networks; sac+ircr with its batch 512) in a fresh process, so that its thread
settings are its own; the variants run one after another, in the listed order and then in reverse on the next
repeat, so that a drift of the machine's load falls on both ends alike. The clock runs over `--steps` env steps
after `--learning-starts` random steps and `--settle` learning steps (SBX's JIT compilation and the first
allocations fall outside it). The default window, steps 2,500-5,500, is past the first short random episodes:
the episode lengths in it are printed. Variants:

- `sac`: SB3's SAC, one torch thread (what episodic_mujoco.py runs); the baseline of the ratios;
- `sac, 2 torch threads`;
- `sac+rrd`: RRD's reward model as episodic_mujoco.py runs it (float64; numpy's OpenBLAS with its default
  threads, one per core);
- `sac+rrd, BLAS 1 thread`: the same with OPENBLAS_NUM_THREADS=1;
- `sac+rrd, float32` and `sac+rrd, float32, BLAS 1 thread`: RRDConfig(dtype="float32");
- `sac+ircr`;
- `sbx sac` and `sbx sac, 1 XLA thread`: SBX's SAC (SB3's JAX version) at the same settings, where installed;
- `sac, cuda` and `sac+rrd, cuda`: SAC's networks and replay sampling on the GPU (`device: cuda`; RRD's reward model
  stays numpy on the CPU), where torch sees one.

The papers' one gradient step per env step is kept: a lower update ratio would change the protocol.
The machine's load average is recorded before and after (other jobs may share the cores).
"""

from __future__ import annotations

import argparse
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

import numpy as np  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback, CallbackList  # noqa: E402

from algorithms.common import cli, provenance  # noqa: E402

BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "XLA_FLAGS")
ONE_BLAS = {"OPENBLAS_NUM_THREADS": "1"}
ONE_XLA = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
# label -> (episodic_mujoco method or "sbx", SB3 overrides, RRD options, environment variables)
VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any], dict[str, str]]] = {
    "sac": ("sac", {}, {}, {}),
    "sac, 2 torch threads": ("sac", {"torch_threads": 2}, {}, {}),
    "sac+rrd": ("sac+rrd", {}, {}, {}),
    "sac+rrd, BLAS 1 thread": ("sac+rrd", {}, {}, ONE_BLAS),
    "sac+rrd, float32": ("sac+rrd", {}, {"dtype": "float32"}, {}),
    "sac+rrd, float32, BLAS 1 thread": ("sac+rrd", {}, {"dtype": "float32"}, ONE_BLAS),
    "sac+ircr": ("sac+ircr", {}, {}, {}),
    "sbx sac": ("sbx", {}, {}, {}),
    "sbx sac, 1 XLA thread": ("sbx", {}, {}, ONE_XLA),
    "sac, cuda": ("sac", {"device": "cuda"}, {}, {}),
    "sac+rrd, cuda": ("sac+rrd", {"device": "cuda"}, {}, {}),
}


class Clock(BaseCallback):
    """The time at env step `start`, and the lengths of the episodes that end after it."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start, self.began, self.lengths = start, float("nan"), []

    def _on_step(self) -> bool:
        if self.num_timesteps == self.start:
            self.began = time.perf_counter()
        elif self.num_timesteps > self.start:
            self.lengths += [info["episode"]["l"] for info in self.locals["infos"] if "episode" in info]
        return True


def child(variant: str, env_id: str, learning_starts: int, settle: int, steps: int) -> dict[str, Any]:
    """One variant's run in this process: steps/s over the clocked window and its episodes' lengths."""
    method, overrides, rrd, _ = VARIANTS[variant]
    total, clock = learning_starts + settle + steps, Clock(learning_starts + settle)
    with tempfile.TemporaryDirectory() as tmp:
        if method == "sbx":
            model, callbacks = sbx_model(env_id, learning_starts), []
        else:
            from algorithms.sb3.runner import build
            from algorithms.train import resolve_spec
            from benchmarks.episodic_mujoco import METHODS, method_env

            credit, settings = METHODS[method]
            more = {"credit": credit, "max_steps": total, "learning_starts": learning_starts, **settings, **overrides}
            spec = resolve_spec("sac", method_env(method, env_id), 0, more)
            if rrd:  # RRD's options on top of zoo_configs/sac.yml's
                credit_kwargs = {**spec.hyperparams["credit_kwargs"]}
                credit_kwargs["rrd"] = {**credit_kwargs["rrd"], **rrd}
                spec = resolve_spec("sac", spec.env, 0, {**more, "credit_kwargs": credit_kwargs})
            built = build(spec, tensorboard_log=tmp)
            model, callbacks = built.model, built.callbacks
        model.learn(total_timesteps=total, callback=CallbackList([*callbacks, clock]))
        seconds = time.perf_counter() - clock.began
    lengths = np.array(clock.lengths, dtype=float)
    return {"steps_per_s": steps / seconds, "seconds": seconds, "episodes": len(lengths), "mean_length": lengths.mean()}


def sbx_model(env_id: str, learning_starts: int):
    """SBX's SAC at zoo_configs/sac.yml's settings on the same Monitor-wrapped env."""
    import gymnasium as gym
    from sbx import SAC
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    import vcbm_gym  # noqa: F401  (registers the episodic envs)

    env = DummyVecEnv([lambda: Monitor(gym.make(env_id))])
    settings = dict(learning_rate=3e-4, buffer_size=1_000_000, batch_size=256, tau=0.005, gamma=0.99)
    return SAC("MlpPolicy", env, learning_starts=learning_starts, policy_kwargs={"net_arch": [256, 256]}, seed=0, **settings)


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in BLAS_VARS}
    # the repo first, then the caller's own path (packages installed outside site-packages stay visible)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.update(VARIANTS[variant][3], PYTHONPATH=path)
    window = [str(getattr(args, k)) for k in ("learning_starts", "settle", "steps")]
    command = [sys.executable, __file__, "--child", variant, "--env", args.env, *window]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"variant {variant!r} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def available(variant: str) -> bool:
    """SBX's variants where sbx and jax are installed, the CUDA ones where torch sees a GPU."""
    import importlib.util

    method, overrides, _, _ = VARIANTS[variant]
    if method == "sbx":
        return importlib.util.find_spec("sbx") is not None and importlib.util.find_spec("jax") is not None
    if overrides.get("device") == "cuda":
        import torch

        return torch.cuda.is_available()
    return True


def report(rows: list[dict[str, Any]], variants: list[str]) -> list[str]:
    base = sum(r["steps_per_s"] for r in rows if r["variant"] == "sac") / sum(r["variant"] == "sac" for r in rows)
    lines = [f"{'variant':34s} {'steps/s per repeat':>22s} {'mean':>7s} {'vs sac':>7s} {'episode length':>15s}"]
    for variant in [v for v in variants if any(r["variant"] == v for r in rows)]:
        mine = [r for r in rows if r["variant"] == variant]
        rates = [r["steps_per_s"] for r in mine]
        mean, length = sum(rates) / len(rates), sum(r["mean_length"] for r in mine) / len(mine)
        per = " ".join(f"{x:6.1f}" for x in rates)
        lines.append(f"{variant:34s} {per:>22s} {mean:7.1f} {mean / base:6.2f}x {length:15.0f}")
    return lines


def add_timing_arguments(parser: argparse.ArgumentParser, learning_starts: int, settle: int, steps: int, repeats: int) -> None:
    """The timed budget both SAC speed benchmarks take (this one and benchmarks/sbx_speed.py): --env, the warm-up,
    the steps that settle before the clock starts, the timed steps and the repeats."""
    parser.add_argument("--env", default="EpisodicHopper-v5")
    parser.add_argument("--learning-starts", type=int, default=learning_starts)
    parser.add_argument("--settle", type=int, default=settle)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--repeats", type=int, default=repeats)


def check_timing_arguments(args: argparse.Namespace) -> None:
    # the relabelling buffer needs a whole episode (the 1,000-step cap) before SAC's first update
    for name, lo in (("learning_starts", 1000), ("settle", 1), ("steps", 1), ("repeats", 1)):
        cli.check_int(getattr(args, name), f"--{name.replace('_', '-')}", lo)


def run(argv: list[str]) -> None:
    parser = cli.ArgumentParser(prog="python benchmarks/sac_speed_levers.py", description=__doc__.splitlines()[0])
    add_timing_arguments(parser, learning_starts=2000, settle=500, steps=3000, repeats=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    check_timing_arguments(args)
    provenance.check_report_files(args.json, args.markdown)
    variants = [v for v in args.variants if available(v)]
    if "sac" not in variants:
        parser.error("--variants: expected 'sac' among them (the baseline of the ratios)")
    record = {
        **provenance.environment_record(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "markdown")},
    }
    record.update(cpus=os.cpu_count(), load_before=os.getloadavg(), skipped=sorted(set(args.variants) - set(variants)))
    rows: list[dict[str, Any]] = []
    planned = [(r, v) for r in range(args.repeats) for v in (variants if r % 2 == 0 else variants[::-1])]
    for repeat, variant in planned:
        rows.append({"variant": variant, "repeat": repeat, **run_variant(variant, args), "load_after": os.getloadavg()})
        print(f"{variant:34s} repeat {repeat}: {rows[-1]['steps_per_s']:.1f} steps/s", flush=True)
        # the report so far after every run: a stopped benchmark keeps what it measured
        record.update(load_after=os.getloadavg(), runs_done=len(rows), runs_planned=len(planned))
        lines = report(rows, variants)
        load = f"load average (1, 5, 15 min) before {record['load_before']}, after {record['load_after']}"
        lines += [f"{load}, {os.cpu_count()} cpus; {len(rows)} of {len(planned)} runs done"]
        title = f"SAC speed levers on {args.env} (steps/s past warm-up, side by side)"
        provenance.write_report(title, parser.prog, argv, record, rows, lines, args.json, args.markdown)
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # one variant, started by run_variant: its result as the last line of stdout
        variant, env_id, *window = argv[1:2] + argv[3:]
        print(json.dumps(child(variant, env_id, *map(int, window))))
        return 0
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
