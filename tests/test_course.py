"""inferlab.course.catalog reads the course's structure from its files, for the pages that list it."""

import textwrap
from pathlib import Path

from inferlab.course import catalog, results


def test_toc_parts_and_files(root):
    parts = catalog.toc_parts(root)
    assert parts[""] == ["book/intro"]
    for caption in ("Chapters and labs", "Solutions", "Reference"):
        assert parts[caption], caption
    files = catalog.toc_files(root)
    assert files[0] == "book/intro" and len(files) == len(set(files))
    assert "book/instructor_guide" in files and "book/status" in files


def test_each_lab_comes_right_after_its_chapter_in_the_readers_path(root):
    """"Next" on the site follows toc_files' order: Chapter N's pages, then Lab N, then Chapter
    N+1. Only the chapters are numbered; every lab is on the path exactly once."""
    files = catalog.toc_files(root)
    chapters = catalog.chapters(root)
    labs = catalog.toc_pages("lab", root)
    assert [f"labs/{lab.stem}" for lab in catalog.labs(root)] == labs
    assert len(chapters) == len(labs)
    for (chapter, pages), lab in zip(chapters.items(), labs):
        assert Path(chapter).stem[2:4] == Path(lab).stem[:2], (chapter, lab)
        start = files.index(chapter)
        assert files[start:start + len(pages) + 1] == pages + [lab], (chapter, lab)
    assert catalog.toc_pages("chapter", root)[0] == "book/ch01_roofline"
    assert catalog.toc_pages("solution", root) == [f"solutions/{lab.stem}"
                                                   for lab in catalog.labs(root)]


def test_every_lab_has_a_solution_a_check_module_and_hints(root):
    labs = catalog.labs(root)
    assert labs and [lab.number for lab in labs] == sorted(lab.number for lab in labs)
    for lab in labs:
        assert lab.solution.is_file() and lab.check_module, lab
        assert lab.title and not lab.title.startswith("Lab")
        checks = catalog.check_summaries(lab.check_module, root)
        # The grader and the guide agree on which exercises a lab has.
        assert [c.exercise for c in checks] == list(results.exercises_of(lab.check_module).values())
        assert any(c.hints for c in checks), lab.check_module


def test_hints_are_found_in_keywords_messages_dicts_and_helpers(tmp_path):
    checks = tmp_path / "inferlab" / "course" / "checks"
    checks.mkdir(parents=True)
    (checks / "lab09.py").write_text(textwrap.dedent('''
        def _diagnose(x):
            return "helper hint"

        def _fail(value):
            raise CheckFailed(f"got {value}\\n  Hint: look at the sign.")

        def first(fn):
            """Exercise 9.1: ``first(x)``
            returns x."""
            expect_close("f", fn(1), 1, hint=f"think about {1}")
            hints = {"a": "from a dict"}
            _fail(_diagnose(0))

        def _hint_for(case):
            return "only through a helper"

        def second(fn):
            """No exercise label: not a check."""
    '''))
    [summary] = catalog.check_summaries("lab09", tmp_path)
    assert summary.exercise == "9.1" and summary.function == "first"
    assert summary.tests == "``first(x)`` returns x."
    assert set(summary.hints) == {"think about ...", "from a dict", "look at the sign."}
