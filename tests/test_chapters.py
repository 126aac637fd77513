"""Every chapter follows the one template that MAINTAINING.md's "Add a chapter" describes.

Objectives before the first section; the first code cell (the imports) shown, not hidden; each
content section ending in a takeaway; then "In the lab", "Summary", "Exercises" and
"References", in that order and last; at least four exercises, each answered in a drop-down
whose numbers a code cell computes; and no forward reference that names a chapter which does
not exist.
"""

import re
from pathlib import Path

import pytest

from inferlab.course import catalog

TAIL = ["In the lab", "Summary", "Exercises", "References"]


def _chapters(root):
    """``{chapter stem: its text}``; a chapter split into section pages reads as their text in
    order, so the template holds for the chapter as a whole."""
    chapters = catalog.chapters(root)
    assert chapters, "_toc.yml has no numbered chapters"
    return {Path(ch).stem: "\n".join((root / f"{p}.md").read_text(encoding="utf-8")
                                      for p in pages) for ch, pages in chapters.items()}


def _sections(text: str) -> list[tuple[str, str]]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return [(parts[i].strip(), parts[i + 1]) for i in range(1, len(parts), 2)]


@pytest.fixture(scope="module")
def chapters(root):
    return _chapters(root)


def test_objectives_come_before_the_first_section(chapters):
    for name, text in chapters.items():
        head = text.split("\n## ", 1)[0]
        assert "By the end of the chapter you should be able to:" in head, name
        bullets = head.split("you should be able to:", 1)[1]
        assert len(re.findall(r"^- ", bullets, re.M)) >= 3, f"{name}: fewer than 3 objectives"


def test_the_first_code_cell_is_shown(chapters):
    for name, text in chapters.items():
        first = text.split("```{code-cell}", 1)[1].split("\n```", 1)[0]
        header = first.split("\n", 1)[1][:300]
        assert "hide-input" not in header and "remove-input" not in header, \
            f"{name}: the first code cell (the imports) must be shown"


def test_sections_end_in_takeaways_and_the_tail_is_in_order(chapters):
    for name, text in chapters.items():
        titles = [t for t, _ in _sections(text)]
        assert titles[-len(TAIL):] == TAIL, f"{name}: the last sections are {titles[-4:]}"
        for title, body in _sections(text)[:-len(TAIL)]:
            assert "Takeaway" in body, f"{name}: section {title!r} has no takeaway"


def test_at_least_four_exercises_each_answered_in_a_dropdown(chapters):
    for name, text in chapters.items():
        labels = re.findall(r"```\{exercise\}\n:label: (\S+)", text)
        assert len(labels) >= 4, f"{name}: {len(labels)} exercises"
        for label in labels:
            m = re.search(r"`{3,4}\{solution(?:-start)?\} " + re.escape(label) + r"\n:class: dropdown",
                          text)
            assert m, f"{name}: exercise {label} has no drop-down solution"


def test_forward_references_do_not_promise_missing_chapters(root, chapters):
    existing = {int(p.stem[2:4]) for p in (root / "book").glob("ch[0-9][0-9]_*.md")}
    for name, text in chapters.items():
        for m in re.finditer(r"Chapter (\d+)", text):
            assert int(m.group(1)) in existing, f"{name}: refers to Chapter {m.group(1)}"
        assert "a later chapter" not in text.lower(), f"{name}: promises 'a later chapter'"
