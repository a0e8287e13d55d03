"""Offline synthetic AppWorld tasks, built from AppWorld's own app models.

Run inside the AppWorld virtual environment (it imports `appworld`, which pins pydantic 1):

    <appworld-venv>/bin/python -m envs.appworld.synthetic --out DIR

writes `DIR/data/` in AppWorld's on-disk layout: `base_dbs/<app>.db` (the schema of all apps,
no rows), `api_docs/standard/<app>.json` (built from the app source by `ApiDocCollection.build`),
`tasks/<scenario>_<n>/` (`specs.json`, `dbs/*.jsonl` change logs over the base DBs,
`ground_truth/` with `metadata.json`, `evaluation.py`, `test_data.json`, ...) and
`datasets/<split>.txt`. A task then runs in AppWorld's real REPL (`apis.<app>.<api>(...)`, its
safety guard, its frozen clock) and is scored by AppWorld's own evaluator. Nothing generated
here is meant to be committed: it is rebuilt at run time.

Scenarios (all on the SimpleNote app, the supervisor logs in with a password it has to look up):
difficulty 1 asks a count or a single note creation, difficulty 2 a filtered deletion that needs
pagination, difficulty 3 a filtered update over several notes plus an answer. Each scenario has
`--tasks-per-scenario` variants (different data), so SGC groups them like AppWorld does.

Every task also gets `ground_truth/solution_cells.json`: the code cells of a reference solution.
AppWorld itself ignores that file; the scripted "oracle" policy of `algorithms.evaluate` and the
tests use it.

The task templates (scenarios, notes, evaluation code, solution cells) are data: `envs.appworld.synthetic_tasks`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
from datetime import datetime

from envs.appworld.synthetic_tasks import FIRST_NAMES, LAST_NAMES, SCENARIOS, TaskSpec, supervisor_email

SPLITS = ("train", "dev")
TASK_DATETIME = datetime(2023, 5, 18, 12, 0, 0)


def scenario_id(split: str, name: str) -> str:
    """A 7-hex-digit scenario id like AppWorld's (`<scenario>_<n>` is the task id)."""
    return hashlib.sha1(f"{split}/{name}".encode()).hexdigest()[:7]


# ---------------------------------------------------------------- writing AppWorld's layout
def _write_json(obj: object, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as file:
        json.dump(obj, file, indent=2)


def build_base(data_dir: str) -> None:
    """Schema-only base DBs of every app and the API docs, both derived from the app source."""
    from appworld.apps import get_all_apps
    from appworld.apps.api_lib import set_local_dbs
    from appworld.apps.model_lib import CachedDBHandler
    from appworld.collections.api_docs import ApiDocCollection

    base = os.path.join(data_dir, "base_dbs")
    os.makedirs(base, exist_ok=True)
    set_local_dbs(to_db_home_path=base, from_db_home_path=base, app_names=get_all_apps(), create=True)
    CachedDBHandler.reset()
    # Only the "standard" format is needed to run tasks; ApiDocCollection.save would also
    # build the OpenAPI format, which needs an extra package.
    from appworld.common.constants import CANARY_STRING

    for app_name, api_name_to_doc in ApiDocCollection.build().items():
        docs = {api: dict(doc, canary_string=CANARY_STRING) for api, doc in api_name_to_doc.items()}
        _write_json(docs, os.path.join(data_dir, "api_docs", "standard", f"{app_name}.json"))


def build_task(data_dir: str, task_id: str, difficulty: int, spec: TaskSpec, rng: random.Random) -> None:
    from appworld.apps import get_all_apps
    from appworld.apps.api_lib import (
        save_local_dbs,
        set_local_date_and_time,
        set_local_dbs,
        unset_local_date_and_time,
    )
    from appworld.apps.model_lib import CachedDBHandler
    from appworld.common.constants import CANARY_STRING, DB_VERSION
    from appworld.common.utils import import_models_module

    apps = get_all_apps()
    memory_home = f":memory:synthetic-{task_id}"
    freezer = set_local_date_and_time(TASK_DATETIME)
    try:
        set_local_dbs(to_db_home_path=memory_home, from_db_home_path=os.path.join(data_dir, "base_dbs"), app_names=apps)
        admin, supervisor_app, simple_note = (import_models_module(a) for a in ("admin", "supervisor", "simple_note"))
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        person = {
            "first_name": first,
            "last_name": last,
            "email": supervisor_email(first, last),
            "phone_number": str(rng.randint(2_000_000_000, 9_999_999_999)),
        }
        password = "pw-" + "".join(rng.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(10))
        admin.MainUser.create_save(**person, birthday="1990-04-02", sex="female")
        supervisor = supervisor_app.Supervisor.create_save(**person, birthday="1990-04-02", sex="female")
        supervisor_app.Task.create_save(supervisor_id=supervisor.id, instruction=spec.instruction)
        for account in ("simple_note", "gmail", "todoist"):
            secret = password if account == "simple_note" else "pw-" + account + str(rng.randint(1000, 9999))
            supervisor_app.AccountPassword.create_save(supervisor_id=supervisor.id, account_name=account, password=secret)
        user = simple_note.User.create_save(
            first_name=first, last_name=last, email=person["email"], password=password, verified=True
        )
        for note in spec.notes:
            simple_note.Note.create_save(
                user_id=user.id, title=note.title, content=note.content, tags=note.tags, pinned=note.pinned
            )
        task_dir = os.path.join(data_dir, "tasks", task_id)
        shutil.rmtree(task_dir, ignore_errors=True)
        save_local_dbs(
            from_db_home_path=memory_home,
            to_db_home_path=os.path.join(task_dir, "dbs"),
            format="changes",
            app_names=list(apps),
            delete_if_exists=True,
            save_model_hashes=True,
        )
    finally:
        CachedDBHandler.reset(memory_home)
        unset_local_date_and_time(freezer)

    _write_json(
        {
            "instruction": spec.instruction,
            "supervisor": person,
            "datetime": TASK_DATETIME.isoformat(),
            "db_version": DB_VERSION,
            "canary_string": CANARY_STRING,
        },
        os.path.join(task_dir, "specs.json"),
    )
    truth = os.path.join(task_dir, "ground_truth")
    _write_json(spec.public_data, os.path.join(truth, "public_data.json"))
    _write_json(spec.private_data, os.path.join(truth, "private_data.json"))
    _write_json(spec.test_data, os.path.join(truth, "test_data.json"))
    _write_json(spec.solution_cells, os.path.join(truth, "solution_cells.json"))
    _write_json(
        {
            "mode": "minimal",
            "difficulty": difficulty,
            "num_apps": 1,
            "num_apis": None,
            "num_solution_code_lines": sum(len(c.splitlines()) for c in spec.solution_cells),
            "synthetic": True,
        },
        os.path.join(truth, "metadata.json"),
    )
    with open(os.path.join(truth, "answer.json"), "w") as file:
        file.write(json.dumps(spec.answer))
    with open(os.path.join(truth, "evaluation.py"), "w") as file:
        file.write(f"# Canary String: {CANARY_STRING}\n" + spec.evaluation_code)


def generate(out: str, tasks_per_scenario: int = 2, seed: int = 0, splits: tuple[str, ...] = SPLITS) -> dict[str, list[str]]:
    """Write the synthetic data under `out/data`; return split -> task ids."""
    out = os.path.abspath(out)
    os.environ["APPWORLD_ROOT"] = out
    from appworld.common.path_store import path_store

    path_store.update_root(out)
    data_dir = os.path.join(out, "data")
    for sub in ("tasks", "datasets", "base_dbs", "api_docs"):
        shutil.rmtree(os.path.join(data_dir, sub), ignore_errors=True)
    build_base(data_dir)
    split_ids: dict[str, list[str]] = {}
    for split in splits:
        ids = []
        for name, (difficulty, make) in SCENARIOS.items():
            for number in range(1, tasks_per_scenario + 1):
                rng = random.Random(f"{seed}/{split}/{name}/{number}")
                task_id = f"{scenario_id(split, name)}_{number}"
                build_task(data_dir, task_id, difficulty, make(rng), rng)
                ids.append(task_id)
        split_ids[split] = ids
        os.makedirs(os.path.join(data_dir, "datasets"), exist_ok=True)
        with open(os.path.join(data_dir, "datasets", f"{split}.txt"), "w") as file:
            file.write("\n".join(ids) + "\n")
    _write_json({"synthetic": True, "seed": seed, "splits": split_ids}, os.path.join(data_dir, "synthetic.json"))
    return split_ids


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="root directory; data goes to OUT/data")
    parser.add_argument("--tasks-per-scenario", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--splits", default=",".join(SPLITS))
    args = parser.parse_args(argv)
    split_ids = generate(args.out, args.tasks_per_scenario, args.seed, tuple(args.splits.split(",")))
    print(json.dumps({split: len(ids) for split, ids in split_ids.items()}))


if __name__ == "__main__":
    main()
