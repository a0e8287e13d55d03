"""FSDP2 on two CPU processes (world size 2, gloo): torch's `fully_shard` through accelerate, launched with the
project's own zoo_configs/accelerate/fsdp2.yaml (mixed precision off, so that sharded and unsharded numbers
can be compared exactly). accelerate keeps a CPU process MULTI_CPU whatever the config says;
tests/fsdp2_cpu_run.py flips that one switch, and everything else runs as on GPUs.

The GPU run's paths: the synced HF rollout (`synced_gpus`, a process with no context generating on a dummy),
`build.save_final_weights` gathering the sharded state dict, and `build.weight_change_l2` on DTensor
parameters; then a whole LOOP run with LoRA, sharded checkpoints and a resume."""

import json
import math
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from tests.helpers import two_process_train_argv  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _launch(dump: Path, mode: str, *args: str) -> subprocess.CompletedProcess:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dump.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(REPO / "zoo_configs/accelerate/fsdp2.yaml"),
    ]
    command += ["--mixed_precision", "no", "--main_process_port", str(port)]
    command += [str(REPO / "tests" / "fsdp2_cpu_run.py"), str(REPO), str(dump), mode, *args]
    # a collective that one process never joins hangs until gloo's 30-minute timeout: the launch's own bound
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=dump)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _gathered(dump: Path, name: str) -> dict[str, torch.Tensor]:
    """Each parameter from the two processes' local shards, joined on dim 0 (FSDP2 splits as torch.chunk)."""
    shards = [torch.load(dump / f"{name}_rank{r}.pt") for r in (0, 1)]
    assert shards[0].keys() == shards[1].keys()
    return {n: torch.cat([shards[0][n], shards[1][n]]) for n in shards[0]}


def _change_l2(after: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((after[n].detach() - before[n]).pow(2).sum()) for n in before))


def _base_model(folder: Path) -> Path:
    """The warm-started tiny model saved as a local model path (built here, not by two launched processes at
    once): its answers end at EOS after a few tokens, so processes finish their answers at different steps."""
    from algorithms.llm.model.warm_start import warm_started_tiny

    model, tokenizer = warm_started_tiny()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_fsdp2_synced_rollout_sharded_save_and_weight_change(tmp_path):
    from transformers import AutoModelForCausalLM

    _launch(tmp_path, "primitives", str(_base_model(tmp_path / "base")))
    records = [json.loads((tmp_path / f"primitives_rank{r}.json").read_text()) for r in (0, 1)]
    for record in records:
        assert record["distributed_type"] == "FSDP" and record["model_class"] == "FSDPQwen2ForCausalLM"
        assert all(record["dtensor_params"])  # every parameter a DTensor shard after `prepare`

    # (a) synced rollout: a process with no context joins every forward pass of the other (the same count on
    # both), returns nothing, and the other's samples are the unsharded model's, token for token
    kept_stepping = False
    for case in ("none_on_1", "none_on_0", "both"):
        by_rank = [record[case] for record in records]
        assert by_rank[0]["forwards"] == by_rank[1]["forwards"] > 0
        for mine in by_rank:
            assert len(mine["sampled"]) == mine["contexts"]
            assert mine["sampled"] == mine["unsharded"]  # same tokens, same log-probs (float32, same weights)
            longest = max((len(ids) for ids, _ in mine["sampled"]), default=0)
            kept_stepping |= mine["contexts"] > 0 and longest < mine["forwards"]
    assert [r["none_on_1"]["contexts"] for r in records] == [3, 0] and [r["none_on_0"]["contexts"] for r in records] == [0, 2]
    assert kept_stepping  # some process finished its answers first and still joined the other's steps

    # (b) the gathered state dict, saved by process 0, reloads to the trained shards exactly
    trained = _gathered(tmp_path, "trained")
    initial = _gathered(tmp_path, "initial")
    reloaded = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32).named_parameters())
    assert reloaded.keys() == trained.keys()
    for name, tensor in trained.items():
        assert torch.equal(reloaded[name], tensor), name
    assert any(not torch.equal(trained[n], initial[n]) for n in trained)  # the optimizer step moved them

    tied = _gathered(tmp_path, "tied_trained")
    tied_model = AutoModelForCausalLM.from_pretrained(tmp_path / "tied", dtype=torch.float32)
    assert tied_model.config.tie_word_embeddings and tied_model.lm_head.weight is tied_model.model.embed_tokens.weight
    tied_reloaded = dict(tied_model.named_parameters())
    assert tied_reloaded.keys() == tied.keys()
    for name, tensor in tied.items():
        assert torch.equal(tied_reloaded[name], tensor), name

    # (c) the weight-change norm over DTensor parameters is the unsharded one, the same on both processes
    expected = _change_l2(reloaded, initial)
    assert expected > 0
    assert records[0]["weight_change_l2"] == records[1]["weight_change_l2"]
    assert records[0]["weight_change_l2"] == pytest.approx(expected, rel=1e-6)


TRAIN = two_process_train_argv(2, "generation_batch_size=8")


@pytest.mark.slow
def test_a_loop_run_under_fsdp2_rolls_out_in_lockstep_saves_its_adapter_and_resumes(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = _base_model(tmp_path / "base")  # a local model path: LoRA, loaded under the config's FSDP settings
    log_dir = tmp_path / "run"
    done = _launch(tmp_path / "dump", "train", *TRAIN, "--model", str(base), "--log-dir", str(log_dir))
    assert "world size 2 (FSDP, backend gloo)" in done.stderr
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["iterations_run"] == 2 and summary["finetune"] == "lora"
    dump = tmp_path / "dump"
    for r in (0, 1):
        assert json.loads((dump / f"trainer_rank{r}.json").read_text()) == {
            "sharded": True,
            "model_class": "FSDPPeftModelForCausalLM",
        }

    # process 1's episodes end at their first turn; it still generates (on a dummy) for each of process 0's
    # later turns, and process 0's answers are sampled from the model it trains: their rollout log-probs are
    # the training pass's
    calls = [json.loads((dump / f"calls_rank{r}.json").read_text()) for r in (0, 1)]
    assert len(calls[0]) == len(calls[1]) == 2 * 3  # iterations x turns, in lockstep
    assert all(c["synced"] for c in calls[0] + calls[1])
    assert [c["contexts"] for c in calls[1]] == [4, 0, 0, 4, 0, 0]
    assert [c["answers"] for c in calls[1]] == [4, 0, 0, 4, 0, 0]
    assert all(c["contexts"] == c["answers"] > 0 for c in calls[0])
    assert summary["final_max_sampling_logprob_diff"] < 1e-4

    # the adapter process 0 saved from the gathered state dict is the trained LoRA weights, exactly
    base_model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    adapter = dict(PeftModel.from_pretrained(base_model, log_dir / "adapter").named_parameters())
    trained = _gathered(dump, "trained")
    assert trained and all(".lora_" in n for n in trained)
    for name, tensor in trained.items():
        assert torch.equal(adapter[name], tensor), name
    # before training the Trainer has not sharded the model yet: each process holds every weight
    initial = [torch.load(dump / f"initial_rank{r}.pt") for r in (0, 1)]
    assert all(torch.equal(initial[0][n], initial[1][n]) for n in initial[0])
    assert summary["trained_weight_change_l2"] == pytest.approx(_change_l2(adapter, initial[0]), rel=1e-6)
    assert summary["trained_weight_change_l2"] > 0

    # killed after iteration 1's sharded checkpoint (pytorch_model_fsdp_0, optimizer_0), resumed: the same run
    assert (log_dir / "checkpoints" / "checkpoint-2" / "pytorch_model_fsdp_0").is_dir()
    killed = tmp_path / "killed"
    shutil.copytree(log_dir, killed)
    for path in ("checkpoints/checkpoint-4", "summary.json", "history.json", "adapter"):
        shutil.rmtree(killed / path) if (killed / path).is_dir() else (killed / path).unlink()
    _launch(tmp_path / "dump_resumed", "train", *TRAIN, "--model", str(base), "--log-dir", str(killed), "--resume")
    resumed = json.loads((killed / "summary.json").read_text())
    assert resumed["resumed_from"].endswith("checkpoint-2")

    def same_run(s: dict) -> dict:
        return {k: v for k, v in s.items() if "time" not in k and k not in ("checksum", "log_dir", "resumed_from")}

    assert same_run(resumed) == same_run(summary)
