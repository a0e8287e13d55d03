"""Why RUDDER's training step is written out in numpy: time it against torch autograd + Adam.

    python benchmarks/rudder_train_step.py [--steps 200] [--threads 1]

Runs the same Adam steps on the same lesson-buffer batches three ways, side by side in one process,
and prints the time per step and the ratios:
  1. torch autograd through the step-by-step recurrence (`cell_states_autograd`) + torch.optim.Adam
  2. torch autograd through the hand-written BPTT Function (`GatelessLSTM.forward`) + torch.optim.Adam
  3. numpy `loss_and_gradients` + `adam_step` (what `train_until_converged` uses)
It also prints the largest parameter difference after the steps (the three must agree).
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch

from envs.watch_repair import WatchRepairFeaturizer
from vcbm_gym.credit.rudder import (
    AdamState,
    GatelessLSTM,
    LessonBuffer,
    RudderCreditConfig,
    adam_step,
    loss_and_gradients,
    parameter_arrays,
    rudder_loss,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = RudderCreditConfig()
    horizon, n_features = 50, WatchRepairFeaturizer().n_features  # WatchRepair-v0's episodes and features
    rng = np.random.default_rng(0)
    buffer = LessonBuffer(cfg.buffer_capacity, horizon, n_features, seed=0)
    for _ in range(512):
        buffer.add(rng.normal(size=(horizon, n_features)).astype(np.float32), float(rng.normal(0, 11)))
    batches = [buffer.sample(cfg.batch_size) for _ in range(args.steps)]
    reference = GatelessLSTM(n_features, cfg.hidden_size, seed=0).double()

    def torch_steps(forward_name: str) -> tuple[float, GatelessLSTM]:
        model = copy.deepcopy(reference)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        forward = getattr(model, forward_name)
        start = time.perf_counter()
        for features, lengths, returns in batches:
            x = torch.as_tensor(features, dtype=torch.float64)
            predictions = model.readout(forward(x)).squeeze(-1)
            loss, _, _ = rudder_loss(
                predictions, torch.as_tensor(returns / cfg.reward_scale), torch.as_tensor(lengths), cfg.aux_loss_weight
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return (time.perf_counter() - start) / len(batches), model

    def numpy_steps() -> tuple[float, GatelessLSTM]:
        model = copy.deepcopy(reference)
        params = parameter_arrays(model)
        adam = AdamState.zeros_like(params)
        start = time.perf_counter()
        for features, lengths, returns in batches:
            _, _, grads = loss_and_gradients(params, features, lengths, returns / cfg.reward_scale, cfg.aux_loss_weight)
            adam_step(params, grads, adam, cfg.learning_rate, cfg.weight_decay)
        return (time.perf_counter() - start) / len(batches), model

    autograd_loop, m1 = torch_steps("cell_states_autograd")
    autograd_fn, m2 = torch_steps("cell_states")
    hand, m3 = numpy_steps()
    diff = max(
        float((a.detach() - b.detach()).abs().max()) for other in (m2, m3) for a, b in zip(m1.parameters(), other.parameters())
    )
    print(f"{args.steps} Adam steps, batch {cfg.batch_size} x {horizon} steps, {args.threads} thread(s)")
    print(f"torch autograd, step-by-step recurrence : {autograd_loop * 1e3:8.2f} ms/step  (1.00x)")
    print(
        f"torch autograd, hand BPTT Function      : {autograd_fn * 1e3:8.2f} ms/step  ({autograd_loop / autograd_fn:.2f}x faster)"
    )
    print(f"numpy loss_and_gradients + adam_step    : {hand * 1e3:8.2f} ms/step  ({autograd_loop / hand:.2f}x faster)")
    print(f"largest parameter difference after {args.steps} steps: {diff:.2e}")


if __name__ == "__main__":
    main()
