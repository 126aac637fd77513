"""What grading a submitted notebook comes to, and how an executed notebook is read.

The words an exercise's result and a notebook's run can come to; ``ExerciseResult`` and
``NotebookResult``; and the reading of an executed notebook (``summarise``): which lab it is
(from the cell that imports its checks, ``find_check_module``, or its title, ``identify_lab``),
which exercises that lab has (``exercises_of``, from the check module's docstrings, parsed
without importing torch), the tags its cells printed (``read_tags``), why an exercise the
grader could not check did not run, and the flags for printed tags that count for nothing.
The verdicts themselves come from ``inferlab.course.verify``, run by ``inferlab.course.runner``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterable

from inferlab.course.checks import FAIL, FLAG, PASS, TODO  # the tags the checks print; no torch

# What an exercise can come to (the same words as inferlab.course.verify's).
PASSED, FAILED, NOT_ATTEMPTED, NOT_RUN, FLAGGED = ("passed", "failed", "not attempted", "not run",
                                                   "flagged")
_TAG_STATUS = {PASS: PASSED, FAIL: FAILED, TODO: NOT_ATTEMPTED, FLAG: FLAGGED}
# An exercise printed twice keeps its worst report.
_WORST_FIRST = {FLAGGED: 0, FAILED: 1, NOT_ATTEMPTED: 2, PASSED: 3}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colour codes a failure's block is printed in

# What a notebook's run can come to. Only COMPLETED means the notebook ran to its last cell.
COMPLETED, TIMED_OUT, KERNEL_DIED = "completed", "timed out", "kernel died"
NOT_FOUND, UNREADABLE, GRADER_ERROR = "not found", "unreadable", "grader error"

_LABEL = r"[0-9A-Za-z_.]*[0-9A-Za-z_]"
_TAG = re.compile("(" + "|".join(map(re.escape, _TAG_STATUS)) + rf") Exercise\s+({_LABEL})")
_IMPORTS = (re.compile(r"^\s*from\s+inferlab\.course\.checks\s+import\s+(lab\w+)(?:\s+as\s+(\w+))?", re.M),
            re.compile(r"^\s*import\s+inferlab\.course\.checks\.(lab\w+)(?:\s+as\s+(\w+))?", re.M))


@dataclass
class ExerciseResult:
    """One exercise of one notebook: its label, what it came to, and the check's message."""

    exercise: str
    result: str
    message: str = ""


@dataclass
class NotebookResult:
    """One submitted notebook: how its run ended, and each exercise's result."""

    notebook: str
    run: str
    detail: str = ""
    seconds: float = 0.0
    lab: str | None = None
    exercises: list[ExerciseResult] = field(default_factory=list)
    cell_errors: list[dict] = field(default_factory=list)  # {cell, ename, evalue}: every error
    flags: list[dict] = field(default_factory=list)  # {cell (1-based or None), kind, message}

    def count(self, result: str) -> int:
        return sum(e.result == result for e in self.exercises)

    @property
    def graded_to_end(self) -> bool:
        return self.run == COMPLETED

    def to_dict(self) -> dict:
        out = asdict(self)
        out["counts"] = {r: self.count(r) for r in (PASSED, FAILED, NOT_ATTEMPTED, NOT_RUN,
                                                    FLAGGED)}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "NotebookResult":
        known = {f.name for f in fields(cls)}  # not the report's counts, scores and weights
        data = {k: v for k, v in data.items() if k in known}
        data["exercises"] = [ExerciseResult(**e) for e in data.get("exercises", [])]
        return cls(**data)


def find_check_module(sources: Iterable[str]) -> tuple[str | None, str | None]:
    """``("lab01", "check")`` from a cell such as ``from inferlab.course.checks import lab01 as check``."""
    for source in sources:
        for pattern in _IMPORTS:
            if m := pattern.search(source):
                module, alias = m.group(1), m.group(2)
                if alias is None:
                    alias = module if pattern is _IMPORTS[0] else f"inferlab.course.checks.{module}"
                return module, alias
    return None, None


def exercises_of(module: str) -> dict[str, str]:
    """``{check function: exercise label}`` read from ``inferlab/course/checks/<module>.py``.

    The labels come from the docstrings (``\"\"\"Exercise 1.1a: ...\"\"\"``). The file is parsed,
    not imported, so the grader itself never imports torch.
    """
    path = Path(__file__).resolve().parent / "checks" / f"{module}.py"
    if not re.fullmatch(r"lab\w+", module) or not path.is_file():
        return {}
    labels = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            if m := re.match(rf"\s*Exercises?\s+({_LABEL})", ast.get_docstring(node) or ""):
                labels[node.name] = m.group(1)
    return labels


def weights_of(module: str) -> dict[str, float]:
    """``{exercise label: points}`` from the check module's ``WEIGHTS`` (parsed, not imported);
    an exercise it does not list is worth 1 point."""
    labels = exercises_of(module)
    path = Path(__file__).resolve().parent / "checks" / f"{module}.py"
    given: dict = {}
    if labels:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["WEIGHTS"]:
                given = ast.literal_eval(node.value)
    return {label: float(given.get(label, 1)) for label in labels.values()}


def _texts(output) -> list[str]:
    """The text of an output in which a check's tag can appear."""
    if output.get("output_type") == "stream":
        return [_ANSI.sub("", output.get("text", ""))]
    if output.get("output_type") == "error":
        return [_ANSI.sub("", output.get("evalue", ""))]
    return []


def read_tags(nb) -> dict[str, tuple[str, str]]:
    """``{exercise: (result, message)}`` from the tags in the code cells' outputs, in order."""
    found: dict[str, tuple[str, str]] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            is_error = output.get("output_type") == "error"
            for text in _texts(output):
                for m in _TAG.finditer(text):
                    result, label = _TAG_STATUS[m.group(1)], m.group(2)
                    # A failure's message is the whole error text (it ends in the hint);
                    # a printed tag's message is the rest of its line.
                    end = len(text) if is_error else text.find("\n", m.start())
                    message = text[m.start(): end if end >= 0 else len(text)].strip()
                    old = found.get(label)
                    if old is None or _WORST_FIRST[result] < _WORST_FIRST[old[0]]:
                        found[label] = (result, message if result != PASSED else "")
    return found


def _first_line(source: str) -> str:
    line = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")
    return line if len(line) <= 60 else line[:57] + "..."


def cell_name(nb, index: int) -> str:
    return f'cell {index + 1} ("{_first_line(nb.cells[index].source)}")'


def _first_error(cell):
    return next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)


def _cell_errors(nb) -> list[dict]:
    errors = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    errors.append({"cell": i + 1, "ename": output.get("ename", ""),
                                   "evalue": output.get("evalue", "")})
    return errors


def _why_not_run(nb, label: str, checks: dict[str, str], alias: str | None,
                 stopped_at: int | None, stop_reason: str) -> str:
    """Why an exercise reported nothing: its check cell raised, was not reached, or is missing."""
    functions = [fn for fn, lab in checks.items() if lab == label]
    if not functions or alias is None:
        return "no check reported on this exercise"
    calls = re.compile(r"\b" + re.escape(alias) + r"\.(?:" + "|".join(functions) + r")\s*\(")
    index = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and calls.search(c.source)),
                 None)
    call = f"{alias}.{functions[0]}(...)"
    if index is None:
        return f"no cell calls {call}: was the check cell deleted?"
    where = cell_name(nb, index)
    if index == stopped_at:
        return f"its check cell, {where}, was running when {stop_reason}"
    cell = nb.cells[index]
    error = _first_error(cell)
    if error is not None:
        because = ""
        exercise = next((i for i in range(index - 1, -1, -1) if nb.cells[i].cell_type == "code"
                         and re.match(r"\s*#\s*Exercise\b", nb.cells[i].source)), None)
        if exercise is not None and (cause := _first_error(nb.cells[exercise])) is not None:
            because = (f"its exercise cell, {cell_name(nb, exercise)}, raised "
                       f"{cause.get('ename')}: {cause.get('evalue')}; then ")
        return (f"{because}its check cell, {where}, raised {error.get('ename')}: "
                f"{error.get('evalue')}")
    if cell.get("execution_count") is None and not cell.get("outputs"):
        return f"its check cell, {where}, was not reached" + (f": {stop_reason}" if stop_reason else "")
    return f"its check cell, {where}, ran but printed no [PASS], [FAIL] or [TODO] line"


def _tag_flags(nb, tags: dict[str, tuple[str, str]], labels: list[str],
               verdicts: dict[str, str] | None, module: str | None) -> list[dict]:
    """Printed tags that count for nothing: labels the lab does not have, and passes the
    grader's own checks contradict (one flag for all of those)."""
    def printed_in(label: str) -> int | None:
        return next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(
            re.search(rf"\] Exercise\s+{re.escape(label)}(?![\w.])", t)
            for o in c.get("outputs", []) for t in _texts(o))), None)

    flags, contradicted = [], []
    for label, (printed, _) in tags.items():
        if label not in labels:
            cell = printed_in(label)
            where = cell_name(nb, cell) if cell is not None else "a cell"
            flags.append({"cell": None if cell is None else cell + 1, "kind": "unknown label",
                          "message": f"{where} printed a {printed} tag for Exercise {label}, which "
                                     f"{module or 'this lab'} does not have (its exercises: "
                                     f"{', '.join(labels) or 'none'}); reported as unknown, "
                                     "never counted"})
        elif verdicts is not None and printed == PASSED \
                and verdicts.get(label) not in (PASSED, FLAGGED):  # a flagged row says it already
            contradicted.append(f"{label} ({verdicts.get(label, NOT_RUN)})")
    if contradicted:
        flags.append({"cell": None, "kind": "contradicted pass",
                      "message": "the notebook printed [PASS] for Exercise "
                                 f"{', '.join(c.split()[0] for c in contradicted)}, but the "
                                 f"grader's own checks found: {', '.join(contradicted)}"})
    return flags


def summarise(nb, path: str, run: str, detail: str, seconds: float,
              stopped_at: int | None = None, verdict: dict | None = None,
              module: str | None = None, alias: str | None = None,
              source_flags: list[dict] | None = None) -> NotebookResult:
    """Turn an executed (or partly executed) notebook and the grader's own ``verdict`` (the
    results of ``inferlab.course.verify``; None when the checks could not run) into a result.

    Only the lab's own exercises are reported, and only the grader's checks decide them; the
    tags the notebook printed serve for flags and, for exercises the grader could not check,
    to explain why.
    """
    if module is None:
        module, alias = find_check_module(c.source for c in nb.cells if c.cell_type == "code")
    checks = exercises_of(module) if module else {}
    labels = list(dict.fromkeys(checks.values()))
    tags = read_tags(nb)
    stop_reason = {TIMED_OUT: "the notebook ran out of time", KERNEL_DIED: "the kernel died",
                   GRADER_ERROR: "the run stopped on a grader error"}.get(run, "")
    by_label = {e["exercise"]: e for e in (verdict or {}).get("exercises", [])}
    exercises = []
    for label in labels:
        found = by_label.get(label)
        if found is None or found["result"] == NOT_RUN:
            why = _why_not_run(nb, label, checks, alias, stopped_at, stop_reason)
            if found is not None and " raised " not in why:  # the notebook's cells say nothing
                why = found["message"] or why
            exercises.append(ExerciseResult(label, NOT_RUN, why))
        else:
            exercises.append(ExerciseResult(label, found["result"], found["message"]))
    seen = {p for f in source_flags or [] for p in f.get("paths", [])}
    found_at_run_time = [f for f in (verdict or {}).get("flags", [])  # unless the source said so
                         if not any(f["message"].startswith(f"at run time, {p} ") for p in seen)]
    flags = []
    for f in [*(source_flags or []), *found_at_run_time]:
        cell = f.get("cell")  # 0-based from scan and verify; reported 1-based with its text
        flags.append({"cell": None if cell is None else cell + 1, "kind": f["kind"],
                      "message": f["message"] if cell is None
                      else f"{cell_name(nb, cell)}: {f['message']}"})
    for f in _tag_flags(nb, tags, labels, None if verdict is None else
                        {e.exercise: e.result for e in exercises}, module):
        rebound = next((g for g in flags if g["kind"] == "rebinds checks"), None)
        if f["kind"] == "contradicted pass" and rebound is not None:
            # the passes the rebound checks printed: the same offence, said in its one finding
            rebound["message"] += f"; so {f['message']}"
        else:
            flags.append(f)
    errors = _cell_errors(nb)
    others = [e for e in errors if e["ename"] != "CheckFailed"]
    if others:
        first = others[0]
        evalue = first["evalue"].splitlines()[0] if first["evalue"] else ""
        note = (f"{len(others)} cell(s) raised an error besides failed checks; first: cell "
                f"{first['cell']}, {first['ename']}: {evalue}")
        detail = f"{detail}; {note}" if detail else note
    return NotebookResult(path, run, detail, round(seconds, 1), module, exercises, errors, flags)


def identify_lab(nb) -> tuple[str | None, str | None]:
    """``(check module, alias)``: from the cell that imports the checks, else (alias None) from
    the title ``# Lab N: ...`` or the exercise cells ``# Exercise N.M: ...``."""
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    module, alias = find_check_module(sources)
    if module is not None:
        return module, alias
    texts = [c.source for c in nb.cells]
    for pattern in (r"^#\s*Lab\s+(\d+)\b", r"^\s*#\s*Exercises?\s+(\d+)\."):
        for text in texts:
            if (m := re.search(pattern, text, re.M)) and exercises_of(f"lab{int(m.group(1)):02d}"):
                return f"lab{int(m.group(1)):02d}", None
    return None, None
