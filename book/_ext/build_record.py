"""Record what a book build saw, so that the tests can read a finished build instead of
building the book a second time.

At the end of every build this writes ``_build/build_record.json``: how many warnings Sphinx
counted, whether warnings were errors (``-W``) and references nitpicky (``-n``), whether every
page was read in this run (a fresh build, or ``--all``) and a digest of the files the build
reads (``sources_digest``). ``reusable(root)`` answers whether the build in ``_build`` is one
the book test may take as its own: every page read, with ``-W -n``, no warning, and the sources
unchanged since. CI's first command builds the book so (README's quick start); the test then
checks that build's output instead of rebuilding it, and rebuilds whenever the record is
missing, stale or says otherwise.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

RECORD = Path("_build") / "build_record.json"
# What the build reads: the configuration, the pages and notebooks, and the tables the book's
# own extensions read (data/engine_facts.csv). Code the pages execute is not here: the build
# takes each page's outputs from its execution cache, keyed by the page's code.
ROOT_FILES = ("_config.yml", "_toc.yml")
FOLDERS = ("book", "solutions", "labs")
SKIP = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache"}


def source_files(root: Path) -> list[Path]:
    files = [root / name for name in ROOT_FILES]
    files += sorted(p for folder in FOLDERS for p in (root / folder).rglob("*")
                    if p.is_file() and not SKIP & set(p.relative_to(root).parts))
    files += sorted((root / "data").glob("*.csv"))
    return [p for p in files if p.is_file()]


def sources_digest(root: str | Path) -> str:
    """SHA-256 over the path and content of every file the build reads."""
    root = Path(root)
    h = hashlib.sha256()
    for path in source_files(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def reusable(root: str | Path) -> dict | None:
    """The record of the build in ``root/_build`` if the book test may use that build as its
    own (every page read, ``-W -n``, no warning, the same sources); None otherwise."""
    root = Path(root)
    try:
        record = json.loads((root / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    clean = (record.get("warnings") == 0 and record.get("read_all") is True
             and record.get("warningiserror") is True and record.get("nitpicky") is True)
    if clean and record.get("sources") == sources_digest(root):
        return record
    return None


def _reading(app, env, docnames) -> None:
    app._build_record_read_all = set(docnames) >= set(env.found_docs)


def _finished(app, exception) -> None:
    record = {"warnings": app._warncount, "exception": repr(exception) if exception else None,
              "read_all": getattr(app, "_build_record_read_all", False),
              # -W: Sphinx 7.4 keeps it as keep_going when --keep-going is given too
              "warningiserror": bool(app.warningiserror or app.keep_going),
              "nitpicky": bool(app.config.nitpicky), "builder": app.builder.name,
              "sources": sources_digest(app.srcdir)}
    if exception is not None:
        record["warnings"] = None  # not a build anyone should reuse
    path = Path(app.outdir).parent / RECORD.name
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def setup(app):
    app.connect("env-before-read-docs", _reading)
    app.connect("build-finished", _finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
