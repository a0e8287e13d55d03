"""`python -m algorithms.train --algo ALGO --env ENV_ID [...]`: train one run, log it, summarise it.

Hyperparameters come from `zoo_configs/<algo>.yml[env_id]`, then `--config FILE` (flat, keyed by
env id, or the config.yml of an earlier run), then `--hyperparams key=value ...`, then the arm's
flags (`--max-episodes`, `--credit`); the algo's arm (`algorithms.registry.get_arm`, an
`algorithms.common.spec.Arm`) resolves them once into a frozen `RunSpec` (the plain values and the
arm's typed config) before anything runs, and `Arm.validate` builds the run's objects dry (SB3's
model, the LLM config and model path) before the log dir is touched: a refused command leaves
nothing on disk. Every run writes into its log dir: `config.yml` (that config,
its hash, the package versions and the git commit), TensorBoard events and `summary.json` (with the
config hash and a checksum). Both files are written to a temporary name and renamed. An existing
log dir is refused unless `--resume` or `--overwrite` is given.

The log dir's policy (what a run writes there, the lock, --resume and --overwrite) is algorithms.common.log_dir.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Mapping, Sequence

import gymnasium as gym
import yaml

import vcbm_gym
from algorithms.common import cli, provenance
from algorithms.common.config import on_this_machine, parse_overrides, user_config, zoo_hyperparams
from algorithms.common.credit_slot import credit_record
from algorithms.common.errors import VcbmGymError
from algorithms.common.extras import env_extra, require_extra
from algorithms.common.log_dir import claimed_log_dir, out_of_space_is_one_line, prepare_log_dir, summary_checksum
from algorithms.common.spec import Arm, Report, RunOptions, RunSpec
from algorithms.llm.training.checkpoints import COMPLETE_MARKER
from algorithms.registry import ALGOS, canonical_algo, get_arm
from envs.bsuite import env_id_problem


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m algorithms.train", description=__doc__.splitlines()[0])
    parser.add_argument("--algo", required=True, help=f"one of: {', '.join(ALGOS)}")
    parser.add_argument(
        "--env",
        default="WatchRepair-v0",
        help=f"a registered env id or module:id (the module registers it), e.g. {', '.join(vcbm_gym.ENV_IDS)}",
    )
    parser.add_argument("--seed", type=int, default=0, help=f"in [0, {cli.MAX_SEED}]")
    parser.add_argument("--log-dir", default=None, help="default: runs/<algo>/<env>/seed<seed>")
    parser.add_argument(
        "--config", default=None, help="YAML file of hyperparameters (flat, keyed by env id, or a run's config.yml)"
    )
    parser.add_argument("--hyperparams", nargs="*", action="extend", default=[], metavar="KEY=VALUE")
    parser.add_argument("--max-episodes", type=int, default=None, help="episode cap (tabular and SB3 runs)")
    parser.add_argument("--overwrite", action="store_true", help="replace the run already in --log-dir")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def _looks_like_a_path(text: str) -> bool:
    """A file path where a module or env id was expected: "./envs.py", "/tmp/x", "~/x", "a/b/c", "C:\\x"."""
    return (
        text.startswith((".", "/", "~", "\\"))
        or "\\" in text
        or text.count("/") > 1
        or text.endswith((".py", "/"))
        or "/." in text
    )


def check_env_id(env_id: str) -> None:
    """A registered id, or Gymnasium's "module:EnvId" (the module is imported first: it registers the env), whose
    optional extra (bsuite, mujoco) is installed.

    A module that fails to import, for whatever reason (a SyntaxError, a RuntimeError raised at import,
    a sys.exit), and an id that is a file path are one line each: the module's own code is not ours."""
    module, _, name = env_id.rpartition(":")
    expected_ids = ", ".join(vcbm_gym.ENV_IDS + vcbm_gym.DELAYED_ENV_IDS)
    # `bsuite:` names a setting that vcbm_gym registers itself: never a module to import (without the bsuite
    # extra that import would fail, and a bsuite.py in the working directory would run)
    if module and module != "bsuite":
        if _looks_like_a_path(module):
            raise VcbmGymError(
                f"--env {env_id!r}: {module!r} is not a module name; expected module:EnvId with an importable "
                "module (dotted name, e.g. mypackage.envs:MyEnv-v0), not a file path"
            )
        try:
            importlib.import_module(module)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 (any failure of someone else's module is one line)
            first = str(exc).strip().splitlines()
            detail = f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
            raise VcbmGymError(
                f"--env {env_id!r}: module {module!r} cannot be imported ({detail}); "
                "expected an importable module that registers the env"
            ) from None
    if module == "bsuite" and env_id_problem(env_id) is not None:  # bsuite:<not a setting>, even a registered id
        raise VcbmGymError(env_id_problem(env_id))
    if name not in gym.registry:
        if _looks_like_a_path(name):
            raise VcbmGymError(
                f"--env {env_id!r} looks like a file path; expected a registered Gymnasium id (or module:id) such as: "
                f"{expected_ids}"
            )
        problem = env_id_problem(env_id)  # a bsuite id off its experiment's sweep: name the valid settings
        if problem is not None:
            raise VcbmGymError(problem)
        raise VcbmGymError(
            f"unknown env id {env_id!r}; expected a registered Gymnasium id (or module:id) such as: {expected_ids}"
        )
    extra = env_extra(env_id)
    if extra is not None:
        require_extra(f"--env {env_id}", extra)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, Arm]:
    """The command line and the arm that trains its algo. The arm's flags (--credit among them) are added before
    anything is parsed with help on, so that `--algo ALGO --help` lists them; without --algo, help says where."""
    first = cli.ArgumentParser(add_help=False)
    first.add_argument("--algo", default=None)
    try:
        known, _ = first.parse_known_args(argv)
    except VcbmGymError:  # a malformed --algo: the full parser below says so in its one line
        known = argparse.Namespace(algo=None)
    parser = build_parser()
    parser.add_argument("--resume", action="store_true", help="continue the run in --log-dir (same config only)")
    arm = None
    if known.algo is not None and canonical_algo(known.algo) in ALGOS:
        arm = get_arm(known.algo)
        arm.add_arguments(parser)
    else:
        parser.epilog = "--credit RULE and the flags of an algo's arm: python -m algorithms.train --algo ALGO --help"
    args = parser.parse_args(argv)
    return args, arm if arm is not None else get_arm(args.algo)


def resolve_spec(
    algo: str, env: str, seed: int, overrides: Mapping[str, Any] | None = None, config_file: str | None = None
) -> RunSpec:
    """The run of `algo` on `env`: zoo YAML, then `config_file`, then `overrides` (already parsed values), each with
    its own cpu_overrides folded in on a machine without a CUDA GPU, resolved and checked by the arm. compare, tune and
    suite build their runs with this, in memory."""
    cli.check_seed(seed)
    check_env_id(env)
    algo = canonical_algo(algo)
    arm = get_arm(algo)
    mapping = on_this_machine(zoo_hyperparams(algo, env))
    if config_file:
        mapping.update(on_this_machine(user_config(config_file, env, gym.registry.keys(), algo=algo)))
    mapping.update(on_this_machine(dict(overrides or {})))
    return arm.resolve(algo, env, seed, mapping)


def resolve(args: argparse.Namespace, arm: Arm) -> RunSpec:
    """Fold --hyperparams (parsed here, the one time a command line's are) and the arm's flags into one run."""
    overrides = parse_overrides(args.hyperparams)
    if args.max_episodes is not None:
        overrides["max_episodes"] = args.max_episodes
    overrides.update(arm.flag_hyperparams(args))
    return resolve_spec(args.algo, args.env, args.seed, overrides, args.config)


def resolve_argv(argv: Sequence[str]) -> RunSpec:
    """The run a train command line describes, without running it (benchmarks that keep their runs as
    command lines key reuse on it; compare, tune and suite build RunSpecs in memory with resolve_spec)."""
    args, arm = parse(list(argv))
    return resolve(args, arm)


def _has_checkpoint(log_dir: Path) -> bool:
    """A complete checkpoint of a run that resumes itself (the LLM arm): what a failed run leaves to resume from."""
    return any((log_dir / "checkpoints").glob(f"checkpoint-*/{COMPLETE_MARKER}"))


@contextlib.contextmanager
def _quiet_writer_threads() -> Iterator[None]:
    """TensorBoard's writer thread keeps a failed write for the run's own thread to raise at its next write, flush
    or close, and raises it in its own thread too, where Python prints its traceback: for lack of space that second
    report is dropped (the run's error is the one line)."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if cli.space_error(args.exc_value) is None:
            previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


def _on_main_process_first(action: Callable[[], Any]) -> Any:
    """Run `action` on process 0 only and hand its result, or its error, to every process.

    Several processes of one run share its log dir: if each applied the log-dir policy itself, the
    first to write config.yml would make the others refuse the directory as "already holds a run".
    """
    import torch
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    state = PartialState(cpu=not torch.cuda.is_available())
    outcome: list[Any] = [None]
    if state.is_main_process:
        try:
            outcome = [("ok", action())]
        except VcbmGymError as error:
            outcome = [("error", str(error))]
        except Exception as error:
            # the peers wait in the broadcast: they stop with one line, process 0 shows the traceback
            broadcast_object_list([("error", f"process 0 failed to prepare the log dir ({type(error).__name__})")], 0)
            raise
    broadcast_object_list(outcome, from_process=0)
    kind, value = outcome[0]
    if kind == "error":
        raise VcbmGymError(value)
    return value


def execute(spec: RunSpec, log_dir: str | Path, options: RunOptions | None = None) -> dict[str, Any]:
    """Train `spec` into `log_dir` and return the summary (also written to summary.json).

    Under a multi-process launch (torchrun, accelerate launch: WORLD_SIZE > 1) every process runs this;
    process 0 alone applies the log-dir policy and writes config.yml and summary.json. Only arms that
    declare `multi_process` (the LLM arm) accept such a launch.
    """
    arm, log_dir, options = get_arm(spec.algo), Path(log_dir), options or RunOptions()
    world_size = cli.launch_world_size()
    if world_size > 1 and not arm.multi_process:
        raise VcbmGymError(
            f"--algo {spec.algo!r} runs in one process, but this launch has WORLD_SIZE={world_size}; "
            "expected a plain `python -m algorithms.train` (only the LLM algorithms train on several processes)"
        )
    record = {**spec.identity(), "config_hash": spec.config_hash, **provenance.environment_record(), **options.record}
    record.update(credit_record(spec.config))  # the rule's name and the distribution it came from, for a rerun
    # the run's objects (SB3 model, LLM config and model path), built dry before the log dir exists:
    # input they refuse leaves nothing on disk, and the corrected command is not refused as a rerun
    arm.validate(spec)
    if options.resume:
        arm.check_resume(spec, str(log_dir))

    with contextlib.ExitStack() as held:

        def prepare() -> dict[str, Any] | None:
            held.enter_context(claimed_log_dir(log_dir, _has_checkpoint))  # for the whole run, on process 0 of a launch
            with out_of_space_is_one_line(log_dir):
                finished = prepare_log_dir(log_dir, spec, options, arm.resumes_itself)
                if finished is None:
                    cli.atomic_write_text(log_dir / "config.yml", yaml.safe_dump(record, sort_keys=False))
            return finished

        finished = prepare() if world_size == 1 else _on_main_process_first(prepare)
        if finished is not None:
            print(f"{log_dir}: this run already finished (same config); nothing to do", file=sys.stderr)
            return finished

        with _quiet_writer_threads(), out_of_space_is_one_line(log_dir):
            start = time.perf_counter()
            result = arm.run(spec, str(log_dir), options)
            summary = {"algo": spec.algo, "env": spec.env, "seed": spec.seed, **result}
            summary["wall_time_s"] = time.perf_counter() - start
            summary["log_dir"] = str(log_dir)
            summary["config_hash"] = record["config_hash"]
            summary = json.loads(cli.json_text(summary))  # as a reader will see it (strict JSON); key order kept (roles)
            summary["checksum"] = summary_checksum(summary)
            if cli.is_launch_main_process():
                cli.atomic_write_json(log_dir / "summary.json", summary)
        return summary


def run(argv: Sequence[str] | None = None, report: Report | None = None) -> dict[str, Any]:
    """Parse a command line, train, and return the summary. `report`, if given, receives the run's progress."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, arm = parse(argv)
    spec = resolve(args, arm)
    log_dir = Path(args.log_dir or Path("runs") / args.algo / args.env / f"seed{args.seed}")
    options = RunOptions(
        progress=not args.no_progress,
        resume=args.resume,
        overwrite=args.overwrite,
        report=report,
        record={"command_line": dict(vars(args)), "argv": argv},
    )
    return execute(spec, log_dir, options)


def _leave_launch_together() -> None:
    """Under a multi-process launch: wait for every process, then close the process group. A process that
    exits while its peers still use the group can abort in gloo's teardown (SIGABRT, "terminate called
    without an active exception"), and torchrun then reports a finished run as failed."""
    torch = sys.modules.get("torch")  # a tabular run never imports it
    if cli.launch_world_size() > 1 and torch is not None and torch.distributed.is_initialized():
        torch.distributed.barrier()
        if "vllm" in sys.modules:  # vLLM's groups first, else its exit handler finds them gone with the world group
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()  # vLLM's world group, then the process group
        else:
            torch.distributed.destroy_process_group()


def _main(argv: list[str]) -> None:
    _report(run(argv))
    _leave_launch_together()  # not after an error: the peers may be inside another collective


def _report(summary: dict[str, Any]) -> None:
    if not cli.is_launch_main_process():
        return  # under torchrun every process returns the same run summary; one report is enough
    skip = {"algo", "env", "seed", "log_dir", "config_hash", "checksum"}
    brief = {
        k: v for k, v in summary.items() if k not in skip and (k == "roles" or isinstance(v, (bool, int, float, str, type(None))))
    }
    tensorboard = f"TensorBoard logs: {summary['log_dir']}  (view with: tensorboard --logdir {summary['log_dir']})"
    # one write, flushed: other processes of a launch share this stdout, and two writes could interleave
    sys.stdout.flush()
    sys.stdout.write(f"{json.dumps(brief)}\n{tensorboard}\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
