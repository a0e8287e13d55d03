"""Sokoban-v0 (envs/sokoban.py): moves and pushes on hand-written boards, the reverse-play generator's boards
(solvable, at the drawn difficulty, fixed by the seed), the env contract and snapshots, the replay reference and
the LLM arm's runs on it."""

from __future__ import annotations

import json
import math
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import vcbm_gym  # noqa: F401 (registers the envs)
from envs.snapshot import restore, snapshot
from envs.sokoban import BLOCKED, DIRECTIONS, SokobanEnv, parse_move
from vcbm_gym.contract import check_contract

# one push right puts the box against the wall, where a second push is blocked; solving takes two pushes left and two down
BOX_NEAR_WALL = """
# # # # # #
# _ _ _ _ #
# _ P X _ #
# _ _ _ _ #
# O _ _ _ #
# # # # # #
"""
ONE_PUSH = """
# # # # # #
# _ _ _ _ #
# P X O _ #
# _ _ _ _ #
# _ _ _ _ #
# # # # # #
"""


def board_of(observation: str) -> str:
    """The board rows of an observation (its lines that start with a wall)."""
    return "\n".join(line for line in observation.splitlines() if line.startswith("#"))


def bfs_solution(board: str) -> list[str] | None:
    """A shortest solution of a one-box board by breadth-first search over (player, box), written here apart from
    the env's own solver; None where there is none."""
    rows = [line.split() for line in board.strip().splitlines()]
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    player = next(p for p, ch in cells.items() if ch in "PS")
    box = next(p for p, ch in cells.items() if ch in "X√")
    target = next(p for p, ch in cells.items() if ch in "OS√")
    deltas = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    seen, queue = {(player, box): []}, deque([(player, box)])
    while queue:
        state = queue.popleft()
        (pr, pc), b = state
        if b == target:
            return seen[state]
        for move, (dr, dc) in deltas.items():
            ahead = (pr + dr, pc + dc)
            if cells[ahead] == "#":
                continue
            if ahead == b:
                beyond = (pr + 2 * dr, pc + 2 * dc)
                if cells[beyond] == "#":
                    continue
                after = (ahead, beyond)
            else:
                after = (ahead, b)
            if after not in seen:
                seen[after] = seen[state] + [move]
                queue.append(after)
    return None


def test_pushing_a_box_into_a_wall_is_a_blocked_no_op():
    env = SokobanEnv()
    obs, info = env.reset(seed=0, options={"board": BOX_NEAR_WALL})
    assert info["difficulty"] == 4 and info["moves_to_solve"] > 4
    obs, reward, terminated, truncated, info = env.step("Action: push right")
    assert (info["effect"], info["state_mutating"], reward, terminated, truncated) == ("push right", True, 0.0, False, False)
    assert board_of(obs).splitlines()[2] == "# _ _ P X #"
    before = obs
    obs, reward, terminated, truncated, info = env.step("right")
    assert (info["effect"], info["state_mutating"], reward, terminated, truncated) == (BLOCKED, False, 0.0, False, False)
    assert obs == before and "blocked" in info["execution_output"]
    # walking into a wall is blocked too; walking on is a plain move
    env.step("up")
    _, _, _, _, info = env.step("up")
    assert (info["effect"], info["state_mutating"]) == (BLOCKED, False)
    _, _, _, _, info = env.step("left")
    assert (info["effect"], info["state_mutating"], info["execution_output"]) == ("move left", True, "You move left.")


@pytest.mark.parametrize("solve_reward, step_penalty", [(1.0, 0.0), (10.0, 0.1)])
def test_a_push_onto_the_target_solves_and_terminates_with_the_reward(solve_reward, step_penalty):
    env = SokobanEnv(solve_reward=solve_reward, step_penalty=step_penalty)
    _, info = env.reset(seed=0, options={"board": ONE_PUSH})
    assert (info["difficulty"], info["moves_to_solve"]) == (1, 1)
    assert env.optimal_alternative() == "right"
    obs, reward, terminated, truncated, info = env.step("Thought: the target is right of the box. Action: right")
    assert (terminated, truncated, info["effect"], info["state_mutating"]) == (True, False, "push right", True)
    assert reward == pytest.approx(solve_reward - step_penalty)
    assert info["task_goal_completion"] == 1.0 and info["is_success"] is True and info["action_optimal"] is True
    assert info["moves_to_solve"] == 0 and info["difficulty"] == 1
    assert board_of(obs).splitlines()[2] == "# _ P √ _ #" and "Solved" in obs
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("up")


def test_a_step_penalty_is_charged_on_every_move():
    env = SokobanEnv(solve_reward=10.0, step_penalty=0.1)
    env.reset(seed=0, options={"board": ONE_PUSH})
    assert env.step("down")[1] == pytest.approx(-0.1)
    assert env.step("nothing")[1] == pytest.approx(-0.1)  # an invalid answer uses a move too


def test_running_out_of_moves_truncates_unsolved_with_nothing_paid():
    env = SokobanEnv(max_steps=3)
    env.reset(seed=0, options={"board": ONE_PUSH})
    results = [env.step("left") for _ in range(3)]
    assert [r[2:4] for r in results] == [(False, False), (False, False), (False, True)]
    assert [r[1] for r in results] == [0.0, 0.0, 0.0]
    last = results[-1][4]
    assert last["task_goal_completion"] == 0.0 and last["is_success"] is False and last["difficulty"] == 1
    assert "task_goal_completion" not in results[0][4] and "Out of moves" in results[-1][0]


@pytest.mark.parametrize(
    "text, move",
    [
        ("up", "up"),
        ("  DOWN \n", "down"),
        ("Thought: left is a wall, so I go right.\nAction: Right", "right"),
        ("push up", "up"),
        ("up()", "up"),
        ("<action>Left</action>", "left"),
        ("upward", "invalid"),
        ("", "invalid"),
    ],
)
def test_the_last_direction_word_is_the_move(text, move):
    assert parse_move(text) == move


def test_an_answer_naming_no_move_is_invalid_and_changes_nothing():
    env = SokobanEnv()
    obs, _ = env.reset(seed=0, options={"board": ONE_PUSH})
    after, reward, terminated, truncated, info = env.step("I am not sure\x0c what to do")
    assert (info["effect"], info["state_mutating"], reward, terminated, truncated) == ("invalid", False, 0.0, False, False)
    assert board_of(after) == board_of(obs) and "invalid action" in info["execution_output"]
    assert "\x0c" not in info["execution_output"]


def test_generated_boards_are_solvable_within_the_move_budget_at_every_difficulty():
    env = gym.make("Sokoban-v0")
    seen = set()
    for seed in range(150):
        obs, info = env.reset(seed=seed)
        board = board_of(obs)
        assert len(board.splitlines()) == 6 and board.count("X") == 1 and board.count("O") + board.count("S") == 1
        path = bfs_solution(board)
        assert path is not None and 1 <= len(path) <= 15 and len(path) == info["moves_to_solve"], (seed, board)
        assert 1 <= info["difficulty"] <= 3
        seen.add(info["difficulty"])
        for move in path[:-1]:
            assert env.step(move)[1:4] == (0.0, False, False)
        _, reward, terminated, _, last = env.step(path[-1])
        assert (reward, terminated, last["task_goal_completion"]) == (1.0, True, 1.0), (seed, board, path)
    assert seen == {1, 2, 3}


def test_the_difficulty_knob_sets_the_fewest_pushes():
    env = SokobanEnv(min_pushes=3, max_pushes=3)
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        assert info["difficulty"] == 3
        pushes = 0
        for move in bfs_solution(board_of(obs)):
            pushes += env.step(move)[4]["effect"].startswith("push")
        assert pushes >= 3  # a shortest solution may push more often than the fewest pushes, never less


def test_a_seed_fixes_the_board():
    env = gym.make("Sokoban-v0")
    first = [env.reset(seed=s)[0] for s in range(20)]
    again = [gym.make("Sokoban-v0").reset(seed=s)[0] for s in range(20)]
    assert first == again and len(set(first)) >= 15


def test_the_observation_is_a_function_of_the_board():
    """GiGPO's anchor key is the observation: two paths to one board give one observation."""
    env = SokobanEnv()
    env.reset(seed=0, options={"board": ONE_PUSH})
    env.step("up")
    one = env.step("down")[0]
    env.reset(seed=0, options={"board": ONE_PUSH})
    env.step("left")  # blocked: the board stays
    env.step("down")
    two = env.step("up")[0]
    assert one == two


def test_describe_adds_where_box_and_target_lie_and_what_the_player_faces():
    """Hand-read from ONE_PUSH (player at row 2, column 1, box at column 2, target at column 3)."""
    env = SokobanEnv(describe=True)
    obs, _ = env.reset(seed=0, options={"board": ONE_PUSH})
    assert board_of(obs) == board_of(SokobanEnv().reset(seed=0, options={"board": ONE_PUSH})[0])
    assert obs.splitlines()[-1] == "Box: 1 right. Target: 2 right. Up: floor. Down: floor. Left: wall. Right: box."
    obs = env.step("up")[0]
    assert obs.splitlines()[-1] == (
        "Box: 1 down, 1 right. Target: 1 down, 2 right. Up: wall. Down: floor. Left: wall. Right: floor."
    )
    env.step("down")
    assert env.step("right")[0].splitlines()[-2:] == [
        "Box: 1 right. Target: 1 right. Up: floor. Down: floor. Left: floor. Right: box on target.",
        "Solved: the box is on a target.",
    ]
    obs, _ = env.reset(seed=0, options={"board": ONE_PUSH.replace("# P X O _ #", "# S X _ _ #")})
    assert obs.splitlines()[-1] == "Box: 1 right. Target: here. Up: floor. Down: floor. Left: wall. Right: box."


def test_following_the_optimal_alternative_solves_in_the_fewest_moves():
    env = SokobanEnv()
    for seed in range(30):
        _, info = env.reset(seed=seed)
        assert env.turn_alternatives() == DIRECTIONS
        n = info["moves_to_solve"]
        assert len(env._solution.shortest_path(env._state)) == n
        for step in range(n):
            _, reward, terminated, _, info = env.step(env.optimal_alternative())
            assert info["action_optimal"] and info["moves_to_solve"] == n - 1 - step and terminated == (step == n - 1)
        assert reward == 1.0


def test_a_box_stuck_against_a_wall_away_from_its_target_leaves_no_optimal_alternative():
    env = SokobanEnv()
    _, info = env.reset(seed=0, options={"board": ONE_PUSH.replace("# P X O _ #", "# X P O _ #")})
    assert info["moves_to_solve"] == -1 and info["difficulty"] == -1 and env.optimal_alternative() is None


def test_a_push_into_a_dead_end_is_not_optimal_and_the_dead_board_after_it_has_no_optimal_move():
    env = SokobanEnv()
    board = ONE_PUSH.replace("# P X O _ #", "# _ X P O #")  # the box must go right, from its left
    env.reset(seed=0, options={"board": board})
    _, _, _, _, info = env.step("left")  # the box against the left wall can never reach column 4
    assert info["action_optimal"] is False and info["moves_to_solve"] == -1
    _, _, _, _, info = env.step("up")
    assert info["action_optimal"] is None  # no move of a dead board is optimal: the turn leaves the optimal-move rate


def test_passes_gymnasium_env_checker():
    check_env(SokobanEnv(), skip_render_check=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_meets_the_contract_with_random_moves_and_random_text(seed):
    rng = np.random.default_rng(seed)
    env = gym.make("Sokoban-v0")
    moves = check_contract(
        env, needs=("vcbm-loop", "--ratio-sharing effect", "gigpo"), episodes=3, seed=seed,
        policy=lambda _obs: str(rng.choice(DIRECTIONS)),
    )  # fmt: skip
    assert {"state_mutating", "execution_output", "effect", "task_goal_completion", "is_success"} <= moves.reported
    assert moves.snapshot == "checked"
    assert check_contract(gym.make("Sokoban-v0"), needs=("vcbm-loop",), seed=seed).snapshot == "checked"


def test_a_restored_snapshot_continues_as_the_original():
    env = gym.make("Sokoban-v0")
    env.reset(seed=7)
    for move in ("left", "up", "right"):
        env.step(move)
    state = snapshot(env)
    actions = ["down", "down", "left", "right", "up", "up", "left", "down", "right", "right", "up", "down"]

    def play() -> list:
        out = []
        for move in actions:
            out.append(env.step(move))
            if out[-1][2] or out[-1][3]:
                break
        return out

    first = play()
    for outcome_seed in (None, 5):  # nothing is left to draw: an outcome seed changes nothing
        restore(env, state, outcome_seed=outcome_seed)
        assert play() == first
    assert len(first) == 12 or first[-1][2] or first[-1][3]


def test_a_snapshot_of_another_setting_is_refused():
    from envs.snapshot import SnapshotError

    env = SokobanEnv()
    env.reset(seed=0)
    state = env.snapshot()
    with pytest.raises(SnapshotError, match="expected one of this env"):
        SokobanEnv(max_steps=10).restore(state)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"dim": 3}, "dim=3: expected an integer >= 4"),
        ({"num_boxes": 0}, "num_boxes=0"),
        ({"max_steps": 0}, "max_steps=0"),
        ({"min_pushes": 2, "max_pushes": 1}, "max_pushes=1: expected an integer >= min_pushes=2"),
        ({"max_inner_walls": 15}, "max_inner_walls=15"),
        ({"solve_reward": math.nan}, "solve_reward=nan: expected a finite number"),
        ({"solve_reward": 0.0}, "expected solve_reward > 0"),
        ({"step_penalty": -1.0}, "step_penalty >= 0"),
        ({"min_pushes": True}, "min_pushes=True"),
        ({"render_mode": "human"}, "render_mode='human'"),
        ({"describe": "yes"}, "describe='yes': expected true or false"),
    ],
)
def test_bad_constructor_values_are_one_line_naming_the_value(kwargs, needle):
    with pytest.raises(ValueError) as excinfo:
        SokobanEnv(**kwargs)
    assert needle in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_settings_that_admit_no_board_are_one_line_at_reset():
    with pytest.raises(ValueError) as excinfo:
        SokobanEnv(dim=5, min_pushes=6, max_pushes=6).reset(seed=0)
    assert "needs 6 pushes" in str(excinfo.value) and "\n" not in str(excinfo.value)


@pytest.mark.parametrize(
    "board, needle",
    [
        (ONE_PUSH.replace("# P X O _ #", "# P X O _ _"), "walls (#) all around"),
        (ONE_PUSH.replace("# P X O _ #", "# P X _ _ #"), "expected one player and as many boxes as targets"),
        (ONE_PUSH.replace("# P X O _ #", "# P X O ? #"), "board cell '?'"),
        ("# #\n# #", "expected a square of at least 3 rows"),
    ],
)
def test_a_bad_board_option_is_one_line(board, needle):
    with pytest.raises(ValueError) as excinfo:
        SokobanEnv().reset(options={"board": board})
    assert needle in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_the_replay_reference_gives_the_scripted_policy_no_credit_and_scores_the_text_rules(tmp_path):
    from algorithms.credit_reference import cli as reference_cli
    from algorithms.credit_reference import replay

    env = reference_cli.make_env("Sokoban-v0")
    policy = replay.BehaviourPolicy("scripted")
    moves = env.reset(seed=3)[1]["moves_to_solve"]
    episode = replay.replay_episode(env, policy, 3, np.random.SeedSequence(0), 2, True, "auto")
    # the scripted policy solves the board in the fewest moves: the move it takes is the one its value follows
    assert len(episode.credit) == moves and episode.played.infos[-1]["task_goal_completion"] == 1.0
    assert np.all(episode.credit == 0) and episode.decision_step is None
    assert all(q[taken] == 1.0 for q, taken in zip(episode.q, episode.taken))
    out = tmp_path / "ref_{env}.json"
    argv = ["--env", "Sokoban-v0", "--rules", "loo,gigpo,vcbm_blend", "--seeds", "1", "--episodes", "4", "--k", "2"]
    assert reference_cli.main([*argv, "--train-episodes", "4", "--batch-episodes", "2", "--out", str(out)]) == 0
    result = json.loads((tmp_path / "ref_Sokoban-v0.json").read_text())
    assert {name for name, row in result["rules"].items() if "refused" not in row} == {"loo", "gigpo", "vcbm_blend"}
    assert len(result["reference_episodes"]) == 4 and result["settings"]["k"] == 2


@pytest.mark.parametrize(
    "env_id, extra, hyperparams",
    [
        ("Sokoban-v0", (), ()),
        ("Sokoban-v0", ("--credit", "gigpo"), ()),
        ("Sokoban-v0", ("--credit", "vcbm_blend"), ()),
        ("Sokoban-v0", (), ("ratio_sharing=effect",)),
        ("SokobanDescribed-v0", (), ()),
    ],
)
def test_the_llm_arm_trains_the_tiny_model_on_sokoban(tmp_path, env_id, extra, hyperparams):
    pytest.importorskip("trl")
    import yaml

    from algorithms.train import run
    from tests.helpers import tiny_llm_argv

    small = ["generation_batch_size=4", "num_generations=2", "per_device_train_batch_size=4", *hyperparams]
    argv = tiny_llm_argv("loop", tmp_path, *extra, "--seed", "1", env=env_id, iterations=2, hyperparams=small)
    summary = run(argv)
    assert summary["iterations_run"] == 2 and "final_task_goal_completion" in summary
    assert 0.0 <= summary["final_optimal_action_rate"] <= 1.0  # every Sokoban turn says whether its move was optimal
    assert summary["final_invalid_turn_rate"] < 1.0  # its vocabulary names the moves: some random answers are moves
    settings = yaml.safe_load((tmp_path / "config.yml").read_text())["hyperparams"]
    assert settings["credit"] == (extra[1] if extra else "loo")
    assert settings["ratio_sharing"] == ("effect" if hyperparams else "none")
    assert settings["max_turns"] == 15 and settings["env_kwargs"]["max_steps"] == 15


def test_the_shared_warm_start_keeps_the_key_the_published_results_record():
    """Sokoban's models are its own: the watch envs' warm-start data, vocabulary and cache key stay as recorded."""
    pytest.importorskip("trl")
    from algorithms.llm.model.tiny import build_tiny
    from algorithms.llm.model.warm_start import WarmStartConfig, warm_start_examples, warm_start_key
    from tests.helpers import REPO

    recorded = json.loads((REPO / "benchmarks/results/llm_objectives/results.json").read_text())["warm_start"]
    cfg = WarmStartConfig()
    shape = dict(hidden_size=cfg.hidden_size, tie_embeddings=cfg.tie_embeddings, embedding_std=cfg.embedding_std)
    model, tokenizer = build_tiny(cfg.model_seed, **shape)
    examples = warm_start_examples(cfg)
    assert warm_start_key(cfg, examples, model.config.to_dict(), tokenizer.get_vocab()) == recorded
    assert not any("Sokoban" in m["content"] for e in examples for m in e["prompt"])


def test_the_sokoban_tiny_vocabulary_reads_every_board_and_names_every_move():
    pytest.importorskip("trl")
    from algorithms.llm.model.sokoban import SOKOBAN
    from algorithms.llm.model.tiny import build_tiny_tokenizer

    _, tokenizer = SOKOBAN.random_tiny(0)
    env = SokobanEnv()
    for seed in range(500, 540):  # boards the vocabulary's corpus never played
        obs, _ = env.reset(seed=seed)
        for text in (obs, env.step("left")[0]):
            assert tokenizer.unk_token_id not in tokenizer(text)["input_ids"], text
    assert tokenizer.tokenize("Action: player up()") == ["Action", ":", "player", "up", "()"]
    assert "up" not in build_tiny_tokenizer(()).get_vocab()  # the shared vocabulary could not name the move


def test_the_sokoban_warm_start_data_are_well_formed_moves_partly_the_solvers():
    pytest.importorskip("trl")
    from algorithms.llm.model.sokoban import GOLD_RATE, SOKOBAN
    from algorithms.llm.model.warm_start import WarmStartConfig
    from tests.helpers import replayed_sokoban_turns

    examples = SOKOBAN.examples(WarmStartConfig(episodes_per_env=40))
    episodes, turns = replayed_sokoban_turns(examples, SokobanEnv())
    optimal = 0
    for answer, moves in turns:
        assert answer in {f"Action: player {move}()" for move in DIRECTIONS}, answer
        optimal += answer.split()[-1][:-2] in moves
    assert episodes == 40 and len(turns) == len(examples)
    # each answer is the solver's move with probability GOLD_RATE, else a uniform one (optimal 1 time in 4, or 2 in 4)
    assert GOLD_RATE + (1 - GOLD_RATE) * 0.2 < optimal / len(examples) < GOLD_RATE + (1 - GOLD_RATE) * 0.6


@pytest.mark.slow
def test_the_warm_started_sokoban_model_answers_with_moves_and_trains(tmp_path):
    pytest.importorskip("trl")
    import torch

    from algorithms.llm.generation.prompting import initial_messages, tiny_system_prompt
    from algorithms.llm.generation.rollout import render
    from algorithms.llm.model.sokoban import SOKOBAN
    from algorithms.train import run
    from tests.helpers import tiny_llm_argv

    model, tokenizer = SOKOBAN.load("tiny", 0)
    env, moves = SokobanEnv(), 0
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        prompt = render(tokenizer, initial_messages(obs, one_shot=False, system_prompt=tiny_system_prompt()), True)
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            greedy = model.generate(ids, do_sample=False, max_new_tokens=8)
        moves += parse_move(tokenizer.decode(greedy[0, ids.shape[1] :], skip_special_tokens=True)) != "invalid"
    assert moves >= 18
    small = ["generation_batch_size=4", "num_generations=2", "per_device_train_batch_size=4"]
    summary = run(tiny_llm_argv("loop", tmp_path, env="Sokoban-v0", model="tiny", iterations=1, hyperparams=small))
    assert summary["iterations_run"] == 1 and summary["final_invalid_turn_rate"] < 0.2
