"""AppWorld servers: one task world per process, or the evaluator, on a Unix socket.

Runs under the AppWorld virtual environment's interpreter (pydantic 1, fastapi < 0.111), never in
the project's environment, normally inside the sandbox that `envs.appworld.pool` builds:

    <appworld-venv>/bin/python envs/appworld/server.py --role world --socket PATH --root DIR

The first line of stdin is the shared secret: every request must carry it in the
`X-Vcbm-Secret` header (401 otherwise), so only the pool that started the server can use it.

Role `world` runs agent code and never sees ground truth (its data folder has none). Unlike
`appworld serve environment`, `/execute` also answers which APIs this call used and which
database writes it made (from AppWorld's DBChangesTracker), whether the agent left threads or
processes running (`tainted`), and caps the output at `max_output` characters with a marker.
AppWorld saves the world's database state after every call; the pool copies it out for the
evaluator.

Role `evaluator` holds the ground truth and runs no agent code: `/evaluate` scores a saved world
state with AppWorld's own evaluator, `/task_ids` and `/task_info` read the splits' metadata,
`/metrics` is AppWorld's Metric.

Handlers are `async def` on purpose: AppWorld times a cell out with SIGALRM, which only works in
the main thread, where the event loop runs. Every response is `{"output": ...}` as ASCII JSON (a
lone surrogate in agent output cannot break the encoder); a bad request is a 4xx with `detail`.
"""

# ruff: noqa: B008  (FastAPI declares request fields as Body(...) defaults)
from __future__ import annotations

import argparse
import contextlib
import functools
import hmac
import json
import os
import re
import resource
import sys
import threading
from typing import Any

TRUNCATION_MARKER = "\n[vcbm-gym: output truncated: {cut} of {total} characters cut]"


def _statement_target(statement: str) -> tuple[str, str]:
    """('INSERT'|'UPDATE'|'DELETE'|..., table) of one SQL statement recorded by DBChangesTracker."""
    match = re.match(
        r"\s*(INSERT(?:\s+OR\s+\w+)?\s+INTO|UPDATE|DELETE\s+FROM|CREATE\s+\w+|DROP\s+\w+)\s+[\"`]?(\w+)",
        statement,
        re.IGNORECASE,
    )
    if not match:
        return statement.split()[0].upper(), ""
    return match.group(1).split()[0].upper(), match.group(2)


def cap_output(text: str, max_output: int) -> str:
    """`text` cut to at most `max_output` characters, ending with a marker saying how much was cut."""
    if len(text) <= max_output:
        return text
    marker = TRUNCATION_MARKER.format(cut=len(text) - max_output, total=len(text))
    for _ in range(2):  # the marker's own length changes the count at most once more
        keep = max(max_output - len(marker), 0)
        marker = TRUNCATION_MARKER.format(cut=len(text) - keep, total=len(text))
    keep = max(max_output - len(marker), 0)
    return (text[:keep] + marker)[:max_output]


def printable(text: str) -> str:
    """Lone surrogates (e.g. print('\\udcff')) shown as escapes instead of breaking UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _common(secret: str, title: str):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    class AsciiJSON(JSONResponse):
        def render(self, content: Any) -> bytes:
            return json.dumps(content, ensure_ascii=True).encode("ascii")

    app = FastAPI(title=title, default_response_class=AsciiJSON)
    expected = secret.encode()

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        given = request.headers.get("x-vcbm-secret", "").encode()
        if not hmac.compare_digest(given, expected):
            return Response('{"detail": "missing or wrong X-Vcbm-Secret"}', status_code=401)
        return await call_next(request)

    return app


def build_world_app(root: str, experiment_name: str, secret: str, count_processes: bool):  # noqa: C901
    os.environ["APPWORLD_ROOT"] = root
    import appworld
    from appworld.apps import get_all_apps
    from appworld.apps.model_lib import CachedDBHandler
    from appworld.common.path_store import path_store
    from appworld.environment import AppWorld
    from appworld.requester import _get_api_name_to_doc
    from fastapi import Body, HTTPException

    path_store.update_root(root)
    state: dict[str, Any] = {"world": None}
    app = _common(secret, "vcbm-gym AppWorld world server")

    @functools.cache
    def url_patterns(app_name: str) -> list[tuple[str, re.Pattern, str]]:
        """(METHOD, path regex, api name) of one app; literal paths before templated ones.

        Built on first use from the requester's own cached docs: building every app's docs at
        start-up would cost tens of seconds.
        """
        patterns = []
        for api_name, doc in _get_api_name_to_doc(app_name, include_private_apis=True).items():
            regex = "^" + re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(doc["path"])) + "/?$"
            patterns.append((doc["method"].upper(), re.compile(regex), api_name))
        return sorted(patterns, key=lambda entry: entry[1].pattern.count("[^/]+"))

    def api_of(method: str, url: str) -> dict[str, str]:
        path = re.sub(r"^https?://[^/]+", "", url).split("?")[0]
        app_name = path.strip("/").split("/")[0]
        if app_name in get_all_apps():
            for pattern_method, pattern, api_name in url_patterns(app_name):
                if pattern_method == method and pattern.match(path):
                    return {"method": method, "app": app_name, "api": api_name}
        return {"method": method, "app": app_name, "api": ""}

    def world_for(task_id: str) -> AppWorld:
        world = state["world"]
        if world is None:
            raise HTTPException(409, "No task is initialized on this server; POST /initialize first.")
        if world.task_id != task_id:
            raise HTTPException(409, f"This server runs task {world.task_id!r}, not {task_id!r}.")
        return world

    def trackers(world: AppWorld) -> dict[str, Any]:
        prefix = world.output_db_home_path_in_memory + "/"
        return {
            path[len(prefix) :].rsplit(".", 1)[0]: tracker
            for path, (_, tracker) in CachedDBHandler.cache.items()
            if path.startswith(prefix)
        }

    def close_world() -> None:
        world = state["world"]
        state["world"] = None
        if world is not None:
            world.close()
        AppWorld.close_all()

    def infrastructure(thread: threading.Thread) -> bool:
        """AnyIO's worker and portal threads, which AppWorld's in-process API client starts and reuses."""
        code = getattr(getattr(thread, "_target", None), "__module__", None) or type(thread).__module__
        return code.startswith("anyio")

    def tainted(threads_before: set[int | None]) -> list[str]:
        """What agent code left running: threads and (inside the sandbox's PID namespace) processes."""
        left = [
            f"thread {thread.name}"
            for thread in threading.enumerate()
            if thread.ident not in threads_before and thread.is_alive() and not infrastructure(thread)
        ]
        if count_processes:  # pid 1 is bubblewrap's init, the server is the only other process
            own = {"1", str(os.getpid())}
            left += [f"process {pid}" for pid in os.listdir("/proc") if pid.isdigit() and pid not in own]
        return left

    @app.get("/health")
    async def health() -> dict:
        world = state["world"]
        return {
            "output": {
                "status": "ok",
                "pid": os.getpid(),
                "appworld_version": appworld.__version__,
                "task_id": world.task_id if world else None,
            }
        }

    @app.post("/initialize")
    async def initialize(
        task_id: str = Body(...),
        max_interactions: int = Body(1000),
        timeout_seconds: int = Body(100),
        random_seed: int = Body(100),
    ) -> dict:
        if not re.fullmatch(r"[\w.-]+", task_id) or not os.path.isdir(os.path.join(path_store.data, "tasks", task_id)):
            raise HTTPException(404, f"Unknown task_id {task_id!r}: no such task in the data's tasks folder.")
        if timeout_seconds < 1:
            raise HTTPException(422, f"timeout_seconds must be >= 1, got {timeout_seconds}")
        close_world()
        world = AppWorld(
            task_id=task_id,
            experiment_name=experiment_name,
            max_interactions=max_interactions,
            timeout_seconds=timeout_seconds,
            random_seed=random_seed,
            load_ground_truth=False,
        )
        state["world"] = world
        save_logs = world.save_logs

        def printable_save_logs() -> None:
            # AppWorld writes its I/O log as UTF-8, which a lone surrogate in code or output breaks
            for entry in world.environment_io:
                entry["input"], entry["output"] = printable(entry["input"]), printable(entry["output"])
            save_logs()

        world.save_logs = printable_save_logs
        task = world.task
        supervisor = {key: task.supervisor[key] for key in ("first_name", "last_name", "email", "phone_number")}
        return {
            "output": {
                "task_id": task.id,
                "instruction": task.instruction,
                "supervisor": supervisor,
                "datetime": task.datetime.isoformat(),
                "app_descriptions": task.app_descriptions,
                "output_dbs": os.path.relpath(world.output_db_home_path_on_disk, root),
            }
        }

    @app.post("/execute")
    async def execute(task_id: str = Body(...), code: str = Body(...), max_output: int = Body(1_000_000)) -> dict:
        world = world_for(task_id)
        if max_output < 1:
            raise HTTPException(422, f"max_output must be >= 1, got {max_output}")
        requests_before = len(world.requester.request_tracker.requests)
        app_trackers = trackers(world)
        changes_before = {name: len(tracker.changes) for name, tracker in app_trackers.items()}
        threads_before = {thread.ident for thread in threading.enumerate()}
        try:
            output = world.execute(code)
        finally:
            # an exception escaping AppWorld would leave its guard on (every later open() for
            # writing fails); the pool replaces the server after a 500 anyway
            world.safety_guard.disable()
        api_calls = [api_of(r["method"].upper(), r["url"]) for r in world.requester.request_tracker.requests[requests_before:]]
        db_writes = []
        for name, tracker in app_trackers.items():
            for statement, _, _ in tracker.changes[changes_before[name] :]:
                operation, table = _statement_target(statement)
                db_writes.append({"app": name, "operation": operation, "table": table})
        return {
            "output": {
                "output": cap_output(printable(output), max_output),
                "api_calls": api_calls,
                "db_writes": db_writes,
                "state_mutating": bool(db_writes),
                "num_interactions": world.num_interactions,
                "task_completed": bool(world.task_completed()),
                "tainted": tainted(threads_before),
            }
        }

    @app.post("/task_completed")
    async def task_completed(task_id: str = Body(..., embed=True)) -> dict:
        return {"output": bool(world_for(task_id).task_completed())}

    @app.post("/close")
    async def close(task_id: str = Body(..., embed=True)) -> dict:
        world_for(task_id)
        close_world()
        return {"output": None}

    return app


def build_evaluator_app(root: str, secret: str):  # noqa: C901
    os.environ["APPWORLD_ROOT"] = root
    from appworld.apps.model_lib import CachedDBHandler
    from appworld.common.path_store import path_store
    from appworld.evaluator import Metric, evaluate_task
    from appworld.task import load_task_ids
    from fastapi import Body, HTTPException

    path_store.update_root(root)
    app = _common(secret, "vcbm-gym AppWorld evaluator")

    def task_dir(task_id: str) -> str:
        path = os.path.join(path_store.data, "tasks", task_id)
        if not re.fullmatch(r"[\w.-]+", task_id) or not os.path.isdir(path):
            raise HTTPException(404, f"Unknown task_id {task_id!r}: no such task in the data's tasks folder.")
        return path

    def info_of(task_id: str) -> dict:
        metadata_path = os.path.join(task_dir(task_id), "ground_truth", "metadata.json")
        if not os.path.exists(metadata_path):
            return {"difficulty": None, "has_ground_truth": False}
        with open(metadata_path) as file:
            return {"difficulty": json.load(file).get("difficulty"), "has_ground_truth": True}

    @app.get("/health")
    async def health() -> dict:
        return {"output": {"status": "ok", "pid": os.getpid()}}

    @app.post("/task_info")
    async def task_info(task_id: str = Body(..., embed=True)) -> dict:
        return {"output": info_of(task_id)}

    @app.post("/evaluate")
    async def evaluate(task_id: str = Body(...), experiment_name: str = Body(...)) -> dict:
        if not info_of(task_id)["has_ground_truth"]:
            raise HTTPException(422, f"Task {task_id!r} has no ground_truth folder, so it cannot be evaluated.")
        CachedDBHandler.reset()  # the saved state is loaded from disk, never from an earlier call
        tracker = evaluate_task(task_id, experiment_name, suppress_errors=True, save_report=False)
        CachedDBHandler.reset()
        result = tracker.to_dict(stats_only=False)
        result["pass_count"] = tracker.pass_count
        return {"output": result}

    @app.post("/task_ids")
    async def task_ids(split: str = Body(...), difficulty: int | None = Body(None)) -> dict:
        try:
            ids = load_task_ids(split)
        except Exception as error:  # AppWorld raises bare Exception for a missing split file.
            raise HTTPException(404, f"Split {split!r} not found in the data's datasets folder: {error}") from error
        difficulties = {task_id: info_of(task_id)["difficulty"] for task_id in ids}
        if difficulty is not None:
            ids = [task_id for task_id in ids if difficulties[task_id] == difficulty]
        return {"output": {"task_ids": ids, "difficulties": {t: difficulties[t] for t in ids}}}

    @app.post("/metrics")
    async def metrics(results: dict = Body(..., embed=True)) -> dict:
        """TGC/SGC overall and per difficulty (AppWorld's Metric) from per-task /evaluate outputs."""
        if not results:
            raise HTTPException(422, "results must map at least one task_id to its /evaluate output.")
        computed = Metric._compute_metrics(results)
        return {"output": {"aggregate": computed["aggregate"], "table": Metric.build_report(computed)}}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="AppWorld server for vcbm-gym (Unix socket).")
    parser.add_argument("--role", choices=("world", "evaluator"), required=True)
    parser.add_argument("--socket", required=True, help="Unix socket path to serve on")
    parser.add_argument("--root", required=True, help="directory that holds AppWorld's data/ folder")
    parser.add_argument("--experiment-name", default="vcbm_gym", help="AppWorld output folder name")
    parser.add_argument("--nproc", type=int, default=0, help="RLIMIT_NPROC for this server (0: unchanged)")
    parser.add_argument("--sandboxed", action="store_true", help="inside bwrap's PID namespace: report stray processes")
    args = parser.parse_args(argv)
    secret = sys.stdin.readline().strip()
    if len(secret) < 32:
        sys.exit("expected the pool's secret (at least 32 characters) on the first line of stdin")
    if args.nproc:
        # set here, inside the sandbox: in a user namespace the count is per namespace only
        resource.setrlimit(resource.RLIMIT_NPROC, (args.nproc, args.nproc))
    os.umask(0o077)  # the socket and every file the server writes: owner only
    root = os.path.abspath(args.root)
    if not os.path.isdir(os.path.join(root, "data")):
        sys.exit(f"--root {root} has no data/ folder; run `python -m envs.appworld.setup` first.")
    import uvicorn

    if args.role == "world":
        app = build_world_app(root, args.experiment_name, secret, count_processes=args.sandboxed)
    else:
        app = build_evaluator_app(root, secret)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(args.socket)
    uvicorn.run(app, uds=args.socket, log_level="warning")


if __name__ == "__main__":
    main()
