"""benchmarks/vcbm_bsuite_exploration.py: bsuite's own score of VCBM under each exploration budget."""

import json

import pytest

from tests.helpers import load_file

pytest.importorskip("bsuite", reason="bsuite is not installed: pip install -e '.[bsuite]'")

exploration = load_file("benchmarks/vcbm_bsuite_exploration.py", "vcbm_bsuite_exploration")


def test_the_papers_exploration_never_leaves_the_warm_up_of_a_one_step_chain_and_the_zoos_solves_it(tmp_path):
    out = tmp_path / "grid.json"
    argv = ["--experiment", "umbrella_length", "--settings", "0", "--seeds", "100", "1", "--grid", "2000:60", "100:8"]
    assert exploration.main([*argv, "--out", str(out)]) == 0
    paper, zoo = json.loads(out.read_text())["rows"]
    # 1,000 one-step episodes are half the paper's warm-up: uniform play, regret 2 on every other episode
    assert paper["seed_scores"] == [0.0] and 0.9 < paper["average_regret"]["0"][0] < 1.1
    assert zoo["seed_scores"] == [1.0] and zoo["average_regret"]["0"][0] < 0.3


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"--grid": ["100-8"]}, "'100-8': expected WARMUP:FORCED"),
        ({"--settings": ["99"]}, "--settings [99]: umbrella_length has settings 0 to 22"),
        ({"--seeds": ["100", "0"]}, "--seeds 100 0: expected a first seed >= 0 and at least one seed"),
        ({"--episodes": ["0"]}, "--episodes 0: expected a positive number of episodes per run"),
    ],
)
def test_bad_input_is_one_line_before_any_run(tmp_path, capsys, change, expected):
    out = tmp_path / "grid.json"
    options = {"--experiment": ["umbrella_length"], "--settings": ["0"], "--seeds": ["100", "1"], "--grid": ["100:8"]}
    argv = [item for flag, values in (options | change).items() for item in (flag, *values)]
    with pytest.raises(SystemExit):
        exploration.main([*argv, "--out", str(out)])
    assert expected in capsys.readouterr().err and not out.exists()


def test_the_short_entry_covers_exactly_the_short_protocols_umbrella_settings():
    from bsuite import sweep

    from algorithms.common.config import zoo_hyperparams
    from algorithms.experiment.suite import SHORT_PROTOCOL
    from algorithms.tabular.vcbm import VCBMConfig

    for experiment in ("umbrella_length", "umbrella_distract"):
        short = {f"{experiment}/{i}" for i in SHORT_PROTOCOL[experiment][0]}
        for bsuite_id in (key for key in sweep.SETTINGS if key.startswith(experiment + "/")):
            entry = zoo_hyperparams("vcbm", f"bsuite:{bsuite_id}")
            if bsuite_id in short:
                assert entry == {"warmup_transitions": 100, "forced_visits": 8}, bsuite_id
            else:  # bsuite's 10,000 episodes keep the paper's exploration
                assert entry.get("warmup_transitions", VCBMConfig.warmup_transitions) == 2000, bsuite_id
