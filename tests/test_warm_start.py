"""The format warm-start (`--model tiny`): its data teach the format and a brand routine, never the decision."""

import collections

import numpy as np
import pytest

pytest.importorskip("trl")

from algorithms.llm.model.warm_start import BRAND_ROUTINE, WarmStartConfig, warm_start_examples  # noqa: E402
from envs.text_watch_repair import BRAND_NAMES  # noqa: E402
from envs.watch_repair import REPAIR, WatchRepairParams  # noqa: E402


def _watch_repair_turns(examples):
    """(brand, turn index, tool) of every TextWatchRepair answer in the data."""
    out = []
    for ex in examples:
        first = ex["prompt"][1]["content"]
        if "stations" in first:  # the workshop
            continue
        brand = next(b for b, name in enumerate(BRAND_NAMES) if f"a {name} watch" in first)
        turn = sum(m["role"] == "assistant" for m in ex["prompt"])
        answer = ex["completion"][0]["content"]
        assert answer.startswith(f"Action: {BRAND_NAMES[brand]} ") and answer.endswith("()"), answer
        out.append((brand, turn, answer.split()[-1][:-2]))
    return out


def test_the_data_decide_by_coin_flip_and_follow_the_brand_routine_afterwards():
    turns = _watch_repair_turns(warm_start_examples(WarmStartConfig()))
    first = collections.defaultdict(list)
    for brand, turn, tool in turns:
        if turn == 0:
            first[brand].append(tool)
        else:
            assert tool == BRAND_ROUTINE[brand]  # after the decision: the routine, nothing else
    for brand, tools in first.items():
        assert set(tools) <= {"repair", "skip"}
        n = len(tools)
        # repair is a fair coin for every brand: within 3 binomial standard deviations of n/2
        assert abs(tools.count("repair") - n / 2) <= 3 * np.sqrt(n / 4), (brand, tools.count("repair"), n)
    assert len(first) == 4


def test_the_brand_routine_carries_no_information_about_the_right_decision():
    optimal_repair = WatchRepairParams().optimal_first_action() == REPAIR  # brands 1 and 2
    inspects = np.array([tool == "inspect" for tool in BRAND_ROUTINE])
    # every (routine, right decision) pair occurs once: knowing the routine says nothing of the decision
    pairs = collections.Counter(zip(inspects.tolist(), optimal_repair.tolist()))
    assert pairs == {(True, False): 1, (False, True): 1, (True, True): 1, (False, False): 1}


@pytest.mark.slow
def test_the_warm_started_model_answers_in_format_and_repairs_every_brand_about_half_the_time():
    import gymnasium as gym
    import torch

    import vcbm_gym  # noqa: F401
    from algorithms.llm.generation.prompting import initial_messages, tiny_system_prompt
    from algorithms.llm.generation.rollout import render
    from algorithms.llm.model.warm_start import warm_started_tiny

    model, tokenizer = warm_started_tiny()
    env = gym.make("TextWatchRepair-v0", max_turns=3)
    repair, skip = tokenizer.convert_tokens_to_ids(["repair", "skip"])
    for brand, name in enumerate(BRAND_NAMES):
        obs, _ = env.reset(seed=0, options={"brand": brand})
        prompt = render(tokenizer, initial_messages(str(obs), one_shot=False, system_prompt=tiny_system_prompt()), True)
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            greedy = model.generate(ids, do_sample=False, max_new_tokens=8)
            answer = tokenizer.decode(greedy[0, ids.shape[1] :], skip_special_tokens=True)
            assert answer.replace(" ", "") in (f"Action:{name}repair()", f"Action:{name}skip()"), answer
            decision = tokenizer(prompt + f"Action: {name}", add_special_tokens=False, return_tensors="pt")["input_ids"]
            p = torch.softmax(model(decision).logits[0, -1], -1)
        assert p[repair] + p[skip] > 0.9  # it decides at once
        assert 0.25 < p[repair] / (p[repair] + p[skip]) < 0.75, (name, p[repair].item(), p[skip].item())


def test_the_warm_start_records_its_loss_at_the_end_apart_from_the_mean_over_its_steps(tmp_path):
    import json

    from algorithms.llm.model.warm_start import MARKER, cached_warm_start

    cfg = WarmStartConfig(episodes_per_env=2, max_steps=20)
    record = json.loads((cached_warm_start(cfg, cache_dir=tmp_path) / MARKER).read_text())
    assert record["examples"] > 0 and record["config"]["max_steps"] == 20
    # the mean counts the random model's first steps, the last tenth only what SFT ends at
    assert 0.0 < record["last_sft_loss"] < 0.5 * record["mean_sft_loss"]
