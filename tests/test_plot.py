"""`algorithms.plot`: learning curves across seeds from TensorBoard logs, for the tabular, SB3 and LLM arms."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import yaml

from algorithms.common.errors import VcbmGymError
from algorithms.common.scalar_writer import ScalarWriter
from algorithms.experiment.plot import find_runs, hold_on_grid, learning_curves
from algorithms.experiment.plot import run as plot


def _run_dir(path, algo, scalars, hyperparams=None):
    """A log dir as algorithms.train leaves it: config.yml plus TensorBoard scalars {step: {tag: value}}."""
    path.mkdir(parents=True)
    record = {"algo": algo, "env": "WatchRepair-v0", "seed": 0, "hyperparams": hyperparams or {}, "config_hash": "x"}
    (path / "config.yml").write_text(yaml.safe_dump(record))
    writer = ScalarWriter(path / "sub" if algo in ("ppo", "a2c", "dqn") else path)  # SB3 logs into a subdirectory
    for step, values in scalars.items():
        writer.add_scalars(step, values)
    writer.close()
    return path


def test_hold_on_grid_is_the_last_value_logged_at_or_before_each_point():
    x, y = np.array([1.0, 3.0, 4.0]), np.array([10.0, 30.0, 40.0])
    np.testing.assert_array_equal(hold_on_grid(x, y, np.array([1, 2, 3, 3.5, 4, 9])), [10, 10, 30, 30, 40, 40])


def test_mean_and_band_across_seeds_with_runs_that_stop_early(tmp_path):
    tag = "train/correct_moving_average"
    # seed 0 converges and stops at episode 2; seed 1 runs to episode 4
    _run_dir(tmp_path / "cmp" / "vcbm" / "seed0", "vcbm", {1: {tag: 0.5}, 2: {tag: 0.96}})
    _run_dir(tmp_path / "cmp" / "vcbm" / "seed1", "vcbm", {1: {tag: 0.1}, 2: {tag: 0.3}, 3: {tag: 0.5}, 4: {tag: 0.97}})
    _run_dir(tmp_path / "cmp" / "mc" / "seed0", "mc", {1: {tag: 0.2}, 4: {tag: 0.4}})
    runs = find_runs([tmp_path / "cmp"])
    assert len(runs) == 3
    data = learning_curves({"vcbm": runs[1:], "mc": runs[:1]}, "correct", points=4)
    vcbm = data["methods"]["vcbm"]
    assert vcbm["x"] == [1.0, 2.0, 3.0, 4.0] and data["x_label"] == "episodes"
    # the stopped seed holds 0.96 after episode 2
    np.testing.assert_allclose(vcbm["mean"], [(0.5 + 0.1) / 2, (0.96 + 0.3) / 2, (0.96 + 0.5) / 2, (0.96 + 0.97) / 2])
    # two seeds: every bootstrap resample is one of {a, a}, {a, b}, {b, b}: the 95% band spans both seeds
    np.testing.assert_allclose(vcbm["ci_low"], [0.1, 0.3, 0.5, 0.96])
    np.testing.assert_allclose(vcbm["ci_high"], [0.5, 0.96, 0.96, 0.97])
    np.testing.assert_allclose(data["methods"]["mc"]["mean"], [0.2, 0.2, 0.2, 0.4])


def test_cli_draws_png_and_svg_for_sb3_and_llm_runs(tmp_path, capsys):
    # SB3 logs against timesteps; rollout/episodes at the same steps gives the x axis in episodes
    for seed, rate in enumerate((0.4, 0.6)):
        _run_dir(
            tmp_path / "sb3" / f"seed{seed}",
            "ppo",
            {
                3200: {"rollout/correct_moving_average": rate, "rollout/episodes": 64},
                6400: {"rollout/correct_moving_average": rate + 0.2, "rollout/episodes": 128},
            },
            hyperparams={"credit": "vcbm_bookmark"},
        )
    out = tmp_path / "figs" / "sb3.png"
    data = plot([str(tmp_path / "sb3"), "--out", str(out), "--points", "2"])
    assert out.stat().st_size > 0 and out.with_suffix(".svg").read_text().startswith("<?xml")
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["settings"]["metric"] == "correct" and saved["methods"] == json.loads(json.dumps(data["methods"]))
    m = data["methods"]["ppo+vcbm_bookmark"]
    assert m["x"] == [64.0, 128.0] and m["mean"] == pytest.approx([0.5, 0.7]) and m["tags"] == ["rollout/correct_moving_average"]
    assert "ppo+vcbm_bookmark: 2 run(s)" in capsys.readouterr().out

    for algo in ("loop", "vcbm-loop"):
        _run_dir(
            tmp_path / "llm" / algo / "seed0",
            algo,
            {i: {"loop/task_goal_completion": i / 10, "loop/mean_return": i} for i in range(1, 6)},
        )
    data = plot([str(tmp_path / "llm"), "--metric", "return", "--out", str(tmp_path / "llm.png"), "--group-by", "parent"])
    assert set(data["methods"]) == {"loop", "vcbm-loop"} and data["x_label"] == "iterations"
    assert data["methods"]["loop"]["mean"][-1] == 5


def test_bad_input_is_one_clear_error(tmp_path):
    _run_dir(tmp_path / "tab" / "seed0", "vcbm", {1: {"train/correct_moving_average": 0.5}})
    _run_dir(tmp_path / "llm" / "seed0", "loop", {1: {"loop/task_goal_completion": 0.5}})
    with pytest.raises(VcbmGymError, match="logged no scalar 'nope'; expected one of: train/correct_moving_average"):
        plot([str(tmp_path / "tab"), "--metric", "nope", "--out", str(tmp_path / "a.png")])
    with pytest.raises(VcbmGymError, match="x axes differ .*episodes for vcbm.*iterations for loop"):
        plot([str(tmp_path / "tab"), str(tmp_path / "llm"), "--out", str(tmp_path / "a.png")])
    with pytest.raises(VcbmGymError, match="does not exist"):
        plot([str(tmp_path / "missing"), "--out", str(tmp_path / "a.png")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(VcbmGymError, match="holds no run"):
        plot([str(tmp_path / "tab"), str(tmp_path / "empty"), "--out", str(tmp_path / "a.png")])
    with pytest.raises(VcbmGymError, match="expected a file name ending in .png"):
        plot([str(tmp_path / "tab"), "--out", str(tmp_path / "a.pdf")])


def test_llm_runs_with_another_credit_rule_than_their_zoo_entry_are_their_own_method(tmp_path):
    from algorithms.experiment.plot import method_label

    def label(algo, credit):
        return method_label(tmp_path, {"algo": algo, "hyperparams": {"credit": credit}})

    assert label("loop", "loo") == "loop" and label("vcbm-loop", "vcbm_blend") == "vcbm-loop"
    assert label("loop", "gigpo") == "loop+gigpo" and label("ppo", "loo") == "ppo+loo"
    assert label("ppo", "none") == "ppo" and label("ppo", None) == "ppo"
    # the tabular credit slot (td, mc): a rule is a method of its own, as compare's td+rudder is
    assert label("td", "rudder") == "td+rudder" and label("td", "none") == "td" and label("vcbm", None) == "vcbm"


def _record_offsets(path) -> list[tuple[int, int]]:
    """(offset, data length) of every record, from the TFRecord framing: 8-byte length, its 4-byte CRC, data, 4-byte CRC."""
    raw, out, offset = path.read_bytes(), [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<Q", raw, offset)
        out.append((offset, length))
        offset += 16 + length
    assert offset == len(raw)
    return out


def _two_seeds(tmp_path):
    """Two tabular seeds logging correct_moving_average at episodes 1..6; the event file of seed 1."""
    tag = "train/correct_moving_average"
    _run_dir(tmp_path / "cmp" / "seed0", "vcbm", {step: {tag: 0.1 * step} for step in range(1, 7)})
    _run_dir(tmp_path / "cmp" / "seed1", "vcbm", {step: {tag: 0.1 * step + 0.05} for step in range(1, 7)})
    (event_file,) = (tmp_path / "cmp" / "seed1").glob("events.out.tfevents.*")
    return event_file


# (what is damaged in record 5, the 4th scalar event (record 1 is the file version): byte flipped or None for a
# file cut inside it, TensorBoard's reason)
DAMAGE = {
    "a data byte": (lambda length: 12 + 3, "corrupt", "failed event crc32 check"),
    "the length": (lambda length: 0, "corrupt", "failed header crc32 check"),
    "the data's CRC": (lambda length: 12 + length + 1, "corrupt", "failed event crc32 check"),
    "the file cut inside the data": (None, "truncated", "truncated record in data"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_event_file_is_refused_naming_the_file_and_byte(tmp_path, capsys, damage):
    from algorithms.experiment.plot import main

    event_file = _two_seeds(tmp_path)
    offset, length = _record_offsets(event_file)[4]  # the record of episode 4
    at, kind, reason = DAMAGE[damage]
    raw = bytearray(event_file.read_bytes())
    if at is None:
        del raw[offset + 12 + length // 2 :]
    else:
        raw[offset + at(length)] ^= 0x10
    event_file.write_bytes(bytes(raw))
    out = tmp_path / "figs" / "curves.png"

    assert main([str(tmp_path / "cmp"), "--out", str(out), "--points", "6"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"error: {event_file}: {kind} record at byte {offset} (record 5: ") and reason in err[0]
    assert "--allow-truncated" in err[0] and not out.exists()

    data = plot([str(tmp_path / "cmp"), "--out", str(out), "--points", "6", "--allow-truncated"])
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith(f"warning: {event_file}: {kind} record at byte {offset} ")
    assert "using the 4 records" in warning[0]
    vcbm = data["methods"]["vcbm"]
    assert vcbm["ended_at"] == [6.0, 3.0]  # seed 1 ends before its damaged 4th episode and holds 0.35 after it
    np.testing.assert_allclose(vcbm["mean"], [(0.1 * s + min(0.1 * s + 0.05, 0.35)) / 2 for s in range(1, 7)])
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["damaged_event_files"] == [{"file": str(event_file), "offset": offset, "records_kept": 4, "reason": reason}]
    assert saved["settings"]["allow_truncated"] is True


def test_intact_event_files_report_no_damage(tmp_path):
    from algorithms.experiment.plot import check_event_file

    event_file = _two_seeds(tmp_path)
    assert check_event_file(event_file) is None
    data = plot([str(tmp_path / "cmp"), "--out", str(tmp_path / "a.png"), "--points", "6"])
    assert data["damaged_event_files"] == [] and data["methods"]["vcbm"]["ended_at"] == [6.0, 6.0]
