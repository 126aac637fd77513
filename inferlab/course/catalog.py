"""The course's structure, read from its own files: pages, labs, exercises and check hints.

The instructor guide, the status page and the site tests cover whatever chapters and labs exist
by asking this module instead of listing them by hand:

- ``toc_parts()``: the parts of ``_toc.yml`` and the files in each; ``chapters()``: the
  numbered chapters, each with its pages (the chapter and its sections, not its lab), and
  ``toc_pages(kind)``: every page of one kind ("chapter", "lab", "solution") in reading order;
- ``labs()``: every lab in ``labs/`` with its title, its solution and its check module;
- ``check_summaries(module)``: each check's exercise label, what it tests (its docstring) and
  the hints a learner sees when it fails (the ``hint=`` strings), read from
  ``inferlab/course/checks/labNN.py`` without importing it;
- ``exercise_names(module)``: for each check, the name the lab's check cell passes to it
  (``LabCache = check.kv_cache(LabCache)``), which is what the grader checks in a submission.

Everything here reads a checkout (the repository root is the folder above the package).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def toc_parts(root: Path = ROOT) -> dict[str, list[str]]:
    """``{part caption: [file, ...]}`` from ``_toc.yml``, in order; the root page is under ""."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    parts = {"": [toc["root"]]}

    def files(entries) -> list[str]:
        out = []
        for entry in entries or []:
            if "file" in entry:
                out.append(entry["file"])
            out += files(entry.get("sections"))
        return out

    for part in toc.get("parts", []):
        parts[part.get("caption", "")] = files(part.get("chapters"))
    return parts


def toc_files(root: Path = ROOT) -> list[str]:
    """Every page of the table of contents, without extension, in order."""
    return [f for files in toc_parts(root).values() for f in files]


def chapters(root: Path = ROOT) -> dict[str, list[str]]:
    """``{chapter: [its pages]}`` for the numbered part of ``_toc.yml``, in order (Chapter 1
    first): a chapter's pages are its own file, then the files of its sections under ``book/``
    (a chapter split into sections); the lab that follows it in the reader's path is not one."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    numbered = [p for p in toc.get("parts", []) if p.get("numbered")]
    assert len(numbered) == 1, "_toc.yml should have exactly one numbered part (the chapters)"

    def pages(entry) -> list[str]:
        out = [entry["file"]] if entry.get("file", "").startswith("book/") else []
        for sub in entry.get("sections") or []:
            out += pages(sub)
        return out

    return {entry["file"]: pages(entry) for entry in numbered[0]["chapters"]
            if entry.get("file", "").startswith("book/")}


def toc_pages(kind: str, root: Path = ROOT) -> list[str]:
    """Every page of the table of contents of one kind, in reading order: "chapter" (each
    chapter's pages, sections included), "lab" or "solution"."""
    if kind == "chapter":
        return [page for pages in chapters(root).values() for page in pages]
    folder = {"lab": "labs/", "solution": "solutions/"}[kind]
    return [f for f in toc_files(root) if f.startswith(folder)]


@dataclass(frozen=True)
class Lab:
    """One lab: ``labs/NN_topic.ipynb``, its solution and the check module its cells import."""

    number: int
    stem: str              # "01_roofline"
    title: str             # "Measure your own roofline"
    lab: Path
    solution: Path
    check_module: str | None  # "lab01"


def _title(path: Path) -> str:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    first = next((c.source for c in nb.cells if c.cell_type == "markdown"), "")
    m = re.match(r"#\s*Lab\s+\d+(?:\s+solutions)?:\s*(.+)", first.splitlines()[0] if first else "")
    return m.group(1).strip() if m else path.stem


def labs(root: Path = ROOT) -> list[Lab]:
    """Every lab in ``labs/``, in order of its number."""
    from inferlab.course.results import find_check_module

    import nbformat

    out = []
    for path in sorted((root / "labs").glob("*.ipynb")):
        m = re.match(r"(\d+)_", path.name)
        if not m:
            continue
        nb = nbformat.read(path, as_version=4)
        module, _ = find_check_module(c.source for c in nb.cells if c.cell_type == "code")
        out.append(Lab(int(m.group(1)), path.stem, _title(path), path,
                       root / "solutions" / path.name, module))
    return out


_CHECK_CELL = re.compile(r"^\s*(\w+)\s*=\s*(\w+)\.(\w+)\(\s*(\w+)\s*\)", re.M)


def exercise_names(module: str, root: Path = ROOT) -> dict[str, str]:
    """``{check function: the notebook name it is given}`` from the lab that imports ``module``.

    Read from the repository's own student lab, never from a submission, so deleting or editing
    a check cell cannot change what the grader checks. A check no cell calls keeps its own name.
    """
    import nbformat

    from inferlab.course.results import exercises_of, find_check_module

    names = {fn: fn for fn in exercises_of(module)}
    for lab in labs(root):
        if lab.check_module != module:
            continue
        nb = nbformat.read(lab.lab, as_version=4)
        _, alias = find_check_module(c.source for c in nb.cells if c.cell_type == "code")
        for cell in nb.cells:
            if cell.cell_type == "code":
                for target, obj, check, argument in _CHECK_CELL.findall(cell.source):
                    if obj == alias and check in names and target == argument:
                        names[check] = argument
    return names


@dataclass(frozen=True)
class CheckSummary:
    """What one check tests and the hints it can give."""

    exercise: str
    function: str
    tests: str                # the docstring's first line
    hints: tuple[str, ...]


def _text(node) -> str | None:
    """A string literal's text; an f-string's with each ``{...}`` shown as "..."; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "..." for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    return None


def _hints_in(function: ast.FunctionDef) -> list[str]:
    """Hint texts in one function: ``hint=`` arguments, ``hint`` variables and dicts, text after
    "Hint:" in a message, and the strings a helper named ``*hint*`` returns."""
    found = []
    for sub in ast.walk(function):
        if isinstance(sub, ast.keyword) and sub.arg == "hint":
            found.append(_text(sub.value))
        elif isinstance(sub, ast.Assign) and any(isinstance(t, ast.Name) and "hint" in t.id.lower()
                                                 for t in sub.targets):
            values = sub.value.values if isinstance(sub.value, ast.Dict) else [sub.value]
            found += [_text(v) for v in values]
        elif isinstance(sub, ast.Return) and "hint" in function.name.lower() and sub.value:
            found.append(_text(sub.value))
        elif isinstance(sub, (ast.Constant, ast.JoinedStr)):
            text = _text(sub)
            if text and "Hint:" in text:
                found.append(text.split("Hint:", 1)[1])
    out = []
    for text in found:
        text = " ".join((text or "").split())
        if text.replace("...", "").strip(" .:") and text not in out:
            out.append(text)
    return out


def check_summaries(module: str, root: Path = ROOT) -> list[CheckSummary]:
    """The checks of ``inferlab/course/checks/<module>.py`` in file order, with every hint each can give
    (its own and those of the module's private helpers it calls, directly or not)."""
    path = root / "inferlab" / "course" / "checks" / f"{module}.py"
    if not re.fullmatch(r"lab\w+", module) or not path.is_file():
        return []
    body = ast.parse(path.read_text(encoding="utf-8")).body
    functions = {n.name: n for n in body if isinstance(n, ast.FunctionDef)}
    out = []
    for node in functions.values():
        if node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node) or ""
        m = re.match(r"\s*Exercises?\s+([0-9A-Za-z_.]*[0-9A-Za-z_])\s*:?\s*(.*)", doc, re.DOTALL)
        if not m:
            continue
        seen, todo = {node.name}, [node]
        while todo:  # the private helpers this check reaches
            for sub in ast.walk(todo.pop()):
                if isinstance(sub, ast.Name) and sub.id in functions and sub.id.startswith("_") \
                        and sub.id not in seen:
                    seen.add(sub.id)
                    todo.append(functions[sub.id])
        hints = []
        for name in [node.name] + sorted(seen - {node.name}):
            hints += [h for h in _hints_in(functions[name]) if h not in hints]
        first = " ".join(m.group(2).split("\n\n")[0].split())
        out.append(CheckSummary(m.group(1), node.name, first, tuple(hints)))
    return out
