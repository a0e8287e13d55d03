"""Every CLI, driven with generated malformed flags, files and env ids (hypothesis): exit code 2, exactly
one stderr line starting `error:`, and the output location byte for byte as it was before the call.

Each CLI's `main(argv)` runs in this process (as `python -m` would run it, without the interpreter's
start-up) inside a scratch directory that holds the inputs and every output location the commands
name (`--log-dir`, `--out`, `--storage`, default `runs/...`). The whole scratch tree (files with their
bytes, and directories, so that an empty directory left behind counts) is compared before and after.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from algorithms import evaluate, train
from algorithms.experiment import compare, plot, tune

PROPERTY = settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
# env ids that name a file, not a registered id or an importable module
PATH_LIKE_ENV_IDS = [
    "./foo.py:X-v0",
    "foo.py:X-v0",
    "/tmp/x",
    "/tmp/envs.py:X-v0",
    "a/b/c",
    "../WatchRepair-v0",
    "~/envs:X-v0",
    "runs/mc/",
    "a/b:X-v0",
    "envs\\x.py:X-v0",
]
# modules (written to a folder on sys.path) that fail to import for reasons other than ImportError
FAILING_MODULES = {
    "cliprop_raises_runtime": "raise RuntimeError('broken at import')\n",
    "cliprop_raises_value": "raise ValueError('bad constant')\n",
    "cliprop_exits": "import sys\nsys.exit(3)\n",
    "cliprop_syntax": "def broken(:\n",
    "cliprop_zero_division": "x = 1 / 0\n",
}
LOWER = "abcdefghijklmnopqrstuvwxyz"


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root: a file's bytes, None for a directory."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def describe_change(before: dict, after: dict) -> str:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return f"added {added[:5]}, removed {removed[:5]}, changed {changed[:5]}"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """Inputs the cases name: files of every malformed kind, a finished run, a run with a corrupt
    config.yml, a directory that is no run, and modules that fail at import."""
    root = tmp_path_factory.mktemp("cli_properties")
    (root / "a_file").write_text("not a directory\n")
    inputs = root / "inputs"
    inputs.mkdir()
    (inputs / "binary.yml").write_bytes(bytes(range(256)) * 4)
    (inputs / "list.yml").write_text("- 1\n- 2\n")
    (inputs / "unclosed.yml").write_text("z_thresh: [4.0\n")
    (inputs / "garbage.journal").write_bytes(bytes(range(255, -1, -1)) * 3)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        train.run(["--algo", "mc", "--max-episodes", "5", "--log-dir", "runs/finished", "--no-progress"])
    finally:
        os.chdir(cwd)
    corrupt = root / "runs" / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.yml").write_bytes(b"algo: mc\nhyperparams: {max_episodes: [\n\x00\x01")
    (corrupt / "events.out.tfevents.0").write_bytes(b"")
    (root / "not_a_run").mkdir()
    (root / "not_a_run" / "notes.txt").write_text("mine\n")
    previous_tune = root / "tune_out"
    previous_tune.mkdir()
    (previous_tune / "tune_config.yml").write_text("algo: mc\nenv: WatchRepair-v0\ntrials: 3\n")
    modules = tmp_path_factory.mktemp("cli_property_modules")  # outside the snapshot: Python may cache there
    for name, source in FAILING_MODULES.items():
        (modules / f"{name}.py").write_text(source)
    return root, modules


def _input_file(root: Path, content: bytes, suffix: str) -> str:
    """A file of generated content under inputs/ (named by its hash: the same content, the same file)."""
    path = root / "inputs" / f"gen-{hashlib.sha256(content).hexdigest()[:12]}{suffix}"
    if not path.exists():
        path.write_bytes(content)
    return str(path.relative_to(root))


@contextlib.contextmanager
def inside(root: Path, modules: Path):
    cwd, dont_write = os.getcwd(), sys.dont_write_bytecode
    os.chdir(root)
    sys.path.insert(0, str(modules))
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        sys.path.remove(str(modules))
        sys.dont_write_bytecode = dont_write
        os.chdir(cwd)


def restore(root: Path, before: dict[str, bytes | None]) -> None:
    """Put the tree back as `before` (after a command that changed it), so that the next case starts clean."""
    for rel in sorted(set(snapshot(root)) - set(before), key=lambda r: -r.count(os.sep)):
        path = root / rel
        if path.is_dir() and not path.is_symlink():
            for child in sorted(path.rglob("*"), key=lambda p: -len(p.parts)):
                child.rmdir() if child.is_dir() else child.unlink()
            path.rmdir()
        elif path.exists():
            path.unlink()
    for rel, content in before.items():
        path = root / rel
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
        elif not path.is_file() or path.read_bytes() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)


def check_refused(module, argv: list[str], scratch, capsys) -> None:
    root, modules = scratch
    with inside(root, modules):
        before = snapshot(root)
        capsys.readouterr()
        try:
            code = module.main(argv)
        except BaseException as exc:  # noqa: BLE001 (a traceback is the failure this test looks for)
            code = f"raised {type(exc).__name__}: {exc}"
        err = capsys.readouterr().err
        after = snapshot(root)
        restore(root, before)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"{module.__name__} {argv}: exit {code!r}; stderr: {err[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{module.__name__} {argv}: stderr: {err[-2000:]}"
    assert before == after, f"{module.__name__} {argv} changed the output location: {describe_change(before, after)}"


# ------------------------------------------------------------------ strategies
env_id = st.one_of(
    st.sampled_from(PATH_LIKE_ENV_IDS),
    st.sampled_from(sorted(FAILING_MODULES)).map(lambda m: f"{m}:X-v0"),
    st.text(alphabet=LOWER + "-_", min_size=1, max_size=10).map(lambda t: f"NoSuch{t}-v0"),
    st.lists(st.sampled_from(["..", ".", "runs", "x", "~", "tmp"]), min_size=2, max_size=4).map("/".join),
)


def malformed_yaml(root: Path):
    """Files that are not a config: binary, not a mapping, broken YAML, unknown keys."""
    return st.one_of(
        st.binary(max_size=48).map(lambda b: _input_file(root, b"\x00" + b, ".yml")),
        st.sampled_from(["binary.yml", "list.yml", "unclosed.yml"]).map(lambda n: f"inputs/{n}"),
        st.sampled_from(["[", "{a: ", "- x\n- y\n", "42\n", "'unterminated\n", "a: b: c\n"]).map(
            lambda t: _input_file(root, t.encode(), ".yml")
        ),
        st.text(alphabet=LOWER + "_", min_size=1, max_size=10).map(lambda k: _input_file(root, f"zz_{k}: 1\n".encode(), ".yml")),
    )


POLICY_KEYS = {"net_arch", "activation_fn", "ortho_init", "use_sde", "log_std_init", "full_std", "use_expln"}


def train_cases(root: Path):
    run = ["--log-dir", "out/run", "--no-progress"]
    sb3_algo = st.sampled_from(["ppo", "a2c", "dqn"])
    unknown_policy_key = st.text(alphabet=LOWER + "_", min_size=1, max_size=10).filter(lambda k: k not in POLICY_KEYS)
    return st.one_of(
        env_id.map(lambda e: ["--algo", "mc", "--env", e, *run]),
        malformed_yaml(root).map(lambda path: ["--algo", "vcbm", "--config", path, *run]),
        # SB3 constructor arguments it refuses
        st.tuples(sb3_algo, unknown_policy_key, st.integers(-5, 5)).map(
            lambda a: ["--algo", a[0], "--hyperparams", f"policy_kwargs={{{a[1]}: {a[2]}}}", *run]
        ),
        st.tuples(sb3_algo, st.lists(st.integers(max_value=0), min_size=1, max_size=3)).map(
            lambda a: ["--algo", a[0], "--hyperparams", f"policy_kwargs={{net_arch: {a[1]}}}", *run]
        ),
        st.tuples(st.sampled_from(["ppo", "a2c"]), st.integers(10**11, 10**15)).map(
            lambda a: ["--algo", a[0], "--hyperparams", f"n_steps={a[1]}", *run]
        ),
        st.integers(10**12, 10**16).map(lambda n: ["--algo", "dqn", "--hyperparams", f"buffer_size={n}", *run]),
        # the LLM arm: no iteration to run, a model that is not there
        st.integers(-3, 0).map(
            lambda n: ["--algo", "loop", "--env", "TextWatchRepair-v0", "--model", "tiny-random", "--iterations", str(n), *run]
        ),
        st.text(alphabet=LOWER, min_size=1, max_size=8).map(
            lambda n: [
                "--algo",
                "vcbm-loop",
                "--env",
                "TextWatchRepair-v0",
                "--model",
                f"./missing-{n}",
                "--iterations",
                "1",
                *run,
            ]
        ),
        # log dirs that hold something else
        st.just(["--algo", "mc", "--max-episodes", "5", "--log-dir", "runs/finished"]),
        st.just(["--algo", "mc", "--max-episodes", "6", "--log-dir", "runs/finished", "--resume"]),
        st.sampled_from([[], ["--resume"]]).map(lambda flags: ["--algo", "mc", "--log-dir", "runs/corrupt", *flags]),
        st.just(["--algo", "mc", "--log-dir", "not_a_run", "--overwrite"]),
        st.just(["--algo", "mc", "--log-dir", "a_file/run"]),
    )


def compare_cases(root: Path):
    out = ["--out", "out/cmp", "--no-progress"]
    return st.one_of(
        # validated only after --out and its lock exist (another branch moves the checks first)
        st.text(alphabet=LOWER, min_size=1, max_size=8)
        .filter(lambda a: a not in train.ALGOS)
        .map(lambda a: ["--algos", a, *out]),
        env_id.map(lambda e: ["--algos", "mc", "--env", e, *out]),
        st.just(["--algos", "mc", "--hyperparams", "log_interval=0", *out]),
        # validated before
        st.integers(max_value=0).map(lambda n: ["--algos", "mc", "--seeds", str(n), *out]),
        st.integers(max_value=-1).map(lambda n: ["--algos", "mc", "--workers", str(n), *out]),
        st.just(["--algos", "mc", "mc", *out]),
        st.just(["--algos", "mc", "--out", "a_file"]),
    )


def tune_cases(root: Path):
    out = ["--out", "out/tune"]
    return st.one_of(
        st.integers(max_value=0).map(lambda n: ["--algo", "mc", "--trials", str(n), *out]),
        st.text(alphabet=LOWER, min_size=1, max_size=8)
        .filter(lambda a: a not in train.ALGOS)
        .map(lambda a: ["--algo", a, "--trials", "1", *out]),
        env_id.map(lambda e: ["--algo", "mc", "--env", e, "--trials", "1", *out]),
        malformed_yaml(root).map(lambda path: ["--algo", "mc", "--trials", "1", "--search-space", path, *out]),
        # a journal that is not one (another branch checks it before writing tune_config.yml)
        st.sampled_from(["out/tune", "tune_out"]).map(
            lambda o: ["--algo", "mc", "--trials", "1", "--max-episodes", "20", "--out", o, "--storage", "inputs/garbage.journal"]
        ),
    )


def plot_cases(root: Path):
    return st.one_of(
        # the run dirs are checked after the --out directory is made (another branch checks them first)
        st.text(alphabet=LOWER, min_size=1, max_size=8).map(lambda d: [f"missing-{d}", "--out", "out/plot/curves.png"]),
        st.just(["not_a_run", "--out", "out/plot/curves.png"]),
        st.text(alphabet=LOWER + ".", min_size=1, max_size=6)
        .filter(lambda s: not s.lower().endswith(".png"))
        .map(lambda s: ["runs/finished", "--out", f"out/{s}"]),
        st.integers(max_value=1).map(lambda n: ["runs/finished", "--out", "out/c.png", "--points", str(n)]),
        st.text(alphabet=LOWER, min_size=1, max_size=8)
        .filter(lambda g: g not in plot.GROUP_BY)
        .map(lambda g: ["runs/finished", "--out", "out/c.png", "--group-by", g]),
        st.just(["runs/finished", "--out", "a_file/c.png"]),
    )


def evaluate_cases(root: Path):
    out = ["--out", "out/eval"]
    bad_json = st.one_of(
        st.binary(min_size=1, max_size=48).filter(lambda b: not b.strip().startswith(b"{")),
        st.sampled_from([b"{}", b"[]", b'{"*": "print(1)"}', b'{"t": [1, 2]}', b"null", b'{"*": [["x"]]}']),
    )
    return st.one_of(
        bad_json.map(lambda b: ["--model", f"scripted:{_input_file(root, b, '.json')}", *out]),
        st.text(alphabet=LOWER, min_size=1, max_size=8).map(lambda n: ["--model", f"./missing-{n}", *out]),
        st.just(["--model", "not_a_run", *out]),
        st.integers(max_value=-1).map(lambda n: ["--model", "scripted:oracle", "--max-tasks", str(n), *out]),
        env_id.map(lambda e: ["--model", "scripted:oracle", "--env", e, *out]),
        st.just(["--model", "scripted:oracle", "--out", "a_file"]),
        st.just(["--model", "scripted:oracle", "--out", "a_file/eval"]),
    )


# ------------------------------------------------------------------ the properties
@pytest.mark.parametrize(
    "module, cases",
    [(train, train_cases), (compare, compare_cases), (tune, tune_cases), (plot, plot_cases), (evaluate, evaluate_cases)],
    ids=["train", "compare", "tune", "plot", "evaluate"],
)
def test_malformed_input_is_one_error_line_exit_2_and_leaves_the_output_location_as_it_was(module, cases, scratch, capsys):
    @PROPERTY
    @given(argv=cases(scratch[0]))
    def check(argv):
        check_refused(module, argv, scratch, capsys)

    check()


# One case of each class, named, so that a failure says which class regressed.
NAMED_CASES = [
    (train, ["--algo", "mc", "--env", "./foo.py:X-v0", "--log-dir", "out/run"]),
    (train, ["--algo", "mc", "--env", "cliprop_raises_runtime:X-v0", "--log-dir", "out/run"]),
    (train, ["--algo", "mc", "--env", "cliprop_exits:X-v0", "--log-dir", "out/run"]),
    (train, ["--algo", "ppo", "--hyperparams", "policy_kwargs={foo: 1}", "--log-dir", "out/run"]),
    (train, ["--algo", "ppo", "--hyperparams", "policy_kwargs={net_arch: [-4]}", "--log-dir", "out/run"]),
    (train, ["--algo", "ppo", "--hyperparams", "n_steps=1000000000000", "--log-dir", "out/run"]),
    (
        train,
        ["--algo", "loop", "--env", "TextWatchRepair-v0", "--model", "tiny-random", "--iterations", "0", "--log-dir", "out/run"],
    ),
    (
        train,
        ["--algo", "loop", "--env", "TextWatchRepair-v0", "--model", "./no-model", "--iterations", "1", "--log-dir", "out/run"],
    ),
    (train, ["--algo", "mc", "--log-dir", "runs/corrupt"]),
    (train, ["--algo", "mc", "--log-dir", "not_a_run", "--overwrite"]),
    (compare, ["--algos", "nosuch", "--out", "out/cmp"]),
    (tune, ["--algo", "mc", "--trials", "1", "--max-episodes", "20", "--out", "tune_out", "--storage", "inputs/garbage.journal"]),
    (plot, ["missing", "--out", "out/plot/curves.png"]),
    (evaluate, ["--model", "scripted:inputs/list.yml", "--out", "out/eval"]),
    (evaluate, ["--model", "./no-model", "--out", "out/eval"]),
]


@pytest.mark.parametrize(
    "module, argv", NAMED_CASES, ids=[f"{m.__name__.rsplit('.', 1)[1]}:{' '.join(a[:6])}" for m, a in NAMED_CASES]
)
def test_each_class_of_malformed_input_is_refused_without_a_trace(module, argv, scratch, capsys):
    check_refused(module, argv, scratch, capsys)


def test_the_snapshot_sees_an_empty_directory_and_a_rewritten_file(tmp_path):
    """The comparison itself: a directory left behind, or the same name with other bytes, is a change."""
    (tmp_path / "f").write_bytes(b"a")
    before = snapshot(tmp_path)
    (tmp_path / "empty").mkdir()
    assert snapshot(tmp_path) != before
    (tmp_path / "empty").rmdir()
    (tmp_path / "f").write_bytes(b"b")
    assert snapshot(tmp_path) != before
    (tmp_path / "f").write_bytes(b"a")
    assert snapshot(tmp_path) == before and json.dumps(sorted(before)) == '["f"]'
