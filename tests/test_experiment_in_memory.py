"""One path from config to run: compare and tune resolve every run once, in memory (a RunSpec, by
`train.resolve_spec`), and train it with `train.execute`; no command line is built or parsed after the
experiment command's own. Their --hyperparams are parsed exactly once per command, and train's command-line
path (`train.parse`, `train.run`) is never taken by a worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from algorithms import train
from algorithms.common import config
from algorithms.common.spec import RunOptions, RunSpec
from algorithms.experiment import compare, tune
from algorithms.experiment.trials import Reporter

TRAINS_FROM_A_COMMAND_LINE = ("parse", "run", "resolve", "resolve_argv", "build_parser")


class Watch:
    """The calls an experiment command makes into train's two paths and into the --hyperparams parser."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.parsed: list[list[str]] = []
        self.resolved: list[RunSpec] = []
        self.executed: list[tuple[RunSpec, Path, RunOptions]] = []
        parse_overrides, resolve_spec, execute = config.parse_overrides, train.resolve_spec, train.execute

        def counting_parse(items):
            self.parsed.append(list(items))
            return parse_overrides(items)

        def counting_resolve(*args, **kwargs):
            self.resolved.append(resolve_spec(*args, **kwargs))
            return self.resolved[-1]

        def counting_execute(spec, log_dir, options=None):
            self.executed.append((spec, Path(log_dir), options))
            return execute(spec, log_dir, options)

        monkeypatch.setattr(config, "parse_overrides", counting_parse)
        monkeypatch.setattr(train, "parse_overrides", counting_parse)  # train's own binding of the name
        monkeypatch.setattr(train, "resolve_spec", counting_resolve)
        monkeypatch.setattr(train, "execute", counting_execute)
        for name in TRAINS_FROM_A_COMMAND_LINE:
            monkeypatch.setattr(train, name, self._refused(name), raising=False)

    @staticmethod
    def _refused(name: str):
        def refused(*args, **kwargs):
            raise AssertionError(f"train.{name} called after the command line was parsed: {args!r}")

        return refused


@pytest.fixture
def watch(monkeypatch):
    return Watch(monkeypatch)


def test_compare_resolves_each_algo_once_and_its_workers_train_specs(tmp_path, watch):
    argv = ["--algos", "mc", "td", "--seeds", "3", "--max-episodes", "30", "--hyperparams", "epsilon=0.3",
            "--workers", "0", "--out", str(tmp_path), "--no-progress", "--no-curves"]  # fmt: skip
    results = compare.run(argv)
    assert watch.parsed == [["epsilon=0.3"]]  # once for the whole command, not per algo or per seed
    assert [(spec.algo, spec.seed) for spec in watch.resolved] == [("mc", 0), ("td", 0)]  # once per algo
    ran = sorted((spec.algo, spec.seed) for spec, _, _ in watch.executed)
    assert ran == [(algo, seed) for algo in ("mc", "td") for seed in (0, 1, 2)]
    for spec, log_dir, options in watch.executed:
        first = next(s for s in watch.resolved if s.algo == spec.algo)
        assert spec == first.with_seed(spec.seed) and log_dir == tmp_path.resolve() / spec.algo / f"seed{spec.seed}"
        assert options == RunOptions(progress=False, overwrite=True)
        recorded = yaml.safe_load((log_dir / "config.yml").read_text())
        assert recorded["config_hash"] == spec.config_hash
        assert recorded["hyperparams"]["epsilon"] == 0.3 and recorded["hyperparams"]["max_episodes"] == 30
    assert results["algos"]["td"]["episodes_for_stats"] == [30, 30, 30]


def test_a_credit_rule_label_is_a_hyperparameter_of_the_resolved_spec(tmp_path, watch):
    argv = ["--algos", "td+rudder", "--seeds", "1", "--max-episodes", "20", "--workers", "0",
            "--out", str(tmp_path), "--no-progress", "--no-curves"]  # fmt: skip
    compare.run(argv)
    assert watch.parsed == [[]]
    (spec,) = watch.resolved
    assert (spec.algo, spec.hyperparams["credit"]) == ("td", "rudder")
    assert [s for s, _, _ in watch.executed] == [spec]


def test_tune_parses_its_hyperparams_once_and_resolves_each_trial_in_memory(tmp_path, watch):
    space = tmp_path / "space.yml"
    space.write_text(yaml.safe_dump({"td": {"alpha": {"type": "float", "low": 0.05, "high": 0.5, "log": True}}}))
    argv = ["--algo", "td", "--trials", "3", "--seeds-per-trial", "2", "--max-episodes", "25", "--search-space", str(space),
            "--hyperparams", "epsilon=0.3", "--workers", "1", "--out", str(tmp_path / "out")]  # fmt: skip
    result = tune.run(argv)
    assert result["trials"] == 3 and result["states"]["COMPLETE"] == 3
    assert watch.parsed == [["epsilon=0.3"]]
    # the base config, both edges of the searched alpha, then one resolution per trial (its seeds: with_seed)
    assert len(watch.resolved) == 1 + 2 + 3
    assert [s.hyperparams["alpha"] for s in watch.resolved[1:3]] == [0.05, 0.5]
    trials = watch.resolved[3:]
    assert len(watch.executed) == 6
    for index, (spec, log_dir, options) in enumerate(watch.executed):
        trial, seed = divmod(index, 2)
        assert spec == trials[trial].with_seed(seed) and log_dir.parts[-2:] == (f"trial{trial}", f"seed{seed}")
        assert spec.hyperparams["epsilon"] == 0.3 and spec.hyperparams["max_episodes"] == 25
        assert isinstance(options.report, Reporter) == (seed == 0)  # only the first seed reports (pruning)
        assert (options.progress, options.overwrite) == (False, True)
    studied = sorted(t["params"]["alpha"] for t in json.loads((tmp_path / "out" / "trials.json").read_text()))
    assert studied == sorted(spec.hyperparams["alpha"] for spec in trials)  # the sampled value, exactly
