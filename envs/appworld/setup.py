"""Create the AppWorld virtual environment and its data (run with the project's interpreter).

    python -m envs.appworld.setup [--venv PATH] [--root PATH] [--download-data] [--tasks-per-scenario N]

1. `python -m venv VENV` and `pip install appworld==0.1.3.post1` there (AppWorld pins pydantic 1,
   fastapi < 0.111 and sqlmodel < 0.0.11, so it cannot share the project's environment), then
   `appworld install`, which unpacks the apps' source into that venv's site-packages.
   Skipped when VENV already has AppWorld installed: the venv is made once per machine.
2. Data under ROOT/data: with --download-data, `appworld download data` (needs internet; the
   real train/dev/test_normal/test_challenge splits). Otherwise synthetic tasks from
   `envs.appworld.synthetic`, regenerated only when the generator's source changed.

Defaults: VENV = $VCBM_APPWORLD_VENV or ~/.cache/vcbm_gym/appworld-venv, ROOT = $VCBM_APPWORLD_ROOT
or ~/.cache/vcbm_gym/appworld. Neither the venv nor the data belongs in the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from envs.appworld.server_process import default_root, default_venv, venv_python

APPWORLD_REQUIREMENT = "appworld==0.1.3.post1"
REPO_ROOT = Path(__file__).resolve().parents[2]
SYNTHETIC_SOURCES = tuple(Path(__file__).with_name(name) for name in ("synthetic.py", "synthetic_tasks.py"))


def _run(command: list[str], **kwargs) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def appworld_installed(venv: Path) -> bool:
    # the apps' source only exists after `appworld install` (checked by path: importing costs seconds)
    return venv_python(venv).exists() and any(venv.glob("lib/python3*/site-packages/appworld/apps/simple_note/apis.py"))


def ensure_venv(venv: Path | None = None) -> Path:
    """Create the AppWorld venv unless it already works; return its path."""
    venv = Path(venv or default_venv()).expanduser()
    if appworld_installed(venv):
        return venv
    if not venv_python(venv).exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv_python(venv)), "-m", "pip", "install", "--quiet", APPWORLD_REQUIREMENT])
    _run([str(venv / "bin" / "appworld"), "install"])
    if not appworld_installed(venv):
        raise RuntimeError(f"`appworld install` in {venv} did not make the apps importable")
    return venv


def synthetic_stamp(tasks_per_scenario: int, seed: int) -> str:
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in SYNTHETIC_SOURCES)).hexdigest()[:16]
    return f"{digest}-{tasks_per_scenario}-{seed}"


def ensure_synthetic_data(venv: Path, root: Path | None = None, tasks_per_scenario: int = 2, seed: int = 0) -> Path:
    """Generate synthetic tasks under ROOT/data unless the same generator already did; return ROOT.

    The tasks are built in a scratch folder and moved into place with one rename, so a server
    never sees a half-written data/ and concurrent callers with the same generator agree.
    """
    root = Path(root or default_root()).expanduser()
    marker = root / "data" / "synthetic.json"
    stamp = synthetic_stamp(tasks_per_scenario, seed)
    if marker.exists() and json.loads(marker.read_text()).get("stamp") == stamp:
        return root
    if (root / "data" / "tasks").is_dir() and not marker.exists():
        raise RuntimeError(f"{root}/data holds non-synthetic AppWorld data; refusing to overwrite it with synthetic tasks")
    root.mkdir(parents=True, exist_ok=True)
    scratch = root / f".synthetic-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        _run(
            [
                str(venv_python(venv)),
                "-m",
                "envs.appworld.synthetic",
                "--out",
                str(scratch),
                "--tasks-per-scenario",
                str(tasks_per_scenario),
                "--seed",
                str(seed),
            ],
            cwd=str(REPO_ROOT),
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=subprocess.DEVNULL,
        )
        info = json.loads((scratch / "data" / "synthetic.json").read_text())
        info["stamp"] = stamp
        (scratch / "data" / "synthetic.json").write_text(json.dumps(info, indent=2))
        if marker.exists() and json.loads(marker.read_text()).get("stamp") == stamp:
            return root  # another process finished the same data first
        shutil.rmtree(root / "data", ignore_errors=True)
        (scratch / "data").rename(root / "data")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return root


def download_data(venv: Path, root: Path) -> Path:
    """`appworld download data` into ROOT. AppWorld deletes ROOT/data before downloading, so an
    existing data/ is first moved aside and put back if the download fails."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    backup = root / "data.before-download"
    if data.exists():
        shutil.rmtree(backup, ignore_errors=True)
        data.rename(backup)
    try:
        _run([str(venv / "bin" / "appworld"), "download", "data", "--root", str(root)])
        if not (data / "tasks").is_dir():  # a failed HTTP download still exits 0
            raise RuntimeError(f"`appworld download data` left no {data}/tasks (no internet access?)")
    except (subprocess.CalledProcessError, OSError, RuntimeError):
        shutil.rmtree(data, ignore_errors=True)
        if backup.exists():
            backup.rename(data)
        raise
    shutil.rmtree(backup, ignore_errors=True)
    return root


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Create the AppWorld venv and data for AppWorld-v0.")
    parser.add_argument(
        "--venv",
        type=Path,
        default=None,
        help="AppWorld venv (default $VCBM_APPWORLD_VENV or ~/.cache/vcbm_gym/appworld-venv)",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="data root (default $VCBM_APPWORLD_ROOT or ~/.cache/vcbm_gym/appworld)",
    )
    parser.add_argument("--download-data", action="store_true", help="download the real AppWorld data (needs internet)")
    parser.add_argument("--tasks-per-scenario", type=int, default=2, help="synthetic tasks per scenario")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic tasks")
    args = parser.parse_args(argv)
    start = time.monotonic()
    venv = ensure_venv(args.venv)
    print(f"AppWorld venv ready at {venv} ({time.monotonic() - start:.0f} s)", flush=True)
    root = Path(args.root or default_root()).expanduser()
    if args.download_data:
        download_data(venv, root)
    else:
        ensure_synthetic_data(venv, root, args.tasks_per_scenario, args.seed)
    print(f"AppWorld data ready at {root}/data ({time.monotonic() - start:.0f} s)")
    print(f"export VCBM_APPWORLD_VENV={venv} VCBM_APPWORLD_ROOT={root}")


if __name__ == "__main__":
    main()
