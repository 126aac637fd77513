"""inferlab.course.catalog reads the course's structure from its files, for the pages that list it."""

import re
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


# --- The instructor guide holds to the catalog --------------------------------------------------

def _guide_section(guide: str, heading: str) -> str:
    start = guide.index(heading)
    end = guide.find("\n## ", start + len(heading))
    return guide[start:end if end > 0 else len(guide)]


def guide_problems(guide: str, chapters: list[str], labs: list[int]) -> list[str]:
    """Where the instructor guide disagrees with the course: objectives for every chapter, in
    order, each naming its page and its lab; the lab-by-lab advice for every lab, in order; a
    course plan that schedules every chapter and its lab, one a week, in order; and no count of
    labs, chapters or notebooks typed into the prose (the page computes them)."""
    problems = []
    objectives = re.findall(r"^\*\*Chapter (\d+),.*?\*\* \(\{doc\}`(\w+)`, lab (\d+)\)",
                            _guide_section(guide, "## Learning objectives"), re.M)
    expected = [(str(i), Path(c).name, str(i)) for i, c in enumerate(chapters, 1)]
    if objectives != expected:
        problems.append(f"objectives {objectives}, expected {expected}")
    stuck = [int(n) for n in re.findall(r"^\*\*Lab (\d+) \(", _guide_section(
        guide, "## Where learners get stuck"), re.M)]
    if stuck != labs:
        problems.append(f"lab-by-lab advice for labs {stuck}, expected {labs}")
    plan = _guide_section(guide, "## Syllabus: a course")
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in plan.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    weeks = [int(row[0]) for row in rows]
    if weeks != list(range(1, len(chapters) + 1)):
        problems.append(f"the plan's weeks are {weeks}, for {len(chapters)} chapters")
    for row in rows:
        n = row[0]
        if not (row[1].startswith(f"Chapter {n}:") and f"Lab {n}" in row[2]):
            problems.append(f"week {n} schedules {row[1][:30]!r} and {row[2][:30]!r}")
    prose = re.sub(r"```.*?```", "", guide, flags=re.S)
    words = r"\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
    for m in re.finditer(rf"\b({words})\s+(labs|chapters|notebooks)\b", prose, re.I):
        problems.append(f"a typed count: {m.group(0)!r}")
    return problems


def test_the_instructor_guide_follows_the_catalog(root):
    chapters = list(catalog.chapters(root))
    labs = [lab.number for lab in catalog.labs(root)]
    guide = (root / "book" / "instructor_guide.md").read_text(encoding="utf-8")
    assert guide_problems(guide, chapters, labs) == []


def test_the_guide_check_finds_what_it_looks_for(root):
    """Each kind of contradiction the old guide had is caught: objectives out of order, a plan
    that skips chapters, advice in the wrong order, a typed count."""
    chapters = list(catalog.chapters(root))
    labs = [lab.number for lab in catalog.labs(root)]
    guide = (root / "book" / "instructor_guide.md").read_text(encoding="utf-8")
    five, six = (re.search(rf"^\*\*Chapter {n},.*?(?=^\*\*Chapter|\Z)", guide, re.M | re.S).group(0)
                 for n in (5, 6))
    assert guide_problems(guide.replace(five, "@@").replace(six, five).replace("@@", six),
                          chapters, labs)
    week6 = next(line for line in guide.splitlines() if line.startswith("| 6 | Chapter 6:"))
    assert guide_problems(guide.replace(week6 + "\n", ""), chapters, labs)
    lab9 = guide.index("**Lab 9 (")
    assert guide_problems(guide[:lab9] + "**Lab 10 (x).**\n\n" + guide[lab9:], chapters, labs)
    assert guide_problems(guide + "\n40 learners' nine labs (360 notebooks)\n", chapters, labs)


def test_the_labs_run_in_the_learner_s_install_are_the_cheapest_that_import_everything():
    """tests/test_learner_setup.py runs the cheapest labs that together import every
    distribution any lab imported (by the record's seconds; the fewest among equally cheap)."""
    from inferlab.course import imports

    numpy, torch, tok = {"numpy": ["numpy"]}, {"torch": ["torch"]}, {"tokenizers": ["tokenizers"]}
    record = {"labs": {"solutions/01_a.ipynb": {"distributions": numpy, "seconds": 9.0},
                       "solutions/02_b.ipynb": {"distributions": {**numpy, **tok}, "seconds": 3.0},
                       "solutions/03_c.ipynb": {"distributions": {**numpy, **torch},
                                                "seconds": 1.0},
                       "solutions/04_d.ipynb": {"distributions": {**numpy, **torch, **tok},
                                                "seconds": 5.0}}}
    # 02 and 03 cover everything for 4 s; 04 alone covers it too, but costs 5 s
    assert imports.covering_labs(record) == ["solutions/02_b.ipynb", "solutions/03_c.ipynb"]
    record["labs"]["solutions/04_d.ipynb"]["seconds"] = 4.0  # equally cheap: the fewer labs
    assert imports.covering_labs(record) == ["solutions/04_d.ipynb"]
    # leaving out what an install does not have: 03 alone imports all that is left
    assert imports.covering_labs(record, {"tokenizers"}) == ["solutions/03_c.ipynb"]
