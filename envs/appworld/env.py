"""AppWorld-v0: an AppWorld task as a Gymnasium text environment.

The agent writes Python; AppWorld runs it in its REPL (with `apis.<app>.<api>(...)`, its safety
guard and frozen clock) inside a separate server process (`envs/appworld/server.py`), and the
printed output is the next observation.

- reset(options={"task_id": ...}) plays that task; without it a task is drawn (with the env's
  seeded RNG) from `split`, restricted to `difficulty` when given. The observation is the task
  instruction and the supervisor's identity.
- step(code) -> the REPL output. A ReAct reply may wrap its code in ```python fences; then only
  the fenced code runs (`code_from_action`). The episode terminates when the agent marks the
  task complete (`apis.supervisor.complete_task(...)`) and is truncated after `max_interactions`
  steps (50).
- Reward is 0 until the last step, then the fraction of AppWorld's tests passed (AppWorld's own
  evaluator); `info["success"]` is True when all pass (TGC counts those). A task shipped without
  ground truth ends with reward 0 and no `success` key.
- Every step's info: `state_mutating` (the code wrote to an app database: AppWorld's change
  tracker saw an INSERT/UPDATE/DELETE; a login or a failed DELETE writes nothing),
  `execution_output`, `code` (what ran), `effect` (its canonical API calls, `effect.code_effect`:
  EMPO's cells), `api_calls` ([{method, app, api}]), `db_writes`, `difficulty`, `task_id`,
  `num_interactions`; the evaluated last step adds `success` and SB3's `is_success` (the same flag).
  These are the env contract's keys (vcbm_gym/contract.py).

Servers: pass `server_pool=` (an `AppWorldServerPool`, one server per concurrent env); without
it, the env borrows a server from a process-wide growing pool (`pool.shared_pool`), returned on
close() and stopped at exit. Agent code runs in a bubblewrap sandbox (see `envs.appworld.pool`);
on a machine without bubblewrap the env refuses to run unless `trusted_code=True`. Rewards come
from a separate evaluator process that the agent's code cannot reach. A server that dies, times
out (after `execution_timeout + request_timeout` seconds for a step) or breaks the protocol is
killed and replaced, and `step` raises one `AppWorldServerError` for the lost episode. Outputs
longer than the observation space's `max_length` are cut, ending with a marker that says so.

No snapshot protocol (envs/snapshot.py): a world's state is not only its app databases, which AppWorld saves
after every call and the pool copies out for the evaluator, but also the REPL namespace the agent's code built
(variables, an access token from a login) and AppWorld's interaction counters, all inside the sandboxed
server process. The server has no call that loads a saved state back into a live world, and a Python
namespace holding arbitrary objects cannot in general be saved. Branching an AppWorld episode would mean
replaying its code prefix in a fresh world of the same task, which this env does not claim to reproduce
exactly.
"""

from __future__ import annotations

import json
import math
import re
import string
from typing import Any

import gymnasium as gym
from gymnasium.spaces import Text

from envs.appworld.effect import code_effect
from envs.appworld.pool import (
    AppWorldServer,
    AppWorldServerError,
    AppWorldServerPool,
    SandboxUnavailableError,
    shared_pool,
)
from envs.appworld.sandbox import positive_seconds
from envs.appworld.server import cap_output

__all__ = [
    "AppWorldEnv",
    "AppWorldServerError",
    "FreeText",
    "SandboxUnavailableError",
    "code_from_action",
    "format_task",
]

MAX_TEXT = 1_000_000
CODE_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def code_from_action(action: str) -> str:
    """The Python to run: the ```python fenced blocks of a ReAct-style reply (thought + code),
    joined in order; an action without fences is run as it is. An unclosed fence (a reply cut
    at the token limit) runs to the end of the text."""
    blocks = CODE_FENCE.findall(action)
    return "\n".join(block.strip("\n") for block in blocks) if blocks else action


class FreeText(Text):
    """Any Python string up to `max_length` characters (Text's charset check would reject
    tracebacks, quotes and non-ASCII names); sampling still draws from printable ASCII."""

    def __init__(self, max_length: int = MAX_TEXT, min_length: int = 0) -> None:
        super().__init__(max_length, min_length=min_length, charset=string.printable)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


def format_task(task: dict) -> str:
    """The first observation: who the supervisor is and what they asked."""
    supervisor = task["supervisor"]
    return (
        f"Supervisor: {supervisor['first_name']} {supervisor['last_name']} "
        f"(email {supervisor['email']}, phone {supervisor['phone_number']})\n"
        f"Task: {task['instruction']}"
    )


class AppWorldEnv(gym.Env[str, str]):
    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        split: str = "train",
        difficulty: int | None = None,
        max_interactions: int = 50,
        server_pool: AppWorldServerPool | None = None,
        appworld_venv: str | None = None,
        appworld_root: str | None = None,
        request_timeout: float = 60.0,
        execution_timeout: float = 100,
        trusted_code: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if difficulty not in (None, 1, 2, 3):
            raise ValueError(f"difficulty must be None, 1, 2 or 3, got {difficulty!r}")
        if max_interactions < 1:
            raise ValueError(f"max_interactions must be >= 1, got {max_interactions}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if not isinstance(trusted_code, bool):
            raise ValueError(f"trusted_code must be True or False, got {trusted_code!r}")
        self.split = split
        self.difficulty = difficulty
        self.max_interactions = max_interactions
        self.request_timeout = positive_seconds("request_timeout", request_timeout)
        self.execution_timeout = positive_seconds("execution_timeout", execution_timeout)
        self.trusted_code = trusted_code
        self.render_mode = render_mode
        self.observation_space = FreeText()
        self.action_space = FreeText()

        self._pool = server_pool
        self._server: AppWorldServer | None = None
        self._venv, self._root = appworld_venv, appworld_root
        self._task_ids: dict[tuple[str, int | None], list[str]] = {}
        self._task: dict | None = None
        self._interactions = 0
        self._active = False
        self._transcript: list[str] = []

    # ------------------------------------------------------------------ servers
    def _pool_or_shared(self) -> AppWorldServerPool:
        if self._pool is None:
            self._pool = shared_pool(self._venv, self._root, self.trusted_code)
        return self._pool

    def _world(self) -> AppWorldServer:
        if self._server is None:
            self._server = self._pool_or_shared().acquire()
        return self._server

    def _lost_episode(self, error: AppWorldServerError) -> AppWorldServerError:
        self._active = False
        task_id = self._task["task_id"] if self._task else None
        return AppWorldServerError(f"Episode of task {task_id!r} lost, call reset(): {error}")

    def task_ids(self, split: str | None = None, difficulty: int | None = None) -> list[str]:
        """Task ids of a split (optionally one difficulty), as AppWorld's datasets list them."""
        key = (split or self.split, difficulty)
        if key not in self._task_ids:
            answer = self._pool_or_shared().task_ids(key[0], key[1])
            self._task_ids[key] = list(answer["task_ids"])
        return self._task_ids[key]

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        task_id = options.pop("task_id", None)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; expected only 'task_id'")
        if task_id is None:
            candidates = self.task_ids(self.split, self.difficulty)
            if not candidates:
                raise ValueError(f"split {self.split!r} has no task of difficulty {self.difficulty}")
            task_id = candidates[int(self.np_random.integers(len(candidates)))]
        self._active = False
        server = self._world()
        self._pool.ensure_alive(server)  # also replaces a server the last episode's code tainted
        task = server.call(
            "initialize",
            timeout=max(self.request_timeout, 120.0),
            task_id=task_id,
            max_interactions=self.max_interactions,
            timeout_seconds=math.ceil(self.execution_timeout),
        )
        self._task = {**task, **self._pool.task_info(task_id)}
        self._interactions = 0
        self._active = True
        observation = format_task(self._task)
        self._transcript = [observation]
        info = {
            "task_id": task_id,
            "difficulty": self._task["difficulty"],
            "instruction": self._task["instruction"],
            "supervisor": self._task["supervisor"],
            "datetime": self._task["datetime"],
        }
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if not self._active:
            raise RuntimeError("AppWorldEnv.step() called without an active episode; call reset() first.")
        if not isinstance(action, str):
            raise TypeError(f"action must be the Python code to run (str), got {type(action).__name__}")
        task_id = self._task["task_id"]
        code = code_from_action(action)
        max_output = self.observation_space.max_length
        try:
            result = self._server.call(
                "execute",
                timeout=self.request_timeout + self.execution_timeout,
                # ASCII JSON spends at most 12 bytes on a character (a surrogate pair's escapes)
                max_bytes=12 * max_output + (1 << 20),
                bad_on_4xx=True,
                task_id=task_id,
                code=code,
                max_output=max_output,
            )
        except AppWorldServerError as error:
            raise self._lost_episode(error) from None
        self._server.tainted += [str(item) for item in result.get("tainted") or []]
        output = cap_output(str(result["output"]), max_output)
        self._interactions += 1
        terminated = bool(result["task_completed"])
        truncated = not terminated and self._interactions >= self.max_interactions
        info = {
            "task_id": task_id,
            "difficulty": self._task["difficulty"],
            "state_mutating": bool(result["state_mutating"]),
            "execution_output": output,
            "code": code,
            "effect": code_effect(code),
            "api_calls": result["api_calls"],
            "db_writes": result["db_writes"],
            "num_interactions": self._interactions,
        }
        reward = 0.0
        if (terminated or truncated) and not self._task.get("has_ground_truth", True):
            self._active = False  # e.g. a split shipped without answers: nothing to score against
            info.update(num_tests=0, num_passed=0, evaluation=None)  # no "success": unknown
        elif terminated or truncated:
            self._active = False
            try:
                evaluation = self._pool.evaluate(self._server, task_id)
            except AppWorldServerError as error:
                raise self._lost_episode(error) from None
            reward = evaluation["pass_count"] / evaluation["num_tests"] if evaluation["num_tests"] else 0.0
            info.update(
                success=bool(evaluation["success"]),
                is_success=bool(evaluation["success"]),
                num_tests=evaluation["num_tests"],
                num_passed=evaluation["pass_count"],
                evaluation=evaluation,
            )
        self._transcript += [">>> " + code, output]
        return output, float(reward), terminated, truncated, info

    def reference_cells(self) -> list[str] | None:
        """The current task's reference solution, one code cell a turn, where its data has one (the synthetic tasks'
        `ground_truth/solution_cells.json`; AppWorld's own data ships none): for scripted policies, never shown to the
        agent (its sandbox sees no ground truth)."""
        if self._task is None:
            raise RuntimeError("AppWorldEnv.reference_cells() needs a task; call reset() first.")
        path = self._pool_or_shared().root / "data" / "tasks" / self._task["task_id"] / "ground_truth" / "solution_cells.json"
        return json.loads(path.read_text()) if path.is_file() else None

    @property
    def interactions(self) -> int:
        """The code cells run so far in this episode."""
        return self._interactions

    @property
    def task_id(self) -> str | None:
        """The current task's id (None before the first reset)."""
        return None if self._task is None else self._task["task_id"]

    def evaluate(self) -> dict:
        """AppWorld's evaluation of the current task's world as it stands (also after the episode
        ended), for a policy that stops early: {success, difficulty, num_tests, pass_count, passes, failures}."""
        if self._task is None or self._server is None:
            raise RuntimeError("AppWorldEnv.evaluate() needs a task; call reset() first.")
        return self._pool.evaluate(self._server, self._task["task_id"])

    def metrics(self, results: dict[str, dict]) -> dict:
        """AppWorld's Metric over {task_id: evaluate() output}: TGC/SGC overall and per difficulty (percent)."""
        return self._pool_or_shared().metrics(results)

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return "\n".join(self._transcript)
        return None

    def close(self) -> None:
        if self._server is not None and self._pool is not None:
            if self._task is not None and self._server.alive() and not self._server.tainted:
                try:
                    self._server.call("close", timeout=10.0, task_id=self._task["task_id"])
                except AppWorldServerError:
                    pass  # the server was replaced; a fresh one has no world to close
            self._pool.release(self._server)
            self._server = None
        super().close()
