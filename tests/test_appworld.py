"""AppWorld-v0 end to end: the real AppWorld engine (own venv, sandboxed server) on synthetic tasks.

The AppWorld venv is made once per machine (~/.cache/vcbm_gym/appworld-venv, or
$VCBM_APPWORLD_VENV) and the synthetic tasks once per generator version; the tests skip only if
the venv cannot be created, and fail with one line where the sandbox cannot be built (CI runs them).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

gym = pytest.importorskip("gymnasium")

import vcbm_gym  # noqa: E402,F401  (registers AppWorld-v0)
from envs.appworld import synthetic, synthetic_tasks  # noqa: E402  (plain Python: scenario ids and cells)
from envs.appworld.effect import code_effect  # noqa: E402
from envs.appworld.env import AppWorldEnv, AppWorldServerError, code_from_action  # noqa: E402
from envs.appworld.pool import shared_pool  # noqa: E402
from envs.appworld.server_process import CACHE_DIR  # noqa: E402


@pytest.fixture(scope="module")
def appworld():
    from envs.appworld.sandbox import sandbox_problem
    from envs.appworld.setup import ensure_synthetic_data, ensure_venv, synthetic_stamp

    if sandbox_problem() is not None:
        pytest.fail(f"these tests need the sandbox: {sandbox_problem()}", pytrace=False)
    try:
        venv = ensure_venv()
    except Exception as error:  # pip or `appworld install` failed: nothing to test against
        pytest.skip(f"the AppWorld virtual environment could not be created: {error}")
    # a root of its own per generator version: never touches a user's real data in the default root
    root = ensure_synthetic_data(venv, CACHE_DIR / "appworld-test" / synthetic_stamp(2, 0))
    pool = shared_pool(venv, root)
    yield pool, root


def test_code_effect_is_the_normalised_api_calls():
    a = code_from_action(
        "```python\n# log in first\ntoken = apis.spotify.login(username='a',  password=\"b\")\nprint(token)\n```"
    )
    b = "x=apis.spotify.login(username=\"a\", password='b')   # same call\nprint(x)"
    assert code_effect(a) == code_effect(b) == "apis.spotify.login(username='a', password='b')"
    c = "print(apis.venmo.show_balance(access_token=apis.venmo.login(u='q')))"
    assert code_effect(c) == "apis.venmo.login(u='q'); apis.venmo.show_balance(access_token=apis.venmo.login(u='q'))"
    assert code_effect("print( 'hi' )") == code_effect("print('hi')  # comment")
    assert code_effect("def broken(:") is None
    assert code_effect("   ") is None


def dev_task(name: str) -> str:
    return f"{synthetic.scenario_id('dev', name)}_1"


def oracle_cells(root: Path, task_id: str) -> list[str]:
    return json.loads((root / "data" / "tasks" / task_id / "ground_truth" / "solution_cells.json").read_text())


def play(env, cells: list[str]):
    steps = []
    for cell in cells:
        steps.append(env.step(cell))
        if steps[-1][2] or steps[-1][3]:
            break
    return steps


@pytest.mark.parametrize("scenario", ["create_note", "delete_tagged", "mark_pinned_reviewed"])
def test_reference_script_gets_full_reward(appworld, scenario):
    pool, root = appworld
    env = gym.make("AppWorld-v0", split="dev", server_pool=pool)
    task_id = dev_task(scenario)
    obs, info = env.reset(options={"task_id": task_id})
    assert "Task:" in obs and "Supervisor:" in obs and info["task_id"] == task_id
    assert info["difficulty"] == synthetic_tasks.SCENARIOS[scenario][0]
    steps = play(env, oracle_cells(root, task_id))
    *middle, (_, reward, terminated, truncated, last) = steps
    assert all(r == 0.0 and not t for _, r, t, _, _ in middle)  # reward only at the end
    assert terminated and not truncated
    assert reward == 1.0 and last["success"] and last["num_passed"] == last["num_tests"]
    env.close()


def test_the_tiny_models_scripted_policy_at_gold_rate_one_solves_every_task_through_the_answer_format(appworld):
    """The AppWorld warm start's data (algorithms/llm/model/appworld.py): each turn's reference cell, read through the
    env, written as an answer, and run out of it."""
    import numpy as np

    from algorithms.llm.model.appworld import answer, scripted_cell

    pool, root = appworld
    env = gym.make("AppWorld-v0", split="train", max_interactions=6, server_pool=pool)
    for task_id in env.unwrapped.task_ids("train"):
        env.reset(options={"task_id": task_id})
        assert env.unwrapped.reference_cells() == oracle_cells(root, task_id)
        done, rng = False, np.random.default_rng(0)
        while not done:
            _, reward, terminated, truncated, info = env.step(answer(scripted_cell(env, rng, gold_rate=1.0)))
            done = terminated or truncated
        assert terminated and reward == 1.0 and info["num_interactions"] == len(oracle_cells(root, task_id)), task_id
    env.close()


def test_meets_the_env_contract_for_vcbm_loop_and_empo(appworld):
    from vcbm_gym.contract import check_contract

    pool, root = appworld
    env = gym.make("AppWorld-v0", split="dev", server_pool=pool)
    task_id = dev_task("create_note")
    cells = iter(oracle_cells(root, task_id))
    report = check_contract(
        env,
        needs=("vcbm-loop", "--ratio-sharing effect"),
        episodes=1,
        policy=lambda _obs: next(cells),
        reset_options={"task_id": task_id},
        check_api=False,
    )
    assert {"state_mutating", "execution_output", "effect", "is_success"} <= report.reported
    env.close()


def test_wrong_script_gets_less(appworld):
    pool, root = appworld
    env = gym.make("AppWorld-v0", split="dev", server_pool=pool)
    env.reset(options={"task_id": dev_task("create_note")})
    steps = play(
        env,
        [
            synthetic_tasks.LOGIN_CELL,
            "apis.simple_note.create_note(access_token=token, title='Wrong title', content='wrong')",
            "apis.supervisor.complete_task()",
        ],
    )
    _, reward, terminated, _, info = steps[-1]
    # one note added (passes) + nothing else changed (passes), but title/content wrong (fails)
    assert terminated and not info["success"]
    assert reward == pytest.approx(2 / 3)
    env.close()


def test_state_mutating_comes_from_database_writes(appworld):
    pool, _ = appworld
    env = gym.make("AppWorld-v0", split="dev", server_pool=pool)
    env.reset(options={"task_id": dev_task("create_note")})
    _, _, _, _, login = env.step(synthetic_tasks.LOGIN_CELL)
    assert {"method": "POST", "app": "simple_note", "api": "login"} in login["api_calls"]
    assert login["state_mutating"] is False and login["db_writes"] == []
    _, _, _, _, failed_delete = env.step("print(apis.simple_note.delete_note(access_token=token, note_id=987654))")
    assert {"method": "DELETE", "app": "simple_note", "api": "delete_note"} in failed_delete["api_calls"]
    assert failed_delete["state_mutating"] is False  # a DELETE that deletes nothing writes nothing
    obs, reward, terminated, _, create = env.step(
        "```python\nprint(apis.simple_note.create_note(access_token=token, title='Groceries 2', content='milk'))\n```"
    )
    assert create["state_mutating"] is True and reward == 0.0 and not terminated
    assert {"app": "simple_note", "operation": "INSERT", "table": "notes"} in create["db_writes"]
    assert "note_id" in obs and create["execution_output"] == obs
    assert create["task_id"] == dev_task("create_note") and create["difficulty"] == 1
    env.close()


def test_unsafe_code_is_an_error_observation_and_nothing_escapes(appworld, tmp_path):
    pool, _ = appworld
    env = gym.make("AppWorld-v0", split="dev", server_pool=pool)
    env.reset(options={"task_id": dev_task("count_notes")})
    marker = tmp_path / "escaped"
    attempts = [
        f"import subprocess\nsubprocess.run(['touch', {str(marker)!r}])",
        f"import os\nos.system('touch {marker}')",
        f"open({str(marker)!r}, 'w').write('x')",
    ]
    for code in attempts:
        obs, reward, terminated, truncated, info = env.step(code)
        assert obs.startswith("Execution failed") and "not allowed" in obs
        assert not (terminated or truncated) and reward == 0.0 and not info["state_mutating"]
    assert "subprocess" in env.step(attempts[0])[0]
    # past the import check, AppWorld's runtime guard turns os.system and friends into no-ops
    env.step(f"__import__('os').system('touch {marker}')")
    assert not marker.exists()
    env.close()


def test_reset_samples_the_split_and_difficulty(appworld):
    pool, _ = appworld
    env = gym.make("AppWorld-v0", split="dev", difficulty=2, server_pool=pool)
    appworld_env = env.unwrapped
    dev_ids = appworld_env.task_ids("dev")
    seen = {env.reset(seed=seed)[1]["task_id"] for seed in range(4)}
    assert seen <= set(appworld_env.task_ids("dev", 2)) and seen <= set(dev_ids)
    assert all(env.reset(seed=s)[1]["difficulty"] == 2 for s in range(2))
    assert env.reset(seed=3)[1]["task_id"] == env.reset(seed=3)[1]["task_id"]
    with pytest.raises(AppWorldServerError, match="Unknown task_id 'nope_1'"):
        env.reset(options={"task_id": "nope_1"})
    env.close()


def test_episode_is_truncated_at_the_interaction_cap(appworld):
    pool, _ = appworld
    env = gym.make("AppWorld-v0", split="dev", server_pool=pool, max_interactions=3)
    env.reset(options={"task_id": dev_task("count_notes")})
    flags = [env.step("print(1)")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("print(2)")
    env.close()


def test_env_checker(appworld):
    pool, _ = appworld
    from gymnasium.utils.env_checker import check_env

    env = AppWorldEnv(split="dev", server_pool=pool)
    check_env(env, skip_render_check=True)
    env.close()


def test_killed_server_is_replaced_and_the_episode_fails_clearly(appworld):
    pool, root = appworld
    env = gym.make("AppWorld-v0", split="dev", server_pool=pool)
    env.reset(options={"task_id": dev_task("create_note")})
    env.step(synthetic_tasks.LOGIN_CELL)
    server = env.unwrapped._server
    restarts = server.restarts
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=10)
    with pytest.raises(AppWorldServerError, match="lost, call reset.*exited.*replaced by a fresh server"):
        env.step("print('after the crash')")
    assert server.restarts == restarts + 1
    with pytest.raises(RuntimeError, match="reset"):
        env.step("print('still lost')")
    task_id = dev_task("create_note")
    env.reset(options={"task_id": task_id})
    assert server.alive() and play(env, oracle_cells(root, task_id))[-1][1] == 1.0
    env.close()


def test_the_world_server_never_sees_ground_truth(appworld):
    pool, root = appworld
    env = gym.make("AppWorld-v0", split="dev", server_pool=pool)
    task_id = dev_task("create_note")
    env.reset(options={"task_id": task_id})
    assert (root / "data" / "tasks" / task_id / "ground_truth").is_dir()
    listing = env.step(f"print(sorted(__import__('posix').listdir('/appworld/data/tasks/{task_id}')))")[0]
    assert listing == '["dbs", "specs.json"]\n'
    env.close()


def test_evaluate_cli_reports_tgc_and_sgc(appworld, tmp_path):
    from algorithms.evaluate import run

    _, root = appworld

    def evaluate(model: str, out: str) -> dict:
        argv = ["--env", "AppWorld-v0", "--split", "dev", "--model", model, "--out", str(tmp_path / out)]
        return run([*argv, "--appworld-root", str(root)])

    summary = evaluate("scripted:oracle", "oracle")
    assert summary["num_tasks"] == len(synthetic_tasks.SCENARIOS) * 2
    assert summary["table_iii"]["TGC, all diff."] == 1.0 and summary["table_iii"]["SGC, all diff."] == 1.0
    assert (tmp_path / "oracle" / "table.md").read_text().startswith("| Metric |")

    lazy = tmp_path / "lazy.json"  # logs in, then claims to be done: only "change nothing" tests pass
    lazy.write_text(json.dumps({"*": [synthetic_tasks.LOGIN_CELL, "apis.supervisor.complete_task()"]}))
    summary = evaluate(f"scripted:{lazy}", "lazy")
    table = summary["table_iii"]
    assert table["TGC, all diff."] == 0.0 and table["SGC, all diff."] == 0.0
    assert 0.0 < table["return"] < 1.0
    results = json.loads((tmp_path / "lazy" / "results.json").read_text())
    assert {r["difficulty"] for r in results.values()} == {1, 2, 3}


# ---------------------------------------------------------------- no AppWorld needed below
def test_code_from_action_runs_only_fenced_code():
    from envs.appworld.env import code_from_action

    reply = "Thought: first list.\n```python\nx = 1\n```\nthen\n```py\nprint(x)\n```\nDone."
    assert code_from_action(reply) == "x = 1\nprint(x)"
    assert code_from_action("print(2)") == "print(2)"
    assert code_from_action("cut short\n```python\nprint(3)\nprint(") == "print(3)\nprint("


def test_text_spaces_accept_any_string():
    from envs.appworld.env import FreeText

    space = FreeText(max_length=20)
    assert space.contains('Traceback: "é" \n\t') and space.contains("")
    assert not space.contains("x" * 21) and not space.contains(3)
    assert space.contains(space.sample())


def test_table_iii_rows_from_appworld_metric():
    from algorithms.evaluate import table_iii

    metrics = {  # AppWorld's Metric.build_report layout, in percent
        "table": {
            "type": ["aggregate", "difficulty_1", "difficulty_2", "difficulty_3"],
            "task_goal_completion": [50.0, 75.0, 25.0, 0.0],
            "scenario_goal_completion": [25.0, 50.0, 0.0, 0.0],
        },
        "counts": {"1": 4, "2": 4},  # no difficulty-3 task: reported as None, not 0
    }
    rows = dict(table_iii(metrics, mean_return=0.6))
    assert rows["return"] == 0.6 and rows["TGC, all diff."] == 0.5
    assert rows["TGC, diff.-avg."] == pytest.approx(0.5)  # (0.75 + 0.25) / 2
    assert rows["TGC, difficulty 3"] is None and rows["SGC, difficulty 3"] is None
    assert rows["SGC, difficulty 1"] == 0.5 and rows["SGC, difficulty 2"] == 0.0
