"""The text games of the `textworld` extra: TextWorldExpress's eight games (envs/textworld_express.py) and TextWorld's
game files and offline-generated cooking games (envs/textworld_game.py), as Gymnasium text envs of the env contract:
the parser, the seed, the score-delta reward and success, state_mutating from the state's fingerprint, the valid
actions, exact snapshots by replay, the cooking-game cache, one-line errors for bad input and a missing Java or
package, the replay reference and the LLM arm's train command on them.

TextWorldExpress's engine runs on Java: its tests skip where no `java` is on PATH (a system dependency). One small
cooking game is generated per session (module fixture, ~10 s) into a temporary cache."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import vcbm_gym
from envs import textworld_express as twx
from envs import textworld_game as twg
from envs.snapshot import restore, snapshot
from envs.textworld_express import GAMES, TextGameNotInstalled, TextGameUnavailable, parse_command
from tests.helpers import alive, descendants, needs_proc, wait_gone
from vcbm_gym.contract import check_contract, check_snapshot

REPO = Path(__file__).resolve().parents[1]
needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="TextWorldExpress's engine needs Java (no java on PATH)")
LEARNING_NEEDS = ("vcbm-loop", "--ratio-sharing effect")


def random_valid(env: gym.Env, seed: int = 0):
    """A policy: a seeded uniform choice among the turn's valid commands."""
    rng = np.random.default_rng(seed)
    return lambda _obs: str(rng.choice(env.unwrapped.turn_alternatives()))


def gold_path(game: str, seed: int, params: str = "") -> list[str]:
    """TextWorldExpress's own solution of a game, from the package's engine directly."""
    from textworld_express import TextWorldExpressEnv

    engine = TextWorldExpressEnv()
    try:
        engine.reset(seed=seed, gameFold="train", gameName=game, gameParams=params, generateGoldPath=True)
        return engine.getGoldActionSequence()
    finally:
        engine.close()


@pytest.fixture(scope="module")
def cooking(tmp_path_factory):
    """The cache of one small cooking game (seed 0, the default settings) and the kwargs that play it."""
    cache = tmp_path_factory.mktemp("textworld_cache")
    kwargs = {"n_games": 1, "cache_dir": str(cache), "max_turns": 8}
    env = gym.make("TextWorldCooking-v0", **kwargs)
    env.reset(seed=0)
    return {"kwargs": kwargs, "cache": cache, "game_file": env.unwrapped.game_path(0)}


# --- the parser ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, command",
    [
        ("take coin", "take coin"),
        ("Thought: the coin is here.\nAction: take coin", "take coin"),
        ("Action: move north\nThought: no wait\nAction:  Take   Coin.", "take coin"),
        ("Action: `open door to east()`", "open door to east"),
        ("I would go north.\nmove north", "move north"),
        ("Action: take the coin", None),
        ("Action: eat coin", None),
        ("", None),
    ],
)
def test_an_answer_names_the_valid_command_of_its_last_action_line(answer, command):
    assert parse_command(answer, ("move north", "open door to east", "take coin")) == command


# --- TextWorldExpress --------------------------------------------------------------------------------------------


def test_every_text_game_id_is_registered_and_each_game_id_fixes_its_game():
    assert set(vcbm_gym.TEXT_GAME_ENV_IDS) <= set(gym.registry)
    assert {gym.spec(f"TextWorldExpress-{game}-v0").kwargs["game"] for game in GAMES} == set(GAMES)


@needs_java
@pytest.mark.parametrize("game", GAMES)
def test_each_game_passes_check_env_the_contract_and_the_snapshot_check(game):
    env = gym.make(f"TextWorldExpress-{game}-v0", max_turns=6)
    report = check_contract(env, needs=LEARNING_NEEDS, policy=random_valid(env), episodes=2)
    assert report.snapshot == "checked"
    assert {"state_mutating", "effect", "execution_output", "is_success", "task_goal_completion"} <= report.reported
    check_snapshot(env, seed=7, policy=random_valid(env, 7))


@needs_java
def test_reset_seed_is_the_games_seed_and_fixes_the_game():
    env = gym.make("TextWorldExpress-coin-v0", game_params="numLocations=5")
    first = [env.reset(seed=seed)[0] for seed in (11, 12, 11)]
    assert first[0] == first[2] and first[0] != first[1]
    env.reset(seed=11)
    generated = json.loads(env.unwrapped._game.getGenerationPropertiesJSON())
    assert generated["seed"] == 11 and generated["numLocations"] == 5
    core = env.unwrapped
    assert core.game_seed == 11 and core.params_text.startswith("numLocations=5")
    assert core.game_view.valid == core.turn_alternatives() and core.game_view.text in first[0]


@needs_java
@pytest.mark.parametrize("game", ["coin", "mapreader", "arithmetic", "peckingorder"])
def test_the_gold_path_is_paid_its_score_in_deltas_and_ends_in_success(game):
    env = gym.make(f"TextWorldExpress-{game}-v0", max_turns=100)
    obs, info = env.reset(seed=3)
    rewards, infos, done = [], [], False
    for command in gold_path(game, 3):
        assert command in info["valid_actions"] and command in obs  # the observation lists the valid commands
        obs, reward, terminated, truncated, info = env.step(f"Thought: follow the plan.\nAction: {command}")
        rewards.append(reward)
        infos.append(info)
        assert info["effect"] == command and not truncated
        if terminated:
            done = True
            break
    assert done and sum(rewards) == pytest.approx(1.0) and info["score"] == pytest.approx(1.0)
    assert info["is_success"] is True and info["task_goal_completion"] == 1.0


@needs_java
def test_read_only_commands_and_invalid_answers_change_nothing_and_moves_do():
    env = gym.make("TextWorldExpress-coin-v0", game_params="numLocations=4,includeDoors=0", max_turns=3)
    obs, info = env.reset(seed=2)
    move = next(command for command in info["valid_actions"] if command.startswith("move "))
    steps = {answer: env.step(answer) for answer in ("inventory", "look around")}
    assert all(not s[4]["state_mutating"] and s[1] == 0.0 for s in steps.values())
    before = env.unwrapped.turn_alternatives()
    obs, reward, terminated, truncated, info = env.step("Action: dance wildly")
    assert obs.startswith("invalid action 'Action: dance wildly'") and info["effect"] is None
    assert not info["state_mutating"] and info["valid_actions"] == before
    # the invalid answer used the last of the 3 turns: truncated, a failure on the episode's last step
    assert truncated and not terminated and info["is_success"] is False and info["task_goal_completion"] == 0.0
    env.reset(seed=2)
    assert env.step(move)[4]["state_mutating"] is True


@needs_java
def test_a_snapshot_restored_into_another_env_continues_exactly_as_the_original():
    env, other = gym.make("TextWorldExpress-cookingworld-v0"), gym.make("TextWorldExpress-cookingworld-v0")
    env.reset(seed=4)
    policy = random_valid(env, 1)
    for _ in range(3):
        env.step(policy(None))
    state = snapshot(env)
    actions = [policy(None)]
    results = [env.step(actions[0])]
    for _ in range(4):
        actions.append(str(np.random.default_rng(len(actions)).choice(env.unwrapped.turn_alternatives())))
        results.append(env.step(actions[-1]))
    other.reset(seed=99)  # another game in progress: the restore replaces it
    restore(other, state)
    assert [other.step(a) for a in actions] == results
    restore(env, state, outcome_seed=5)  # a deterministic game: an outcome seed changes nothing
    assert [env.step(a) for a in actions] == results


@needs_java
def test_envs_sharing_the_processs_engine_play_their_own_games():
    alone = []
    for game, seed in (("coin", 1), ("twc", 2)):
        env = gym.make(f"TextWorldExpress-{game}-v0")
        obs = env.reset(seed=seed)[0]
        alone.append([obs] + [env.step(c)[0] for c in env.unwrapped.turn_alternatives()[:3]])
    a, b = gym.make("TextWorldExpress-coin-v0"), gym.make("TextWorldExpress-twc-v0")
    together = [[a.reset(seed=1)[0]], [b.reset(seed=2)[0]]]
    commands = [a.unwrapped.turn_alternatives()[:3], b.unwrapped.turn_alternatives()[:3]]
    for i in range(3):  # interleaved on the one JVM
        together[0].append(a.step(commands[0][i])[0])
        together[1].append(b.step(commands[1][i])[0])
    assert together == alone


KEEP_ENGINE = """
import sys, time
import gymnasium as gym
import vcbm_gym
from envs import textworld_express
gym.make("TextWorldExpress-coin-v0").reset(seed=0)
print(textworld_express._Engine._holder._gateway.java_process.pid, flush=True)
time.sleep(300)
"""


@needs_java
@needs_proc
def test_the_java_engine_ends_with_its_python_process_even_when_killed():
    child = subprocess.Popen(
        [sys.executable, "-c", KEEP_ENGINE], cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        jvm = int(child.stdout.readline())
        assert jvm in descendants(child.pid) and alive(jvm)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert wait_gone({jvm}) == set()


@needs_java
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"game": "chess"}, "game='chess': expected one of cookingworld, twc, coin"),
        ({"game_params": "numLocations=three"}, "game_params numLocations='three' for coin: expected an integer value"),
        ({"game_params": "numRooms=3"}, "game_params 'numRooms=3' for coin: Unrecognized property name (numRooms)"),
        ({"game_params": {"numLocations": 300}}, "game_params 'numLocations=300' for coin: Number of locations"),
        ({"game_params": "numLocations"}, "game_params='numLocations': expected 'name=value' pairs"),
        ({"game_fold": "valid"}, "game_fold='valid': expected one of train, dev, test"),
        ({"max_turns": 0}, "max_turns=0: expected an integer >= 1"),
    ],
)
def test_bad_constructor_arguments_are_one_line(kwargs, message):
    with pytest.raises(ValueError) as caught:
        twx.TextWorldExpressEnv(**kwargs)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_bad_game_parameter_in_a_train_command_is_one_line_before_anything_is_written(tmp_path, capsys):
    if shutil.which("java") is None:
        pytest.skip("TextWorldExpress's engine needs Java (no java on PATH)")
    from algorithms.train import main
    from tests.helpers import tiny_llm_argv

    log_dir = tmp_path / "run"
    argv = tiny_llm_argv("loop", log_dir, env="TextWorldExpress-coin-v0", hyperparams=["env_kwargs={game_params: 'numRooms=2'}"])
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "numRooms" in lines[0], lines
    assert not log_dir.exists()


def test_no_java_is_one_line_naming_java(monkeypatch):
    monkeypatch.setattr(twx.shutil, "which", lambda name: None)
    monkeypatch.setattr(twx._Engine, "_holder", None)
    with pytest.raises(TextGameUnavailable) as caught:
        gym.make("TextWorldExpress-coin-v0")
    assert "no `java` executable on PATH" in str(caught.value) and "\n" not in str(caught.value)
    assert isinstance(caught.value, ValueError)  # algorithms.common.config.make_env reports it as one ConfigError line


def test_no_package_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "textworld_express", None)
    monkeypatch.setitem(sys.modules, "textworld", None)
    monkeypatch.setattr(twx._Engine, "_holder", None)
    for env_id, kwargs, package in (
        ("TextWorldExpress-coin-v0", {}, "textworld-express"),
        ("TextWorldCooking-v0", {}, "textworld"),
    ):
        with pytest.raises(TextGameNotInstalled) as caught:
            gym.make(env_id, **kwargs)
        assert str(caught.value).startswith(f"{package} is not installed: pip install -e '.[textworld]'")
        assert "\n" not in str(caught.value)


RUN_WITHOUT = """
import runpy, sys
blocked, module, *argv = sys.argv[1:]
for name in blocked.split(","):
    sys.modules[name] = None
sys.argv = [module, *argv]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def test_every_text_game_id_needs_the_textworld_extra():
    from algorithms.common.extras import EXTRAS, env_extra

    assert {env_extra(env_id) for env_id in vcbm_gym.TEXT_GAME_ENV_IDS} == {"textworld"}
    assert EXTRAS["textworld"] == ("textworld_express", "textworld")


def test_a_train_command_without_the_extra_is_one_line_naming_it(tmp_path):
    env_id, blocked = "TextWorldExpress-coin-v0", "textworld_express"
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_WITHOUT,
            blocked,
            "algorithms.train",
            "--algo",
            "loop",
            "--env",
            env_id,
            "--log-dir",
            str(out),
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    hint = f'error: --env {env_id} needs the textworld extra ({blocked} is not installed): pip install -e ".[textworld]"'
    assert done.stderr.strip() == hint
    assert not out.exists()


# --- TextWorld ---------------------------------------------------------------------------------------------------


def test_cooking_and_game_file_envs_pass_check_env_the_contract_and_the_snapshot_check(cooking):
    for env in (
        gym.make("TextWorldCooking-v0", **cooking["kwargs"]),
        gym.make("TextWorld-v0", game_file=str(cooking["game_file"]), max_turns=8),
    ):
        report = check_contract(env, needs=LEARNING_NEEDS, policy=random_valid(env), episodes=2)
        assert report.snapshot == "checked" and {"state_mutating", "effect", "task_goal_completion"} <= report.reported
        check_snapshot(env, seed=3, policy=random_valid(env, 3))


def test_the_cooking_walkthrough_is_paid_the_games_score_and_wins(cooking):
    import textworld

    walkthrough = textworld.start(str(cooking["game_file"]), textworld.EnvInfos(policy_commands=True, max_score=True))
    state = walkthrough.reset()
    env = gym.make("TextWorldCooking-v0", **{**cooking["kwargs"], "max_turns": 50})
    obs, info = env.reset(seed=0)
    total, terminated = 0.0, False
    for command in state["policy_commands"]:
        assert command in info["valid_actions"]
        obs, reward, terminated, truncated, info = env.step(f"Action: {command}")
        total += reward
        assert info["effect"] == command and info["state_mutating"]  # every step of the walkthrough changes the world
    assert terminated and total == state["max_score"] > 0
    assert info["is_success"] is True and info["task_goal_completion"] == 1.0


def test_looking_examining_and_the_inventory_leave_the_worlds_facts_unchanged(cooking):
    env = gym.make("TextWorldCooking-v0", **cooking["kwargs"])
    _, info = env.reset(seed=0)
    read_only = [c for c in info["valid_actions"] if c in ("look", "inventory") or c.startswith("examine ")]
    take = next(c for c in info["valid_actions"] if c.startswith("take "))
    for command in read_only[:4]:
        assert env.step(command)[4]["state_mutating"] is False
    assert env.step(take)[4]["state_mutating"] is True
    assert env.step(take)[4]["effect"] is None  # taken: no longer a valid command


def test_a_cooking_game_is_generated_once_per_seed_and_settings_and_never_reused_under_others(cooking, tmp_path):
    env = twg.TextWorldCookingEnv(**cooking["kwargs"])
    folder = env.game_folder(0)
    assert [p.name for p in cooking["cache"].iterdir()] == [folder.name]  # one game, no temporary folder left
    stamp = (folder / "game.z8").stat().st_mtime_ns
    env.reset(seed=5)  # seed 5 of a 1-game set: game 0, from the cache
    assert (folder / "game.z8").stat().st_mtime_ns == stamp and len(list(cooking["cache"].iterdir())) == 1
    other = twg.TextWorldCookingEnv(**{**cooking["kwargs"], "recipe": 2})
    assert other.game_folder(0) != folder and other.game_params(0)["settings"]["recipe"] == 2
    # a folder whose params.json names other parameters is refused, not played
    copy = tmp_path / "cache"
    shutil.copytree(cooking["cache"], copy)
    params = json.loads((copy / folder.name / "params.json").read_text())
    (copy / folder.name / "params.json").write_text(json.dumps({**params, "seed": 1}))
    with pytest.raises(ValueError, match="does not hold a game made under") as caught:
        twg.TextWorldCookingEnv(**{**cooking["kwargs"], "cache_dir": str(copy)}).reset(seed=0)
    assert "\n" not in str(caught.value)


def test_a_failed_generation_leaves_no_game_behind(tmp_path, monkeypatch):
    from textworld.challenges.tw_cooking import cooking as tw_cooking

    def broken(settings, options):
        (Path(options.path).parent / "game.ni").write_text("half a game")
        raise RuntimeError("generator failed")

    monkeypatch.setattr(tw_cooking, "make", broken)
    env = twg.TextWorldCookingEnv(n_games=1, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match="generator failed"):
        env.reset(seed=0)
    assert list((tmp_path / "cache").iterdir()) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"take": 2}, "take=2: expected at most recipe=1"),
        ({"go": 2}, "go=2: expected one of 1, 6, 9, 12"),
        ({"split": "dev"}, "split='dev': expected one of train, valid, test"),
        ({"cut": "yes"}, "cut='yes': expected true or false"),
        ({"n_games": 0}, "n_games=0: expected an integer >= 1"),
    ],
)
def test_bad_cooking_settings_are_one_line_before_anything_is_written(tmp_path, kwargs, message):
    with pytest.raises(ValueError) as caught:
        twg.TextWorldCookingEnv(cache_dir=str(tmp_path / "cache"), **kwargs)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert not (tmp_path / "cache").exists()


def test_a_missing_game_file_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^game_file='.*nothing\.z8': no such file; expected a TextWorld game file"):
        gym.make("TextWorld-v0", game_file=str(tmp_path / "nothing.z8"))


# --- the replay reference and the LLM arm ---------------------------------------------------------------------


def _reference(env_id: str, env_kwargs: str, out: Path) -> dict:
    from algorithms.credit_reference import cli as reference_cli

    argv = ["--env", env_id, "--rules", "loo,gigpo,vcbm_blend", "--seeds", "1", "--episodes", "2", "--k", "2"]
    argv += ["--train-episodes", "2", "--batch-episodes", "2", "--group-size", "2", "--env-kwargs", env_kwargs]
    assert reference_cli.main([*argv, "--out", str(out)]) == 0
    return json.loads(out.read_text())


@needs_java
def test_the_replay_reference_runs_on_a_textworldexpress_game(tmp_path):
    result = _reference("TextWorldExpress-coin-v0", "{max_turns: 3, game_params: 'numLocations=2'}", tmp_path / "r.json")
    assert result["settings"]["branching"] == "alternatives" and len(result["reference_episodes"]) == 2
    assert all("refused" not in result["rules"][name] for name in ("loo", "gigpo", "vcbm_blend"))


def test_the_replay_reference_runs_on_a_cooking_game(cooking, tmp_path):
    kwargs = json.dumps({**cooking["kwargs"], "max_turns": 2})
    result = _reference("TextWorldCooking-v0", kwargs, tmp_path / "r.json")
    assert len(result["reference_episodes"]) == 2 and all(len(e["credit"]) == 2 for e in result["reference_episodes"])


TINY_BATCH = ["max_turns=2", "generation_batch_size=4", "num_generations=2", "per_device_train_batch_size=4"]
TINY_BATCH += ["max_new_tokens_per_turn=8"]


@pytest.mark.parametrize("env_id", ["TextWorldExpress-coin-v0", "TextWorldCooking-v0"])
def test_loop_trains_the_tiny_model_on_a_text_game(tmp_path, env_id, request):
    from algorithms.train import run
    from tests.helpers import tiny_llm_argv

    if env_id.startswith("TextWorldExpress") and shutil.which("java") is None:
        pytest.skip("TextWorldExpress's engine needs Java (no java on PATH)")
    env_kwargs = {"max_turns": 2}
    if env_id == "TextWorldCooking-v0":
        cooking = request.getfixturevalue("cooking")
        env_kwargs = {**cooking["kwargs"], "max_turns": 2}
    hyperparams = [f"env_kwargs={json.dumps(env_kwargs)}", *TINY_BATCH]
    summary = run(tiny_llm_argv("loop", tmp_path / "run", env=env_id, iterations=2, hyperparams=hyperparams))
    assert summary["iterations_run"] == 2 and summary["env"] == env_id
