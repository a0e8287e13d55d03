"""Run under torchrun --nproc_per_node 2: real gather_object over gloo, groups split across ranks."""

import json
import os
import sys

import numpy as np
from accelerate import Accelerator

sys.path.insert(0, sys.argv[1])  # the repository root
from algorithms.llm.training.batch import gather_episode_batch  # noqa: E402
from vcbm_gym.credit.base import EpisodeBatch  # noqa: E402
from vcbm_gym.credit.registry import make_rule  # noqa: E402

acc = Accelerator(cpu=True)
rank = acc.process_index
# rank 0: tasks 1, 1, 2; rank 1: tasks 2, 3, 3 (task 2 split over the ranks); rank 1's rows are wider
width = 4 + 2 * rank
returns = {0: [1.0, 3.0, 5.0], 1: [-1.0, 0.5, 2.5]}[rank]
rewards = np.zeros((3, width))
rewards[:, width - 1] = returns
mask = np.ones((3, width), bool)
groups = {0: [1, 1, 2], 1: [2, 3, 3]}[rank]
turns = np.tile(np.arange(width) // 2, (3, 1))
batch = EpisodeBatch(
    rewards,
    mask,
    np.array(groups),
    turns,
    turn_flags={"state_mutating": [np.ones(width // 2, bool)] * 3},
    turn_texts=[[f"t{rank}{i}{j}" for j in range(width // 2)] for i in range(3)],
    final_texts=[f"end {rank}"] * 3,
    extras={"anchor_keys": [["a"] * (width // 2)] * 3},
)
full, start = gather_episode_batch(acc, batch)
out = {}
for credit in ("loo", "grpo", "gigpo", "vcbm_blend"):
    adv = make_rule(credit).advantages(full)[start : start + 3, :width]
    out[credit] = adv[:, -1].tolist()
# one write() per rank: both ranks share torchrun's stdout pipe, and a write under PIPE_BUF bytes is not
# interleaved with the other rank's (print may split a line into several writes)
os.write(1, f"RESULT {rank} {start} {full.batch_size} {json.dumps(out)}\n".encode())
# leave together with the process group closed (as algorithms.train does): a rank exiting while its peer
# still uses the group can abort in gloo's teardown
acc.wait_for_everyone()
acc.end_training()
