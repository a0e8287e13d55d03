"""The repository's front page and docs pages as the tests read them: a page's section under a heading, and the
fenced code blocks in it, so that every command a page shows is found wherever the page now keeps it."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"


def section(page: Path, heading: str) -> str:
    """The text of `page` from the line `heading` (e.g. "## Usage") up to the next heading of the same or a higher
    level; a heading the page lacks fails the calling test with the page and heading named."""
    text = page.read_text()
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines(keepends=True)
    in_fence = False
    start = None
    for number, line in enumerate(lines):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence or not line.startswith("#"):
            continue
        if start is None:
            if line.rstrip("\n") == heading:
                start = number
        elif len(line) - len(line.lstrip("#")) <= level:
            return "".join(lines[start:number])
    assert start is not None, f"{page.relative_to(REPO)} has no heading {heading!r}"
    return "".join(lines[start:])


def first_blocks(text: str) -> dict[str, str]:
    """The first fenced block of each language (```python, ```bash) in `text`, by language."""
    blocks: dict[str, str] = {}
    for block in text.split("```")[1::2]:
        language, _, body = block.partition("\n")
        blocks.setdefault(language.strip(), body)
    return blocks
