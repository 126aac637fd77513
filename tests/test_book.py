"""The book builds with Sphinx's warnings as errors and nitpicky references (-W -n).

This is the README's build command with ``--all``, so every page is re-read and re-reports its
warnings; notebook execution is cached by jupyter-cache, so an unchanged page is not re-run.
"""

import re
import subprocess
import sys
from pathlib import Path

from inferlab.course import catalog


def test_book_builds_without_warnings(root: Path):
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(root), "-W", "-n",
           "--keep-going", "--all"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    log = result.stdout + result.stderr
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0, "book build failed:\n" + "\n".join(warnings[-40:] or log.splitlines()[-40:])
    assert (root / "_build" / "html" / "index.html").exists()


def test_book_exercises_are_numbered_per_chapter(root: Path):
    """Chapter N's exercises read Exercise N.1, N.2, ... (as the labs number theirs), from the
    build above: the Chapters part is numbered and numfig counts within each chapter."""
    chapters = catalog.toc_parts(root)["Chapters"]
    for number, page in enumerate(chapters, start=1):
        html = (root / "_build" / "html" / f"{page}.html").read_text(encoding="utf-8")
        titles = re.findall(r'class="caption-number">Exercise ([\d.]+)\s*<', html)
        assert titles, f"{page}: no numbered exercise"
        assert titles == [f"{number}.{k}" for k in range(1, len(titles) + 1)], (page, titles)
