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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from textwrap import dedent
from typing import Callable

SPLITS = ("train", "dev")
TASK_DATETIME = datetime(2023, 5, 18, 12, 0, 0)
FIRST_NAMES = ["Maya", "Jonas", "Priya", "Tomas", "Leila", "Owen", "Ines", "Kofi", "Sara", "Hugo"]
LAST_NAMES = ["Okafor", "Lindqvist", "Raman", "Duarte", "Haddad", "Brennan", "Moreau", "Mensah"]
NOTE_TOPICS = [
    "groceries",
    "book ideas",
    "gym plan",
    "travel packing",
    "meeting notes",
    "recipes",
    "movie list",
    "budget",
    "garden",
    "birthday gifts",
    "car service",
    "podcast picks",
    "language practice",
    "home repairs",
    "running log",
    "wine list",
]
TAGS = ["work", "personal", "ideas", "errands", "archive", "urgent"]


@dataclass
class NoteSpec:
    title: str
    content: str
    tags: list[str]
    pinned: bool


@dataclass
class TaskSpec:
    instruction: str
    notes: list[NoteSpec]
    answer: object
    evaluation_code: str
    test_data: list[dict]
    private_data: dict
    solution_cells: list[str]
    public_data: dict = field(default_factory=dict)


# ---------------------------------------------------------------- reference solution pieces
LOGIN_CELL = dedent(
    """
    passwords = {p["account_name"]: p["password"] for p in apis.supervisor.show_account_passwords()}
    profile = apis.supervisor.show_profile()
    token = apis.simple_note.login(username=profile["email"], password=passwords["simple_note"])["access_token"]
    print("logged in")
    """
).strip()

ALL_NOTES_CELL = dedent(
    """
    notes = []
    page_index = 0
    while True:
        page = apis.simple_note.search_notes(access_token=token, page_index=page_index, page_limit=20)
        if not page:
            break
        notes.extend(page)
        page_index += 1
    print(len(notes))
    """
).strip()

ANSWER_OF_TASK = dedent(
    """
    import json


    def predicted_answer(models):
        tasks = models.end.supervisor.Task.all()
        return json.loads(tasks[0].answer) if tasks else None
    """
).strip()


def _requirement_block(requirement: str, body: str) -> str:
    lines = [f"    with test({requirement!r}):"]
    lines += ["        " + line for line in dedent(body).strip().splitlines()]
    return "\n".join(lines)


def _evaluation(blocks: list[tuple[str, str]]) -> str:
    header = (
        ANSWER_OF_TASK + "\n\n\n" + ("def evaluate(test, public_data, private_data, main_user, models, ground_truth_answer):")
    )
    return header + "\n" + "\n".join(_requirement_block(r, b) for r, b in blocks) + "\n"


def _random_notes(rng: random.Random, count: int) -> list[NoteSpec]:
    topics = rng.sample(NOTE_TOPICS, count)
    return [
        NoteSpec(
            title=topic.capitalize(),
            content=f"{topic}: " + ", ".join(rng.sample(["a", "b", "c", "d", "e", "f"], 3)),
            tags=rng.sample(TAGS, rng.randint(0, 2)),
            pinned=False,
        )
        for topic in topics
    ]


# ---------------------------------------------------------------- scenarios
def count_notes(rng: random.Random) -> TaskSpec:
    notes = _random_notes(rng, rng.randint(3, 9))
    no_change = "models.changed_model_names() == set()"
    return TaskSpec(
        instruction="How many notes do I have in my SimpleNote account?",
        notes=notes,
        answer=len(notes),
        evaluation_code=_evaluation(
            [
                (
                    "the answer is the number of notes",
                    "test.answer(predicted_answer(models), ground_truth_answer)",
                ),
                ("no database record is changed", f"test.case({no_change}, '==', True)"),
            ]
        ),
        test_data=[
            {"requirement": "the answer is the number of notes", "label": "no_op_fail"},
            {"requirement": "no database record is changed", "label": "no_op_pass"},
        ],
        private_data={},
        solution_cells=[
            LOGIN_CELL,
            ALL_NOTES_CELL,
            "apis.supervisor.complete_task(answer=len(notes))",
        ],
    )


def create_note(rng: random.Random) -> TaskSpec:
    notes = _random_notes(rng, rng.randint(2, 5))
    title = (
        f"{rng.choice(['Call', 'Email', 'Visit'])} {rng.choice(FIRST_NAMES)} about the {rng.choice(['lease', 'invoice', 'trip'])}"
    )
    content = f"Remember to ask about {rng.choice(['dates', 'prices', 'the contract', 'parking'])}."
    return TaskSpec(
        instruction=f'Create a note in SimpleNote titled "{title}" with the content "{content}".',
        notes=notes,
        answer=None,
        evaluation_code=_evaluation(
            [
                (
                    "exactly one note is added and no note is updated or removed",
                    """
                added, updated, removed = models.changed_records("simple_note.Note")
                test.case((len(added), len(updated), len(removed)), "==", (1, 0, 0))
            """,
                ),
                (
                    "the added note has the requested title and content",
                    """
                added, _, _ = models.changed_records("simple_note.Note")
                test.case(len(added), "==", 1)
                test.case(added[0].title, "==", private_data.title, strip=True)
                test.case(added[0].content, "==", private_data.content, strip=True)
            """,
                ),
                (
                    "no other kind of record is changed",
                    """
                test.case(models.changed_model_names() - {"simple_note.Note"}, "==", set())
            """,
                ),
            ]
        ),
        test_data=[
            {
                "requirement": "exactly one note is added and no note is updated or removed",
                "label": "no_op_fail",
            },
            {"requirement": "the added note has the requested title and content", "label": "no_op_fail"},
            {"requirement": "no other kind of record is changed", "label": "no_op_pass"},
        ],
        private_data={"title": title, "content": content},
        solution_cells=[
            LOGIN_CELL,
            f"print(apis.simple_note.create_note(access_token=token, title={title!r}, content={content!r}))",
            "apis.supervisor.complete_task()",
        ],
    )


def delete_tagged(rng: random.Random) -> TaskSpec:
    tag = rng.choice(TAGS)
    notes = _random_notes(rng, rng.randint(8, 12))
    for note in notes:
        note.tags = [t for t in note.tags if t != tag]
    for note in rng.sample(notes, rng.randint(2, 4)):
        note.tags.append(tag)
    tagged_titles = sorted(n.title for n in notes if tag in n.tags)
    return TaskSpec(
        instruction=f'Delete all of my SimpleNote notes that carry the tag "{tag}".',
        notes=notes,
        answer=None,
        evaluation_code=_evaluation(
            [
                (
                    "every note with the tag is removed",
                    """
                _, _, removed = models.changed_records("simple_note.Note")
                test.case(sorted(note.title for note in removed), "==", private_data.tagged_titles)
            """,
                ),
                (
                    "no note without the tag is removed or updated",
                    """
                _, updated, removed = models.changed_records("simple_note.Note")
                test.case([n.title for n in removed if n.title not in private_data.tagged_titles] + [n.title for n in updated], "==", [])
            """,
                ),
                (
                    "no other kind of record is changed",
                    """
                test.case(models.changed_model_names() - {"simple_note.Note"}, "==", set())
            """,
                ),
            ]
        ),
        test_data=[
            {"requirement": "every note with the tag is removed", "label": "no_op_fail"},
            {"requirement": "no note without the tag is removed or updated", "label": "no_op_pass"},
            {"requirement": "no other kind of record is changed", "label": "no_op_pass"},
        ],
        private_data={"tag": tag, "tagged_titles": tagged_titles},
        solution_cells=[
            LOGIN_CELL,
            ALL_NOTES_CELL,
            dedent(
                f"""
                for note in notes:
                    if {tag!r} in note["tags"]:
                        print(apis.simple_note.delete_note(access_token=token, note_id=note["note_id"]))
                """
            ).strip(),
            "apis.supervisor.complete_task()",
        ],
    )


def mark_pinned_reviewed(rng: random.Random) -> TaskSpec:
    notes = _random_notes(rng, rng.randint(7, 11))
    for note in rng.sample(notes, rng.randint(2, 4)):
        note.pinned = True
    line = f"Reviewed on {rng.choice(['Monday', 'Friday', 'Sunday'])}."
    pinned_titles = sorted(n.title for n in notes if n.pinned)
    return TaskSpec(
        instruction=(
            f'Append the line "{line}" to the end of every pinned note in my SimpleNote account, '
            "and tell me how many notes you updated."
        ),
        notes=notes,
        answer=len(pinned_titles),
        evaluation_code=_evaluation(
            [
                (
                    "every pinned note ends with the requested line",
                    """
                _, updated, _ = models.changed_records("simple_note.Note")
                test.case(sorted(n.title for n in updated if n.content.rstrip().endswith(private_data.line)), "==", private_data.pinned_titles)
            """,
                ),
                (
                    "no unpinned note is changed and no note is added or removed",
                    """
                added, updated, removed = models.changed_records("simple_note.Note")
                test.case([n.title for n in updated if not n.pinned] + [n.title for n in added + removed], "==", [])
            """,
                ),
                (
                    "the answer is the number of updated notes",
                    "test.answer(predicted_answer(models), ground_truth_answer)",
                ),
            ]
        ),
        test_data=[
            {"requirement": "every pinned note ends with the requested line", "label": "no_op_fail"},
            {
                "requirement": "no unpinned note is changed and no note is added or removed",
                "label": "no_op_pass",
            },
            {"requirement": "the answer is the number of updated notes", "label": "no_op_fail"},
        ],
        private_data={"line": line, "pinned_titles": pinned_titles},
        solution_cells=[
            LOGIN_CELL,
            ALL_NOTES_CELL,
            dedent(
                f"""
                pinned = [note for note in notes if note["pinned"]]
                for note in pinned:
                    apis.simple_note.add_content_to_note(access_token=token, note_id=note["note_id"], added_content="\\n" + {line!r}, append_or_prepend="append")
                print(len(pinned))
                """
            ).strip(),
            "apis.supervisor.complete_task(answer=len(pinned))",
        ],
    )


SCENARIOS: dict[str, tuple[int, Callable[[random.Random], TaskSpec]]] = {
    "count_notes": (1, count_notes),
    "create_note": (1, create_note),
    "delete_tagged": (2, delete_tagged),
    "mark_pinned_reviewed": (3, mark_pinned_reviewed),
}


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
            "email": f"{first.lower()}.{last.lower()}@example.com",
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
