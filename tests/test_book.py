"""The book builds with Sphinx's warnings as errors and nitpicky references (-W -n), and the
build is what executes the solved labs.

CI's first command (README's quick start) has just built the book with ``-W -n``. The build
leaves a record (``book/_ext/build_record.py``): its warning count, its flags, whether it read
every page, and a digest of the files it read. When that record says a full ``-W -n`` build of
exactly these sources ended without a warning, the tests below check that build's output instead
of building the book a second time; otherwise (no build yet, an edited page, an incremental
build, warnings) they run the README's command with ``--all``, so every page is re-read and
re-reports its warnings. Notebook execution is cached by jupyter-cache either way, so an
unchanged page is not re-run. The build executes every solved notebook (``solutions/``) with
errors not allowed, and each one asserts its own results, so a solved lab is executed once,
there: the test below asks the build's cache for a successful execution of each solved notebook
exactly as it is now (jupyter-cache stores a notebook only when it ran without an error, keyed by
its code). The student labs (``labs/``), which the site shows unexecuted, run in the learner's
install (tests/test_learner_setup.py).
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from inferlab.course import catalog

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))


def _build_record():
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        import build_record
    finally:
        sys.path.pop(0)
    return build_record


@pytest.fixture(scope="module")
def build(root: Path):
    """The finished build to check: the one already in _build when its record allows (see the
    module's docstring), else a new one with --all."""
    if _build_record().reusable(root):
        return subprocess.CompletedProcess(["(the build already in _build)"], 0, "", "")
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(root), "-W", "-n",
           "--keep-going", "--all"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1500)


def test_the_build_leaves_a_record_that_allows_no_stale_or_unclean_reuse(root: Path, build,
                                                                         tmp_path):
    assert build.returncode == 0, "the book did not build"
    assert _build_record().reusable(root), "the build just checked left no reusable record"
    rec = _build_record()
    site = tmp_path / "book_root"
    for name in ("_config.yml", "_toc.yml", "book/intro.md", "solutions/01.ipynb",
                 "data/engine_facts.csv", "inferlab/x.py"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(name)
    clean = {"warnings": 0, "read_all": True, "warningiserror": True, "nitpicky": True,
             "sources": rec.sources_digest(site)}

    def record(**change):
        (site / rec.RECORD).parent.mkdir(exist_ok=True)
        (site / rec.RECORD).write_text(json.dumps(clean | change))
        return rec.reusable(site)
    assert record() is not None
    assert record(warnings=1) is None and record(warnings=None) is None
    assert record(read_all=False) is None  # an incremental build re-reports no old warning
    assert record(warningiserror=False) is None and record(nitpicky=False) is None
    (site / "inferlab" / "x.py").write_text("changed")  # code: the cache decides, not Sphinx
    assert record() is not None
    for name in ("book/intro.md", "solutions/01.ipynb", "data/engine_facts.csv", "_toc.yml"):
        (site / name).write_text("edited")
        assert record() is None, f"an edit of {name} left the record reusable"
        clean["sources"] = rec.sources_digest(site)


def test_book_builds_without_warnings(root: Path, build):
    log = build.stdout + build.stderr
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert build.returncode == 0, "book build failed:\n" + "\n".join(warnings[-40:] or log.splitlines()[-40:])
    assert (root / "_build" / "html" / "index.html").exists()


@pytest.mark.parametrize("name", SOLUTIONS)
def test_the_build_executed_the_solved_lab_without_an_error(root: Path, build, name):
    from jupyter_cache import get_cache

    assert build.returncode == 0, "the book did not build"
    cache = get_cache(str(root / "_build" / ".jupyter_cache"))
    nb = nbformat.read(root / "solutions" / name, as_version=4)
    try:
        cache.match_cache_notebook(nb)
    except KeyError:
        pytest.fail(f"the book build has no successful execution of solutions/{name} as it is "
                    "now: it failed there (see the build's log in _build/html/reports/)")


def test_solution_pages_hide_the_lab_generators_markers(root: Path, build):
    assert build.returncode == 0, "the book did not build"
    pages = sorted((root / "_build" / "html" / "solutions").glob("*.html"))
    assert len(pages) == len(SOLUTIONS)
    # the code markers; the written answers' <!-- BEGIN SOLUTION --> stay as HTML comments,
    # which a reader never sees
    shown = [p.name for p in pages
             if any(m in p.read_text(encoding="utf-8")
                    for m in ("### BEGIN SOLUTION", "### END SOLUTION"))]
    assert not shown, f"solution pages that show the ### BEGIN SOLUTION markers: {shown}"


def test_the_marker_filter_keeps_every_other_line():
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    from solution_markers import without_markers

    code = "def f(x):\n    ### BEGIN SOLUTION\n    return x  # ### not a marker\n    ### END SOLUTION\n"
    assert without_markers(code) == "def f(x):\n    return x  # ### not a marker\n"


def test_the_site_offers_one_search_not_two(root: Path, build):
    # the theme's default sidebar carries a search field beside the header's search button;
    # both open the same dialog, and readers took them for two searches
    assert build.returncode == 0, "the book did not build"
    html = (root / "_build" / "html" / "book" / "ch01_roofline.html").read_text(encoding="utf-8")
    sidebar = html[html.index("bd-sidebar-primary"):html.index("bd-main")]
    assert "search-button-field" not in sidebar
    assert "search-button__button" in html        # the header's button is still there


def test_book_exercises_are_numbered_per_chapter(root: Path, build):
    """Chapter N's exercises read Exercise N.1, N.2, ... (as the labs number theirs), from the
    build above: the chapters' part is numbered and numfig counts within each chapter (across
    its section pages when it is split)."""
    assert build.returncode == 0, "the book did not build"
    for number, (page, pages) in enumerate(catalog.chapters(root).items(), start=1):
        titles = [t for p in pages for t in re.findall(
            r'class="caption-number">Exercise ([\d.]+)\s*<',
            (root / "_build" / "html" / f"{p}.html").read_text(encoding="utf-8"))]
        assert titles, f"{page}: no numbered exercise"
        assert titles == [f"{number}.{k}" for k in range(1, len(titles) + 1)], (page, titles)
