"""The text the course's own models learn from: the Python standard library's source.

Every Python installation carries its standard library as ``.py`` files, under the Python
Software Foundation License (PSF License 2.0, which allows copying and derived works as long as
the licence and copyright notice travel with them: ``data/corpus/LICENSE-PSF.txt``). That makes
it a corpus that needs no network and may be redistributed.

Which files: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]`` except third-party
packages (``site-packages``), the test suites (folders named ``test``, ``tests``,
``idle_test``), codec tables (``encodings``), the pydoc topic dump (``pydoc_data``) and the
files that describe one machine's build (``config-*``, ``_sysconfigdata*``). The list, each
file's size and SHA-256, and its split are recorded in ``data/corpus/manifest.csv``, the Python
version in ``data/corpus/corpus.json``.

A *document* is one top-level definition (a function or a class, with the decorators and
comments right above it) or the module code between them (``split_top_level``), and each is
followed by the end-of-sequence token when tokenized. A model trained so learns to stop where a
definition ends, so generation gets output lengths of its own.

Splits are by file and deterministic: a file's split comes from the SHA-256 of its path, so
it never depends on what else is installed. The held-out files (validation and test) are copied
into ``data/corpus/*.jsonl``, so perplexity is measured on the same bytes on every machine, even
where a different Python has a different standard library; only training reads the local
files, and ``check_local_stdlib`` says where they differ from the record.
"""

from __future__ import annotations

import csv
import hashlib
import json
import platform
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from inferlab.data import data_path

SPLITS = ("train", "validation", "test")
HELD_OUT = ("validation", "test")
EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test", "encodings", "pydoc_data",
                 "__pycache__"}
SPLIT_PERCENT = {"test": 5, "validation": 5}  # the rest is train
SOURCE = "CPython {version} standard library (Lib/), PSF License 2.0"


@dataclass(frozen=True)
class Document:
    """One source file: its path relative to the standard library's folder, and its text."""

    path: str
    text: str


def stdlib_root() -> Path:
    """The folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


_DEFINITION = re.compile(r"(?:async def |def |class )")


def split_top_level(text: str) -> list[str]:
    """Cut a source file into documents before each top-level ``def`` or ``class`` (and the
    decorators and comments directly above it). Joining the pieces gives ``text`` back."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for i, line in enumerate(lines):
        if _DEFINITION.match(line):
            while i > 0 and lines[i - 1].startswith(("@", "#")):
                i -= 1
            if i > starts[-1]:
                starts.append(i)
    return ["".join(lines[a:b]) for a, b in zip(starts, starts[1:] + [len(lines)])]


def documents(files: list[Document]) -> list[str]:
    """Every file's documents, in order (``split_top_level`` of each)."""
    return [piece for doc in files for piece in split_top_level(doc.text)]


def corpus_dir() -> Path:
    return data_path("corpus")


def split_of(path: str) -> str:
    """``train``, ``validation`` or ``test`` for a file, from the SHA-256 of its relative path."""
    bucket = int(hashlib.sha256(path.encode("utf-8")).hexdigest(), 16) % 100
    if bucket < SPLIT_PERCENT["test"]:
        return "test"
    if bucket < SPLIT_PERCENT["test"] + SPLIT_PERCENT["validation"]:
        return "validation"
    return "train"


def _included(rel: Path) -> bool:
    if set(rel.parts[:-1]) & EXCLUDED_DIRS:
        return False
    return not (rel.parts[0].startswith("config-") or rel.name.startswith("_sysconfigdata"))


def select_files(root: str | Path | None = None) -> list[str]:
    """The corpus's files under ``root`` (default: this interpreter's), as sorted POSIX paths."""
    root = stdlib_root() if root is None else Path(root)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                  if _included(p.relative_to(root)))


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest() -> list[dict]:
    """The recorded corpus: one row per file with ``path``, ``bytes``, ``sha256``, ``split``."""
    with open(corpus_dir() / "manifest.csv", newline="", encoding="utf-8") as f:
        return [dict(row) for row in csv.DictReader(f)]


def recorded_version() -> str:
    """The Python version whose standard library the manifest records."""
    return json.loads((corpus_dir() / "corpus.json").read_text(encoding="utf-8"))["python"]


def check_local_stdlib(root: str | Path | None = None) -> list[str]:
    """What differs between this interpreter's standard library and the recorded corpus.

    An empty list means every recorded file is here with the same SHA-256 (and no file is
    extra), so training here reads exactly the recorded bytes.
    """
    root = stdlib_root() if root is None else Path(root)
    problems = []
    if (version := platform.python_version()) != recorded_version():
        problems.append(f"this is Python {version}; the corpus records Python {recorded_version()}")
    rows = manifest()
    for row in rows:
        file = root / row["path"]
        if not file.is_file():
            problems.append(f"{row['path']}: missing")
        elif sha256_of(file.read_bytes()) != row["sha256"]:
            problems.append(f"{row['path']}: SHA-256 differs")
    extra = sorted(set(select_files(root)) - {row["path"] for row in rows})
    problems += [f"{path}: not in the recorded corpus" for path in extra]
    return problems


def held_out(split: str) -> list[Document]:
    """The shipped text of a held-out split (``validation`` or ``test``): the same everywhere."""
    if split not in HELD_OUT:
        raise ValueError(f"only {HELD_OUT} are shipped; the train split is read from the local "
                         "standard library by read_split")
    with open(corpus_dir() / f"{split}.jsonl", encoding="utf-8") as f:
        return [Document(**json.loads(line)) for line in f]


def read_split(split: str, root: str | Path | None = None) -> list[Document]:
    """The documents of ``split`` as recorded in the manifest, read from the local standard
    library (call ``check_local_stdlib`` first: a differing file is read as it is here)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    root = stdlib_root() if root is None else Path(root)
    return [Document(row["path"], (root / row["path"]).read_text(encoding="utf-8"))
            for row in manifest() if row["split"] == split and (root / row["path"]).is_file()]


def record_corpus(root: str | Path | None = None, out: str | Path | None = None) -> dict:
    """Record the local standard library as the corpus: the manifest, ``corpus.json`` and the
    held-out text. Run it when moving the course to another Python; it changes the corpus."""
    root = stdlib_root() if root is None else Path(root)
    out = corpus_dir() if out is None else Path(out)
    version = platform.python_version()
    source = SOURCE.format(version=version)
    rows, held = [], {split: [] for split in HELD_OUT}
    for path in select_files(root):
        data = (root / path).read_bytes()
        split = split_of(path)
        rows.append({"path": path, "bytes": len(data), "sha256": sha256_of(data),
                     "split": split, "source": source})
        if split in held:
            held[split].append({"path": path, "text": data.decode("utf-8")})
    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    for split, docs in held.items():
        with open(out / f"{split}.jsonl", "w", encoding="utf-8", newline="\n") as f:
            f.writelines(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs)
    summary = {"python": version, "implementation": platform.python_implementation(),
               "stdlib": "Lib/ of the CPython source tree, as installed",
               "rule": "every *.py except folders " + ", ".join(sorted(EXCLUDED_DIRS))
                       + ", config-*/ and _sysconfigdata*",
               "split_rule": "SHA-256 of the relative path mod 100: 0-4 test, 5-9 validation, "
                             "else train",
               "files": {s: sum(r["split"] == s for r in rows) for s in SPLITS},
               "bytes": {s: sum(r["bytes"] for r in rows if r["split"] == s) for s in SPLITS},
               "licence": "PSF License 2.0: LICENSE-PSF.txt (the interpreter's LICENSE.txt)"}
    (out / "corpus.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    licence = root / "LICENSE.txt"
    if licence.is_file():
        (out / "LICENSE-PSF.txt").write_bytes(licence.read_bytes())
    return summary


if __name__ == "__main__":
    print(json.dumps(record_corpus(), indent=2))
