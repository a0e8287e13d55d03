"""The tiny models of their own that some envs get (algorithms/llm/model/env_models.py): Sokoban's,
TextWorldExpress-coin's and AppWorld's vocabulary and warm-start data, the registry that hands them out, and where it is used
(training, algorithms.evaluate, the LLM study's warm-start pre-build).

TextWorldExpress's engine runs on Java: the tests that play coin skip where no `java` is on PATH."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("trl")

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="TextWorldExpress's engine needs Java (no java on PATH)")


def _coin_env():
    from algorithms.llm.model.textworld_coin import COIN

    return COIN.make_env()


def _play(env, seed: int, choose) -> tuple[bool, int]:
    """(won, turns) of a game of `env` on board `seed`, `choose(env)` giving each turn's command."""
    env.reset(seed=seed)
    done, turns, info = False, 0, {}
    while not done:
        _, _, terminated, truncated, info = env.step(choose(env))
        done, turns = terminated or truncated, turns + 1
    return bool(info["is_success"]), turns


def _wander_then(rng: np.random.Generator, turns: int, then):
    """A `choose` for _play: `turns` uniformly random valid commands, then `then(env)`'s."""
    wandered = []

    def choose(env):
        if len(wandered) < turns:
            wandered.append(str(rng.choice(env.unwrapped.turn_alternatives())))
            return wandered[-1]
        return then(env)

    return choose


def test_the_registry_gives_sokoban_coin_and_appworld_their_own_models_and_other_envs_none():
    from algorithms.llm.model.appworld import APPWORLD
    from algorithms.llm.model.env_registry import env_tiny_model
    from algorithms.llm.model.sokoban import SOKOBAN, SOKOBAN_DESCRIBED
    from algorithms.llm.model.textworld_coin import COIN

    assert env_tiny_model("Sokoban-v0") is SOKOBAN and env_tiny_model("TextWorldExpress-coin-v0") is COIN
    assert env_tiny_model("SokobanDescribed-v0") is SOKOBAN_DESCRIBED and env_tiny_model("AppWorld-v0") is APPWORLD
    assert env_tiny_model("TextWatchRepair-v0") is None and env_tiny_model("TextWorldExpress-twc-v0") is None
    assert env_tiny_model(None) is None


def test_model_and_tokenizer_loads_the_registered_envs_models_and_the_shared_ones_elsewhere(monkeypatch, tmp_path):
    from algorithms.llm import build
    from algorithms.llm.model import env_models
    from algorithms.llm.model import warm_start as shared

    _, sokoban_tokenizer = build.model_and_tokenizer("tiny-random", 0, False, "Sokoban-v0")
    _, shared_tokenizer = build.model_and_tokenizer("tiny-random", 0, False, "TextWatchRepair-v0")
    assert "player" in sokoban_tokenizer.get_vocab() and "player" not in shared_tokenizer.get_vocab()
    warm_started = []
    monkeypatch.setattr(env_models.EnvTinyModel, "warm_start", lambda self: warm_started.append(self.env_id) or tmp_path)
    monkeypatch.setattr(env_models, "load_warm_start", lambda folder: ("env model", folder))
    monkeypatch.setattr(shared, "warm_started_tiny", lambda: ("shared model", None))
    assert build.model_and_tokenizer("tiny", 0, False, "Sokoban-v0") == ("env model", tmp_path)
    assert build.model_and_tokenizer("tiny", 0, False, "TextWorldExpress-coin-v0") == ("env model", tmp_path)
    assert build.model_and_tokenizer("tiny", 0, False, "TextWatchRepair-v0") == ("shared model", None)
    assert warm_started == ["Sokoban-v0", "TextWorldExpress-coin-v0"]


def test_sokobans_models_keep_their_cache_keys(tmp_path):
    """The Sokoban models that results were made with: its untrained model's folder and its warm start's key."""
    from algorithms.llm.model.sokoban import SOKOBAN
    from algorithms.llm.model.warm_start import load_warm_start, warm_start_key

    base = SOKOBAN.saved_random_model(SOKOBAN.stage, tmp_path)
    assert base.name == "sokoban-random-dad0ea1f24d8bb13"
    model, tokenizer = load_warm_start(base)
    config = model.config.to_dict()
    config.pop("_name_or_path")
    key = warm_start_key(SOKOBAN.stage, SOKOBAN.examples(SOKOBAN.stage), config, tokenizer.get_vocab(), base.name)
    assert key == "5e5d4acd702375fb"  # what cached_warm_start names the trained model's folder


def test_the_described_sokoban_models_read_the_description_and_imitate_the_solver():
    """SokobanDescribed's vocabulary spells every description on boards its corpus never played, and its warm-start
    data are the solver's moves on every turn where the board can still be solved (DESCRIBED_GOLD_RATE 1.0)."""
    from algorithms.llm.model.sokoban import SOKOBAN, SOKOBAN_DESCRIBED
    from algorithms.llm.model.warm_start import WarmStartConfig
    from envs.sokoban import DIRECTIONS
    from tests.helpers import replayed_sokoban_turns

    _, tokenizer = SOKOBAN_DESCRIBED.random_tiny(0)
    _, grid_tokenizer = SOKOBAN.random_tiny(0)
    env, rng = SOKOBAN_DESCRIBED.make_env(), np.random.default_rng(0)
    for seed in range(500, 520):
        obs, _ = env.reset(seed=seed)
        assert obs.splitlines()[-1].startswith("Box: ")
        done = False
        while not done:
            assert tokenizer.unk_token_id not in tokenizer(obs)["input_ids"], obs
            obs, _, terminated, truncated, _ = env.step(str(rng.choice(DIRECTIONS)))
            done = terminated or truncated
    assert "Target" in tokenizer.get_vocab() and "Target" not in grid_tokenizer.get_vocab()
    examples = SOKOBAN_DESCRIBED.examples(WarmStartConfig(episodes_per_env=10))
    episodes, turns = replayed_sokoban_turns(examples, env)
    assert episodes == 10 and len(turns) == len(examples)
    assert all(moves and answer.split()[-1][:-2] in moves for answer, moves in turns)


def test_the_zoo_plays_each_env_in_the_setting_its_tiny_models_were_made_in():
    from algorithms.llm.model.env_registry import ENV_MODELS, env_tiny_model
    from tests.helpers import REPO

    settings = yaml.safe_load((REPO / "zoo_configs/llm-base.yml").read_text())
    for env_id in ENV_MODELS:
        env_model = env_tiny_model(env_id)
        on_cpu = {**settings[env_id], **settings[env_id].get("cpu_overrides", {})}  # AppWorld's top level: its 7B run
        assert on_cpu["env_kwargs"] == dict(env_model.env_kwargs), env_id
        assert on_cpu["system_prompt"] == "tiny", env_id  # the prompt its warm start was trained with


@needs_java
def test_the_coin_vocabulary_has_a_token_for_every_word_of_every_command_and_reads_every_observation():
    from algorithms.llm.model.textworld_coin import COIN, answer
    from algorithms.llm.model.tiny import build_tiny_tokenizer
    from envs.textworld_express import parse_command

    _, tokenizer = COIN.random_tiny(0)
    vocab, shared = tokenizer.get_vocab(), build_tiny_tokenizer(()).get_vocab()
    env, rng, commands = _coin_env(), np.random.default_rng(1), set()
    for seed in range(10_500, 10_520):  # boards the vocabulary's corpus never played
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            assert tokenizer.unk_token_id not in tokenizer(obs)["input_ids"], obs
            commands.update(env.unwrapped.turn_alternatives())
            obs, _, terminated, truncated, _ = env.step(str(rng.choice(env.unwrapped.turn_alternatives())))
            done = terminated or truncated
    assert {"take coin", "move north", "open door to north"} <= commands
    for command in commands:
        assert all(word in vocab for word in command.split()), command
        assert tokenizer.tokenize(answer(command)) == ["Action", ":", *command.split()]
        assert parse_command(answer(command), tuple(sorted(commands))) == command
    assert "coin" not in shared  # the shared vocabulary could not name the command


@needs_java
def test_following_the_gold_command_wins_from_any_state_in_the_fewest_turns():
    from algorithms.llm.model.textworld_coin import gold_command

    env, rng = _coin_env(), np.random.default_rng(2)
    for seed in range(10_500, 10_510):
        won, turns = _play(env, seed, gold_command)
        assert won
        # the same board after three random commands: the gold command still wins, in at most three turns more
        # (each random command leaves the winning path at most one command further away)
        won_after, turns_after = _play(env, seed, _wander_then(rng, 3, gold_command))
        assert won_after and turns_after <= turns + 6


@needs_java
def test_the_coin_warm_start_data_are_well_formed_commands_partly_the_gold_one():
    from algorithms.llm.generation.prompting import tiny_system_prompt
    from algorithms.llm.model import textworld_coin
    from algorithms.llm.model.env_models import DATA_SEED_BASE
    from algorithms.llm.model.warm_start import WarmStartConfig
    from envs.textworld_express import parse_command

    turns = []  # (the command chosen, the gold command, the number of valid commands) of each turn

    def recording(env, rng):
        command = textworld_coin.scripted_command(env, rng)
        turns.append((command, textworld_coin.gold_command(env), len(env.unwrapped.turn_alternatives())))
        return command

    model = dataclasses.replace(textworld_coin.COIN, action=recording)
    examples = model.examples(WarmStartConfig(episodes_per_env=30))
    assert len(examples) == len(turns) and examples == textworld_coin.COIN.examples(WarmStartConfig(episodes_per_env=30))
    env, episode = _coin_env(), -1
    for example in examples:
        if len(example["prompt"]) == 2:  # a new episode: system prompt and board, seeds DATA_SEED_BASE on
            episode += 1
            obs, _ = env.reset(seed=DATA_SEED_BASE + episode)
            assert example["prompt"] == [{"role": "system", "content": tiny_system_prompt()}, {"role": "user", "content": obs}]
        answer = example["completion"][0]["content"]
        assert answer.startswith("Action: ") and parse_command(answer, env.unwrapped.turn_alternatives()) is not None, answer
        env.step(answer)
    assert episode == 29
    gold = sum(command == best for command, best, _ in turns)
    by_chance = sum(1 / n for _, best, n in turns if best is not None)
    # gold with probability GOLD_RATE, else uniform (gold 1 time in n by chance): between chance and always gold
    assert by_chance + 0.5 * textworld_coin.GOLD_RATE * len(turns) < gold < 0.8 * len(turns)


def test_the_appworld_vocabulary_writes_every_reference_cell_of_data_it_never_saw_and_the_shared_one_cannot():
    """Each answer decodes to itself, and AppWorld runs exactly the cell out of it; on the shared vocabulary the
    decoded answer loses the cell's newlines and indentation (the reason AppWorld has a vocabulary of its own)."""
    import random

    from algorithms.llm.model.appworld import APPWORLD, VOCABULARY_SEEDS, answer
    from algorithms.llm.model.tiny import build_tiny_tokenizer
    from envs.appworld.env import code_from_action
    from envs.appworld.synthetic_tasks import SCENARIOS

    _, tokenizer = APPWORLD.random_tiny(0)
    shared = build_tiny_tokenizer(())
    held_out = range(VOCABULARY_SEEDS.stop, VOCABULARY_SEEDS.stop + 10)
    cells = {cell for _, build in SCENARIOS.values() for seed in held_out for cell in build(random.Random(seed)).solution_cells}
    assert len(cells) > 20 and any("\n    " in cell for cell in cells)  # loops, and data the corpus never drew
    for cell in cells:
        ids = tokenizer(answer(cell))["input_ids"]
        assert tokenizer.unk_token_id not in ids and code_from_action(tokenizer.decode(ids)) == cell, cell
    looped = next(cell for cell in sorted(cells) if "\n    " in cell)
    assert code_from_action(shared.decode(shared(answer(looped))["input_ids"])) != looped


class _TaskStandIn:
    """What the AppWorld scripted policy reads of the env: the task's reference cells and the cells run so far."""

    def __init__(self, cells, interactions):
        self.unwrapped, self.cells, self.interactions, self.task_id = self, cells, interactions, "demo_1"

    def reference_cells(self):
        return self.cells


def test_the_appworld_scripted_policy_plays_the_turns_reference_cell_at_its_gold_rate_and_else_a_mistake():
    from algorithms.llm.model.appworld import mistake_cells, scripted_cell

    cells = ["login()", "notes = everything()", "finish()"]
    played = [scripted_cell(_TaskStandIn(cells, turn), np.random.default_rng(0), 1.0) for turn in range(5)]
    assert played == [*cells, "finish()", "finish()"]  # past its end: the cell that ends the task
    rng, n = np.random.default_rng(1), 4000
    played = [scripted_cell(_TaskStandIn(cells, 1), rng, 0.75) for _ in range(n)]
    assert set(played) - {"notes = everything()"} <= set(mistake_cells())
    gold = played.count("notes = everything()") / n  # none of the mistakes is this cell
    assert abs(gold - 0.75) < 4 * (0.75 * 0.25 / n) ** 0.5
    with pytest.raises(ValueError, match="AppWorld task 'demo_1' has no reference cells"):
        scripted_cell(_TaskStandIn(None, 0), np.random.default_rng(0))


def test_evaluate_builds_tiny_on_the_envs_own_vocabulary():
    from algorithms.evaluate import load_model

    _, sokoban = load_model("tiny", 0, "Sokoban-v0")
    _, appworld = load_model("tiny", 0, "AppWorld-v0")
    assert "player" in sokoban.get_vocab() and "player" not in appworld.get_vocab()


def test_the_llm_study_prebuilds_and_records_the_warm_start_each_setting_loads(monkeypatch):
    from algorithms.experiment import llm_study
    from algorithms.llm.model import env_models
    from algorithms.llm.model import warm_start as shared

    built = []
    monkeypatch.setattr(
        env_models.EnvTinyModel, "warm_start", lambda self: built.append(self.env_id) or Path(f"cache/{self.env_id}-key")
    )
    monkeypatch.setattr(shared, "cached_warm_start", lambda: built.append("shared") or Path("cache/0123456789abcdef"))
    setting = dict(iterations=1, turns=2, rollouts=4, group=2, epochs=1, learning_rate=1e-3)
    run = {
        "settings": {
            "sokoban": {**setting, "env": "Sokoban-v0", "env_kwargs": {"max_steps": 2}},
            "sokoban_again": {**setting, "env": "Sokoban-v0", "env_kwargs": {"max_steps": 3}},
            "coin": {**setting, "env": "TextWorldExpress-coin-v0", "env_kwargs": {"max_turns": 2}},
            "watch": {**setting, "env": "TextWatchRepair-v0", "noise_scale": 0.5},
        }
    }
    keys = llm_study.prebuilt_warm_starts(run)  # each run records, and resume checks, the model it loads
    assert keys == {
        "sokoban": "Sokoban-v0-key",
        "sokoban_again": "Sokoban-v0-key",
        "coin": "TextWorldExpress-coin-v0-key",
        "watch": "0123456789abcdef",
    }
    assert built == ["Sokoban-v0", "shared", "TextWorldExpress-coin-v0"]  # each model once, by env id
    assert llm_study.one_or_each(keys) == keys
    assert llm_study.one_or_each({"watch": "0123456789abcdef", "watch_low": "0123456789abcdef"}) == "0123456789abcdef"


def _first_answers(model, tokenizer, seeds: range) -> list[tuple[str, bool]]:
    """(greedy answer, whether it names a valid command) of `model` at the first turn of coin's boards `seeds`."""
    import torch

    from algorithms.llm.generation.prompting import initial_messages, tiny_system_prompt
    from algorithms.llm.generation.rollout import render
    from envs.textworld_express import parse_command

    env, answers = _coin_env(), []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        prompt = render(tokenizer, initial_messages(obs, one_shot=False, system_prompt=tiny_system_prompt()), True)
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            greedy = model.generate(ids, do_sample=False, max_new_tokens=8)
        text = tokenizer.decode(greedy[0, ids.shape[1] :], skip_special_tokens=True)
        answers.append((text, parse_command(text, env.unwrapped.turn_alternatives()) is not None))
    return answers


@pytest.mark.slow
@needs_java
def test_the_warm_started_coin_model_answers_in_the_format_and_names_valid_commands_where_the_untrained_cannot():
    from algorithms.llm.model.textworld_coin import COIN

    warm = _first_answers(*COIN.load("tiny", 0), range(10_500, 10_520))
    untrained = _first_answers(*COIN.load("tiny-random", 0), range(10_500, 10_520))
    assert all(text.replace(" ", "").startswith("Action:") for text, _ in warm), warm
    # measured: 20 of 20 (greedy, textworld_coin.COIN_STAGE's budget; 10 of 20 at 60 SFT steps), the untrained none
    assert sum(ok for _, ok in warm) >= 16 > sum(ok for _, ok in untrained) + 4
