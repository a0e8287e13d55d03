"""The AppWorld server: one AppWorld task world per process, on 127.0.0.1 only.

Runs under the AppWorld virtual environment's interpreter (pydantic 1, fastapi < 0.111), never in
the project's environment:

    <appworld-venv>/bin/python envs/appworld/server.py --port 8123 --root DIR

`DIR/data` holds AppWorld's data (downloaded, or synthetic from `envs.appworld.synthetic`). Unlike
`appworld serve environment`, `/execute` also answers which APIs this call used (HTTP method, app,
api, from the requester's log) and which database writes it made (INSERT/UPDATE/DELETE statements
from AppWorld's DBChangesTracker), so the client learns whether the step mutated the world's
state without another request. Every response is `{"output": ...}`; a bad request is a 4xx whose
`detail` says what was wrong.

Handlers are `async def` on purpose: AppWorld times a cell out with SIGALRM, which only works in
the main thread, where the event loop runs.
"""

# ruff: noqa: B008  (FastAPI declares request fields as Body(...) defaults)
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import sys
from typing import Any


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


def build_app(root: str, experiment_name: str):  # noqa: C901 - one closure per endpoint
    os.environ["APPWORLD_ROOT"] = root
    import appworld
    from appworld.apps import get_all_apps
    from appworld.apps.model_lib import CachedDBHandler
    from appworld.common.path_store import path_store
    from appworld.environment import AppWorld
    from appworld.evaluator import Metric
    from appworld.requester import _get_api_name_to_doc
    from appworld.task import load_task_ids
    from fastapi import Body, FastAPI, HTTPException

    path_store.update_root(root)
    state: dict[str, Any] = {"world": None}

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        close_world()

    app = FastAPI(title="vcbm-gym AppWorld server", lifespan=lifespan)

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

    @app.get("/health")
    async def health() -> dict:
        world = state["world"]
        return {
            "output": {
                "status": "ok",
                "pid": os.getpid(),
                "appworld_version": appworld.__version__,
                "root": root,
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
        if not os.path.isdir(os.path.join(path_store.data, "tasks", task_id)):
            raise HTTPException(
                404, f"Unknown task_id {task_id!r}: no folder {path_store.data}/tasks/{task_id}."
            )
        close_world()
        has_truth = os.path.isdir(os.path.join(path_store.data, "tasks", task_id, "ground_truth"))
        world = AppWorld(
            task_id=task_id,
            experiment_name=experiment_name,
            max_interactions=max_interactions,
            timeout_seconds=timeout_seconds,
            random_seed=random_seed,
            load_ground_truth=has_truth,
        )
        state["world"] = world
        task = world.task
        metadata = task.ground_truth.metadata if task.ground_truth else {}
        supervisor = {
            key: task.supervisor[key] for key in ("first_name", "last_name", "email", "phone_number")
        }
        return {
            "output": {
                "task_id": task.id,
                "instruction": task.instruction,
                "supervisor": supervisor,
                "datetime": task.datetime.isoformat(),
                "difficulty": metadata.get("difficulty"),
                "has_ground_truth": task.ground_truth is not None,
                "app_descriptions": task.app_descriptions,
            }
        }

    @app.post("/execute")
    async def execute(task_id: str = Body(...), code: str = Body(...)) -> dict:
        world = world_for(task_id)
        requests_before = len(world.requester.request_tracker.requests)
        app_trackers = trackers(world)
        changes_before = {name: len(tracker.changes) for name, tracker in app_trackers.items()}
        output = world.execute(code)
        api_calls = [
            api_of(r["method"].upper(), r["url"])
            for r in world.requester.request_tracker.requests[requests_before:]
        ]
        db_writes = []
        for name, tracker in app_trackers.items():
            for statement, _, _ in tracker.changes[changes_before[name] :]:
                operation, table = _statement_target(statement)
                db_writes.append({"app": name, "operation": operation, "table": table})
        return {
            "output": {
                "output": output,
                "api_calls": api_calls,
                "db_writes": db_writes,
                "state_mutating": bool(db_writes),
                "num_interactions": world.num_interactions,
                "task_completed": bool(world.task_completed()),
            }
        }

    @app.post("/task_completed")
    async def task_completed(task_id: str = Body(..., embed=True)) -> dict:
        return {"output": bool(world_for(task_id).task_completed())}

    @app.post("/evaluate")
    async def evaluate(task_id: str = Body(..., embed=True)) -> dict:
        world = world_for(task_id)
        if world.task.ground_truth is None:
            raise HTTPException(
                422, f"Task {task_id!r} has no ground_truth folder, so it cannot be evaluated."
            )
        tracker = world.evaluate(suppress_errors=True)
        result = tracker.to_dict(stats_only=False)
        result["pass_count"] = tracker.pass_count
        return {"output": result}

    @app.post("/close")
    async def close(task_id: str = Body(..., embed=True)) -> dict:
        world_for(task_id)
        close_world()
        return {"output": None}

    @app.post("/task_ids")
    async def task_ids(split: str = Body(...), difficulty: int | None = Body(None)) -> dict:
        try:
            ids = load_task_ids(split)
        except Exception as error:  # AppWorld raises bare Exception for a missing split file.
            raise HTTPException(404, f"Split {split!r} not found under {path_store.data}: {error}") from error
        difficulties = {}
        for task_id in ids:
            metadata_path = os.path.join(path_store.data, "tasks", task_id, "ground_truth", "metadata.json")
            if os.path.exists(metadata_path):
                with open(metadata_path) as file:
                    difficulties[task_id] = json.load(file).get("difficulty")
            else:
                difficulties[task_id] = None
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
    parser = argparse.ArgumentParser(description="AppWorld task server for vcbm-gym (loopback only).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", required=True, help="directory that holds AppWorld's data/ folder")
    parser.add_argument(
        "--experiment-name", default=None, help="AppWorld output folder name (default: per port)"
    )
    args = parser.parse_args(argv)
    root = os.path.abspath(args.root)
    if not os.path.isdir(os.path.join(root, "data")):
        sys.exit(f"--root {root} has no data/ folder; run `python -m envs.appworld.setup` first.")
    import uvicorn

    app = build_app(root, args.experiment_name or f"vcbm_gym_port{args.port}")
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
