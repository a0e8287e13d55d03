"""The FSDP2 paths of the LLM arm on CPU processes, launched by tests/test_fsdp2_cpu.py as

    accelerate launch --config_file zoo_configs/accelerate/fsdp2.yaml --mixed_precision no \\
        tests/fsdp2_cpu_run.py REPO DUMP_DIR primitives MODEL_DIR
    accelerate launch ... tests/fsdp2_cpu_run.py REPO DUMP_DIR train TRAIN_ARGS...

`accelerate launch` reads the zoo config as it does on GPUs (ACCELERATE_USE_FSDP, FSDP_VERSION=2, the
transformer-layer wrap, SHARDED_STATE_DICT, ...); accelerate builds the FSDP plugin from those, but its state
stays MULTI_CPU on CPUs (it enables FSDP only for accelerator devices). `fsdp_on_cpu` flips that one switch
after accelerate's own set-up; everything after it (`prepare` calling torch's `fully_shard`, `get_state_dict`,
the Trainer's FSDP handling) is accelerate's and transformers' code over gloo.

primitives: the warm-started tiny model (saved in MODEL_DIR) prepared (sharded) beside an unsharded copy:
synced generation with a process holding no context (each direction) or fewer contexts, one optimizer step,
`build.weight_change_l2` and `build.save_final_weights`; then the same step and save for the random tiny model,
whose output layer is tied to its input embeddings. Each process writes what the test compares: its samples
and the copy's, its local shards, the norm.
train: `algorithms.train` with process 1's episodes ending after their first turn, recording every
generation call, the local shards of the trained weights before training and at the final save.
"""

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, sys.argv[1])  # the repository root
DUMP = Path(sys.argv[2])


def fsdp_on_cpu() -> None:
    """After accelerate has set up a CPU process group (MULTI_CPU, gloo) with the config's FSDP plugin, call it FSDP.
    The state is shared by every AcceleratorState and PartialState of the process, so the Trainer's sees it too."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        plugin = kwargs.get("fsdp_plugin")
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            self.fsdp_plugin = plugin

    AcceleratorState.__init__ = init


def local_shards(model) -> dict[str, torch.Tensor]:
    """This process's rows of every trainable parameter (FSDP2 shards dim 0 as torch.chunk does); the whole
    parameter where it is not sharded (yet: the Trainer shards the model when training starts)."""
    return {n: getattr(p, "to_local", p.detach)().detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def first_prompts(tokenizer, seeds) -> list[list[int]]:
    import gymnasium as gym

    import vcbm_gym  # noqa: F401  (registers the text envs)
    from algorithms.llm.generation.prompting import initial_messages
    from algorithms.llm.generation.rollout import render

    if not seeds:
        return []
    env = gym.make("TextWatchRepair-v0")
    texts = [render(tokenizer, initial_messages(str(env.reset(seed=s)[0])), True) for s in seeds]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def primitives(rank: int, folder: str) -> None:
    import copy
    from types import SimpleNamespace

    from accelerate import Accelerator

    from algorithms.llm import build
    from algorithms.llm.generation.rollout import hf_generate
    from algorithms.llm.model.tiny import build_tiny

    accelerator = Accelerator(cpu=True)
    model, tokenizer = build.model_and_tokenizer(folder, 0, False)  # answers end at EOS after a few tokens
    unsharded = copy.deepcopy(model)
    model = accelerator.prepare(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)  # on the sharded parameters, as the Trainer builds it
    record = {"distributed_type": accelerator.distributed_type.value, "model_class": type(model).__name__}
    record["dtensor_params"] = [hasattr(p, "to_local") for p in model.parameters()]
    trainable = SimpleNamespace(accelerator=accelerator, model=model, processing_class=tokenizer)
    initial = build.trainable_weights(trainable)
    torch.save(local_shards(model), DUMP / f"initial_rank{rank}.pt")

    generator = accelerator.unwrap_model(model)
    forwards = {"n": 0}
    generator.register_forward_hook(lambda *args: forwards.__setitem__("n", forwards["n"] + 1))
    cases = {  # which prompts each process holds: none on one process, or different numbers on both
        "none_on_1": {0: [1, 2, 3], 1: []},
        "none_on_0": {0: [], 1: [4, 5]},
        "both": {0: [6], 1: [7, 8, 9]},
    }
    for k, (case, seeds) in enumerate(cases.items()):
        contexts = first_prompts(tokenizer, seeds[rank])
        forwards["n"] = 0
        torch.manual_seed(100 + k)
        sampled = hf_generate(generator, tokenizer, contexts, 24, 2.0, synced=True)
        steps = forwards["n"]
        torch.manual_seed(100 + k)
        expected = hf_generate(unsharded, tokenizer, contexts, 24, 2.0)
        record[case] = {"contexts": len(contexts), "sampled": sampled, "unsharded": expected, "forwards": steps}

    batch = torch.tensor(first_prompts(tokenizer, [10]))
    loss = model(input_ids=batch, labels=batch).loss
    accelerator.backward(loss)
    optimizer.step()
    record["weight_change_l2"] = build.weight_change_l2(trainable, initial)
    torch.save(local_shards(model), DUMP / f"trained_rank{rank}.pt")
    build.save_final_weights(trainable, DUMP / "model")

    tied, tied_tokenizer = build_tiny(0)  # input and output embeddings tied, as in the smaller Qwen2.5 models
    tied = accelerator.prepare(tied)
    optimizer = torch.optim.SGD(tied.parameters(), lr=0.5)
    batch = torch.tensor(first_prompts(tied_tokenizer, [11]))
    accelerator.backward(tied(input_ids=batch, labels=batch).loss)
    optimizer.step()
    torch.save(local_shards(tied), DUMP / f"tied_trained_rank{rank}.pt")
    build.save_final_weights(SimpleNamespace(accelerator=accelerator, model=tied, processing_class=tied_tokenizer), DUMP / "tied")
    (DUMP / f"primitives_rank{rank}.json").write_text(json.dumps(record))
    accelerator.wait_for_everyone()
    accelerator.end_training()


def train(rank: int, argv: list[str]) -> int:
    import gymnasium as gym

    from algorithms import train as train_module
    from algorithms.llm import build
    from algorithms.llm.training import trainer as trainer_module

    class FirstTurnOnly(gym.Wrapper):
        def step(self, action):
            obs, reward, terminated, _, info = self.env.step(action)
            return obs, reward, terminated, True, info

    calls: list[dict] = []
    original_generate = trainer_module.hf_generate
    original_envs = trainer_module.MultiTurnGRPOTrainer._envs
    original_initial = build.trainable_weights
    original_save = build.save_final_weights

    def recording_generate(model, tokenizer, contexts, *args, **kwargs):
        answers = original_generate(model, tokenizer, contexts, *args, **kwargs)
        synced = kwargs.get("synced", args[2] if len(args) > 2 else False)
        calls.append({"contexts": len(contexts), "answers": len(answers), "synced": bool(synced)})
        return answers

    def short_envs(self, n):
        return [env if isinstance(env, FirstTurnOnly) else FirstTurnOnly(env) for env in original_envs(self, n)]

    def recording_initial(trainer):
        torch.save(local_shards(trainer.model), DUMP / f"initial_rank{rank}.pt")
        return original_initial(trainer)

    def recording_save(trainer, folder):
        torch.save(local_shards(trainer.model), DUMP / f"trained_rank{rank}.pt")
        record = {"sharded": trainer._sharded, "model_class": type(trainer.model).__name__}
        (DUMP / f"trainer_rank{rank}.json").write_text(json.dumps(record))
        return original_save(trainer, folder)

    trainer_module.hf_generate = recording_generate
    if rank == 1:
        trainer_module.MultiTurnGRPOTrainer._envs = short_envs
    build.trainable_weights = recording_initial
    build.save_final_weights = recording_save
    code = train_module.main(argv)
    (DUMP / f"calls_rank{rank}.json").write_text(json.dumps(calls))
    return code


if __name__ == "__main__":
    fsdp_on_cpu()
    process = int(os.environ["RANK"])
    if sys.argv[3] == "primitives":
        primitives(process, sys.argv[4])
    else:
        sys.exit(train(process, sys.argv[4:]))
