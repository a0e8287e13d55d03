import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def run_cli(tmp_path):
    """Run `python -m <module> args...` in a subprocess from the repo root."""

    def _run(module: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.run(
            [sys.executable, "-m", module, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return _run
