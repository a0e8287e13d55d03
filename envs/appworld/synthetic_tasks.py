"""The synthetic AppWorld tasks as data: the people and notes a task's world holds, and per scenario (SCENARIOS,
difficulty and builder) its instruction, notes, answer, evaluation code and reference solution cells. Plain Python
(no `appworld` import): `envs.appworld.synthetic` writes them in AppWorld's layout."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from textwrap import dedent
from typing import Callable

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


def supervisor_email(first: str, last: str) -> str:
    """The email of a synthetic task's supervisor, from the names drawn from FIRST_NAMES and LAST_NAMES."""
    return f"{first.lower()}.{last.lower()}@example.com"


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
