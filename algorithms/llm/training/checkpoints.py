"""The LOOP trainer's additions to TRL's checkpoints: the credit rule's state (its numpy arrays in an npz,
the rest as JSON beside the loop's counters) and a marker written last, so that a checkpoint cut short
is never resumed from. The checkpoint a resume picks has its files opened as the trainer will open them
(torch's weights-only loader, safetensors, JSON) before anything is built from it: a file that is not what a
checkpoint holds (replaced, cut short, tampered with) is one line naming it, as the credit rule's state is."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.common import cli
from algorithms.common.errors import VcbmGymError

CREDIT_STATE_FILE = "credit_state.npz"  # the rule's state_dict arrays; the rest is in LOOP_STATE_FILE
LOOP_STATE_FILE = "loop_state.json"
COMPLETE_MARKER = "loop_checkpoint_complete"  # written last: a checkpoint without it was cut short
TORCH_SUFFIXES = (".pt", ".pth", ".bin")  # torch.save archives: optimizer, scheduler, RNG state, scaler, weights
NOT_RESUMED = frozenset({"training_args.bin"})  # the Trainer's arguments, pickled whole: a resume never loads them


def split_state(obj: Any, arrays: dict[str, np.ndarray], path: str = "") -> Any:
    """A rule's state_dict as JSON-able values, its numpy arrays moved into `arrays` (by path)."""
    if isinstance(obj, dict):
        return {str(k): split_state(v, arrays, f"{path}/{k}" if path else str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [split_state(v, arrays, f"{path}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, np.ndarray):
        arrays[path] = obj
        return {"__array__": path}
    return obj.item() if isinstance(obj, np.generic) else obj


def join_state(obj: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The inverse of split_state."""
    if isinstance(obj, dict):
        if set(obj) == {"__array__"}:
            return arrays[obj["__array__"]]
        return {k: join_state(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [join_state(v, arrays) for v in obj]
    return obj


def latest_complete_checkpoint(folder: str | Path) -> str | None:
    """The newest checkpoint-N under `folder` that carries the completion marker (None if none does), its files
    checked (check_checkpoint_files): a newest one that fails the check is one line, never passed over."""
    found = []
    for path in Path(folder).glob("checkpoint-*"):
        step = path.name.removeprefix("checkpoint-")
        if step.isdigit() and (path / COMPLETE_MARKER).is_file():
            found.append((int(step), str(path)))
    if not found:
        return None
    newest = max(found)[1]
    check_checkpoint_files(newest)
    return newest


def check_checkpoint_files(folder: str | Path) -> None:
    """Open every file of the checkpoint `folder` that a resume loads as its loader does, without building anything:
    torch archives with the weights-only unpickler (numpy's RNG state allowed, as the Trainer allows it), safetensors
    files by their header, JSON files whole. The first that fails is one line naming it."""
    import torch
    from safetensors import safe_open
    from transformers.trainer_pt_utils import safe_globals

    for path in sorted(Path(folder).iterdir()):
        if not path.is_file() or path.name in NOT_RESUMED:
            continue
        try:
            if path.suffix in TORCH_SUFFIXES:
                if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a bare pickle is not one
                    raise ValueError("not a torch.save archive")
                with safe_globals():
                    torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            elif path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt") as weights:
                    weights.keys()
            elif path.suffix == ".json":
                json.loads(path.read_text())
        except Exception as exc:  # noqa: BLE001 (whatever the loader raises, the file is not one a checkpoint holds)
            raise VcbmGymError(
                f"checkpoint file {str(path)!r} is not one this project's checkpoints hold, or is corrupt "
                f"({type(exc).__name__}); expected the files a completed checkpoint writes, or --overwrite to start "
                "the run again"
            ) from None


def save_loop_state(folder: str | Path, credit: str, credit_state: dict[str, Any], loop_state: dict[str, Any]) -> None:
    """Write the rule's state and the loop's counters into a TRL checkpoint folder, the marker last."""
    folder = Path(folder)
    arrays: dict[str, np.ndarray] = {}
    plain = split_state(credit_state, arrays)
    with open(folder / f".{CREDIT_STATE_FILE}.tmp", "wb") as f:
        np.savez(f, **arrays)
    os.replace(folder / f".{CREDIT_STATE_FILE}.tmp", folder / CREDIT_STATE_FILE)
    cli.atomic_write_text(folder / LOOP_STATE_FILE, json.dumps({**loop_state, "credit": credit, "credit_state": plain}))
    (folder / COMPLETE_MARKER).write_text("")


def load_loop_state(folder: str | Path, credit: str, rule: Any) -> dict[str, Any]:
    """Restore `rule` (named `credit`) from the state `save_loop_state` wrote, and return the loop's counters;
    a missing, cut-short, non-finite or mismatched state is one line."""
    folder = Path(folder)
    try:
        with np.load(folder / CREDIT_STATE_FILE) as data:
            arrays = {k: data[k] for k in data.files}
        state = json.loads((folder / LOOP_STATE_FILE).read_text())
        if state.get("credit") != credit:
            raise ValueError(f"saved by credit rule {state.get('credit')!r}, this run's is {credit!r}")
        bad = [k for k, v in arrays.items() if v.dtype.kind == "f" and not np.isfinite(v).all()]
        if bad:
            raise ValueError(f"non-finite values in {', '.join(bad)}")
        rule.load_state_dict(join_state(state.pop("credit_state"), arrays))
        return state
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:  # zip and JSON errors are ValueErrors too
        raise VcbmGymError(
            f"checkpoint {str(folder)!r}: unreadable credit-rule state or loop state ({exc}); "
            "expected the files a completed checkpoint writes"
        ) from None
