"""The book builds with Sphinx's warnings as errors and nitpicky references (-W -n).

This is the README's build command with ``--all``, so every page is re-read and re-reports its
warnings; notebook execution is cached by jupyter-cache, so an unchanged page is not re-run.
"""

import subprocess
import sys
from pathlib import Path


def test_book_builds_without_warnings(root: Path):
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(root), "-W", "-n",
           "--keep-going", "--all"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    log = result.stdout + result.stderr
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0, "book build failed:\n" + "\n".join(warnings[-40:] or log.splitlines()[-40:])
    assert (root / "_build" / "html" / "index.html").exists()
