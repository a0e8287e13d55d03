"""The LLM arm on two CPU processes (torchrun, gloo, world size 2): it trains (LoRA on the tiny model
saved as a local path), its credit is that of one process over the same global batch, it checkpoints
and resumes, and its adapter loads for evaluation."""

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("trl")

from tests.helpers import two_process_train_argv  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# 12 rollouts = 3 tasks x K=4 over two processes of 6: the middle task's rollouts are split over
# the processes, so a rule that saw only its own process's episodes would give other advantages
TRAIN = two_process_train_argv(3, "generation_batch_size=12", "per_device_train_batch_size=6")


def _base_model(folder: Path) -> Path:
    """The warm-started tiny model saved as a local model path: `--model PATH` trains a LoRA adapter."""
    from algorithms.llm.model.warm_start import warm_started_tiny

    model, tokenizer = warm_started_tiny()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _torchrun(dump: Path, *args: str) -> subprocess.CompletedProcess:
    dump.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += [str(REPO / "tests" / "llm_multiprocess_run.py"), str(REPO), str(dump), *TRAIN, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _calls(dump: Path) -> list[dict[int, dict]]:
    calls = []
    for k in range(len(list(dump.glob("call*_rank0.pkl")))):
        calls.append({r: pickle.loads((dump / f"call{k}_rank{r}.pkl").read_bytes()) for r in (0, 1)})
    return calls


@pytest.mark.slow
def test_two_processes_train_with_one_process_credit_checkpoint_resume_and_load(tmp_path):
    from algorithms.common.credit_slot import CreditSlot
    from algorithms.evaluate import model_policy
    from algorithms.llm.config import LLM_CREDIT
    from vcbm_gym.credit.registry import make_rule

    model = ["--model", str(_base_model(tmp_path / "base"))]
    log_dir = tmp_path / "run"
    done = _torchrun(tmp_path / "dump", *model, "--log-dir", str(log_dir))
    assert "world size 2 (MULTI_CPU, backend gloo)" in done.stderr
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["iterations_run"] == 3
    assert summary["model_wrapper"] == "DistributedDataParallel"
    assert [h["iteration"] for h in json.loads((log_dir / "history.json").read_text())] == [1, 2, 3]
    # every process reports the run's metrics (over all episodes, maxima over all tokens), not its own share
    reported = [json.loads((tmp_path / "dump" / f"summary_rank{r}.json").read_text()) for r in (0, 1)]

    def same_run(s: dict) -> dict:  # a process's own wall times differ, and so the checksum over them
        return {k: v for k, v in s.items() if "time" not in k and k != "checksum"}

    assert [same_run(p) for p in reported] == 2 * [same_run(summary)]
    # the processes leave together, with the process group closed (a process exiting while its peer
    # still used the group aborted in gloo's teardown once, failing a finished launch)
    for r in (0, 1):
        assert json.loads((tmp_path / "dump" / f"left_rank{r}.json").read_text()) == {"exit_code": 0, "group_open": False}
    # and the launch prints that summary once, as one whole line
    printed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"iterations_run"')]
    assert len(printed) == 1 and printed[0]["final_mean_return"] == summary["final_mean_return"]

    # the credit each process trained on = the rule over the gathered global batch, run in one process
    config = yaml.safe_load((log_dir / "loop_config.yml").read_text())
    rule = make_rule(config["credit"], **CreditSlot(config["credit"], config["credit_kwargs"]).rule_kwargs(LLM_CREDIT))
    calls = _calls(tmp_path / "dump")
    assert len(calls) == 3
    lengths_differ = any_credit = False
    for by_rank in calls:
        full = by_rank[0]["full"]
        assert full.batch_size == 12 and by_rank[0]["rows"] == by_rank[1]["rows"] == 6
        assert set(full.group_ids[:6]) & set(full.group_ids[6:])  # a task on both processes
        expected = rule.advantages(full)
        for r, rec in by_rank.items():
            assert rec["start"] == 6 * r
            mine = expected[rec["start"] : rec["start"] + rec["rows"], : rec["width"]]
            np.testing.assert_allclose(rec["advantages"], mine, rtol=0, atol=1e-12)
        rule.observe(full)
        any_credit |= bool(np.abs(expected).sum() > 0)
        lengths = (full.step_turn >= 0).sum(axis=1)  # tokens per episode (answers and env replies)
        lengths_differ |= sorted(lengths[:6]) != sorted(lengths[6:])
    assert lengths_differ  # the two processes held episodes of different lengths
    assert any_credit  # not a vacuous comparison of zeros

    # killed after iteration 2's checkpoint, resumed on two processes: the same final metrics
    killed = tmp_path / "killed"
    shutil.copytree(log_dir, killed)
    shutil.rmtree(killed / "checkpoints" / "checkpoint-6")
    for name in ("summary.json", "history.json"):
        (killed / name).unlink()
    _torchrun(tmp_path / "dump_resumed", *model, "--log-dir", str(killed), "--resume")
    resumed = json.loads((killed / "summary.json").read_text())
    assert resumed["resumed_from"].endswith("checkpoint-4") and resumed["world_size"] == 2
    finals = {k: v for k, v in summary.items() if k.startswith("final_") and "time" not in k}
    assert finals and finals == {k: v for k, v in resumed.items() if k.startswith("final_") and "time" not in k}

    # the saved LoRA adapter (with its base's path) loads in algorithms.evaluate's model policy and answers
    assert summary["finetune"] == "lora" and (killed / "adapter" / "adapter_config.json").is_file()
    policy = model_policy(str(killed / "adapter"), seed=0, max_new_tokens=8, max_prompt_chars=20_000)
    answer = policy("task", [{"role": "system", "content": "x"}, {"role": "user", "content": "A watch."}])
    assert isinstance(answer, str)


@pytest.mark.slow
def test_the_zoo_entry_runs_on_two_processes_without_batch_overrides(tmp_path):
    """The zoo's TextWatchRepair entry names 16 rollouts per iteration and no per-process batch: under
    torchrun each of the two processes derives its share (8) instead of being refused because a
    per-process batch of 16 does not divide 16 rollouts over two processes."""
    log_dir = tmp_path / "run"
    dump = tmp_path / "dump"
    dump.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += [str(REPO / "tests" / "llm_multiprocess_run.py"), str(REPO), str(dump)]
    command += ["--algo", "vcbm-loop", "--env", "TextWatchRepair-v0", "--model", "tiny-random", "--iterations", "1"]
    command += ["--no-progress", "--log-dir", str(log_dir)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "world size 2 (MULTI_CPU, backend gloo)" in done.stderr
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["iterations_run"] == 1
    hyperparams = yaml.safe_load((log_dir / "config.yml").read_text())["hyperparams"]
    assert (hyperparams["generation_batch_size"], hyperparams["per_device_train_batch_size"]) == (16, 8)
    # each process trained on its half of the iteration's 16 rollouts
    (by_rank,) = _calls(dump)
    assert by_rank[0]["full"].batch_size == 16 and by_rank[0]["rows"] == by_rank[1]["rows"] == 8
