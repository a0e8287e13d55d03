"""Run `algorithms.train` under torchrun, recording what each process's credit rule saw and gave.

    torchrun --nproc_per_node 2 tests/llm_multiprocess_run.py REPO DUMP_DIR TRAIN_ARGS...

Each call of `LoopTrainer.token_advantages` writes DUMP_DIR/call<k>_rank<r>.pkl: the gathered
batch of all processes' episodes, where this process's rows start, and the advantages this process
trains on. tests/test_llm_multiprocess.py replays the gathered batches in one process. Each process
also writes the summary its `algorithms.train.run` returned to DUMP_DIR/summary_rank<r>.json, and
whether its process group was still open when `algorithms.train.main` returned to DUMP_DIR/left_rank<r>.json.
"""

import json
import os
import pickle
import sys

sys.path.insert(0, sys.argv[1])  # the repository root
from algorithms import train as train_module  # noqa: E402
from algorithms.llm.training import loop as loop_module  # noqa: E402

dump_dir = sys.argv[2]
original = loop_module.LoopTrainer.token_advantages
calls = {"n": 0}


def recording_token_advantages(self, batch):
    advantages = original(self, batch)
    full, start = loop_module.gather_episode_batch(self.accelerator, batch)
    record = {"full": full, "start": start, "rows": batch.batch_size, "width": batch.rewards.shape[1], "advantages": advantages}
    path = os.path.join(dump_dir, f"call{calls['n']}_rank{self.accelerator.process_index}.pkl")
    with open(path, "wb") as f:
        pickle.dump(record, f)
    calls["n"] += 1
    return advantages


original_run = train_module.run


def recording_run(argv):
    summary = original_run(argv)
    path = os.path.join(dump_dir, f"summary_rank{os.environ['RANK']}.json")
    with open(path, "w") as f:
        json.dump(summary, f)
    return summary


loop_module.LoopTrainer.token_advantages = recording_token_advantages
train_module.run = recording_run
code = train_module.main(sys.argv[3:])
import torch.distributed  # noqa: E402  (imported by the run already)

with open(os.path.join(dump_dir, f"left_rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({"exit_code": code, "group_open": torch.distributed.is_initialized()}, f)
sys.exit(code)
