"""Grade submitted lab notebooks: run each one headless, then run the lab's checks on it.

    python -m inferlab.course.grade submissions/*.ipynb               # tables on stdout
    python -m inferlab.course.grade alice.ipynb bob.ipynb --json       # or --csv
    python -m inferlab.course.grade submissions/*.ipynb --timeout 300 --jobs 2 --profile cpu

Every notebook runs in a worker process of its own (with a memory limit, ``--memory-gb``), with a
Jupyter kernel of its own, in a fresh temporary directory, after its saved outputs are cleared. A
cell that raises does not stop the run. Each notebook has a wall-clock budget (``--timeout``):
when it runs out the kernel is killed and the exercises are reported as not run. A notebook that
is missing, is not JSON, is not a notebook, kills its kernel or hangs its worker gets a row that
says so; the other notebooks are graded as usual.

**The verdict comes from checks the grader runs, never from what the notebook prints.** When the
submission's last cell has run, the grader sends one more cell to the same kernel:
``inferlab.course.verify``, which executes the lab's check module afresh from its file, executes
again every definition of each exercise's function from the submission's source, calls each
check on the learner's function, and writes the results, with a nonce, to a file the grader
created only then. Which functions a lab's checks take comes from the repository's own copy of
the lab (``inferlab.course.catalog.exercise_names``), and which exercises a lab has from its
check module's docstrings (``Exercise N.M: ...``). An exercise is

- *passed* when the grader's check returned the learner's own function;
- *failed* when it raised ``CheckFailed`` (the row carries the message and its hint);
- *not attempted* when the function still raises ``NotImplementedError``;
- *not run* when no cell defines the function, its definition raised, or the notebook stopped
  before the grader could check it (timed out, kernel died);
- *flagged* when the learner's function is, wraps, subclasses or calls the package's reference
  implementation that the check lends to an unattempted exercise, or when the notebook replaced
  part of ``inferlab`` that the checks may rely on.

Besides the exercises, a notebook gets *flags*, each naming its cell: statements that rewrite
the checks or any imported module (read from the source, ``inferlab.course.scan``), a printed tag
for a label the lab does not have (reported as unknown, never as a pass), and a printed
``[PASS]`` that the grader's own check contradicts.

Exit status:
    0  every notebook ran to its end, every exercise passed and nothing was flagged;
    1  every notebook ran to its end, but some exercise did not pass or something was flagged;
    2  the command line was wrong (argparse's convention);
    3  some notebook could not be graded to its end: missing, unreadable, timed out, kernel died.

Grading runs the submitted code with your permissions, and the grader's checks run in the
submission's own Python process: grade untrusted submissions inside a container or a throwaway
virtual machine. The instructor guide lists what the grader does and does not guarantee.
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from inferlab.course.checks import FAIL, PASS, TODO  # the tags the checks print; no torch import

# What an exercise can come to (the same words as inferlab.course.verify's).
PASSED, FAILED, NOT_ATTEMPTED, NOT_RUN, FLAGGED = ("passed", "failed", "not attempted", "not run",
                                                   "flagged")
_TAG_STATUS = {PASS: PASSED, FAIL: FAILED, TODO: NOT_ATTEMPTED}
_WORST_FIRST = {FAILED: 0, NOT_ATTEMPTED: 1, PASSED: 2}  # an exercise printed twice keeps its worst

# What a notebook's run can come to. Only COMPLETED means the notebook ran to its last cell.
COMPLETED, TIMED_OUT, KERNEL_DIED = "completed", "timed out", "kernel died"
NOT_FOUND, UNREADABLE, GRADER_ERROR = "not found", "unreadable", "grader error"

EXIT_ALL_PASSED, EXIT_NOT_ALL_PASSED, EXIT_USAGE, EXIT_NOT_GRADED = 0, 1, 2, 3

_LABEL = r"[0-9A-Za-z_.]*[0-9A-Za-z_]"
_TAG = re.compile("(" + "|".join(map(re.escape, _TAG_STATUS)) + rf") Exercise\s+({_LABEL})")
_IMPORTS = (re.compile(r"^\s*from\s+inferlab\.course\.checks\s+import\s+(lab\w+)(?:\s+as\s+(\w+))?", re.M),
            re.compile(r"^\s*import\s+inferlab\.course\.checks\.(lab\w+)(?:\s+as\s+(\w+))?", re.M))
_WORKER_GRACE_S = 90  # kernel start-up and shutdown on top of a notebook's own budget
CHECK_BUDGET_S = 180  # seconds the grader's own checks may take after the notebook has run
DEFAULT_MEMORY_GB = 8.0  # the worker's (and so its kernel's) data-segment limit
_GRADING_TAG = "inferlab-grading"


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
        data = {k: v for k, v in data.items() if k != "counts"}
        data["exercises"] = [ExerciseResult(**e) for e in data.get("exercises", [])]
        return cls(**data)


# --- Reading a notebook: which lab it is, and what its checks said ----------------------------

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


def _texts(output) -> list[str]:
    """The text of an output in which a check's tag can appear."""
    if output.get("output_type") == "stream":
        return [output.get("text", "")]
    if output.get("output_type") == "error":
        return [output.get("evalue", "")]
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


def _cell_name(nb, index: int) -> str:
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
    where = _cell_name(nb, index)
    if index == stopped_at:
        return f"its check cell, {where}, was running when {stop_reason}"
    cell = nb.cells[index]
    error = _first_error(cell)
    if error is not None:
        because = ""
        exercise = next((i for i in range(index - 1, -1, -1) if nb.cells[i].cell_type == "code"
                         and re.match(r"\s*#\s*Exercise\b", nb.cells[i].source)), None)
        if exercise is not None and (cause := _first_error(nb.cells[exercise])) is not None:
            because = (f"its exercise cell, {_cell_name(nb, exercise)}, raised "
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
            where = _cell_name(nb, cell) if cell is not None else "a cell"
            flags.append({"cell": None if cell is None else cell + 1, "kind": "unknown label",
                          "message": f"{where} printed a {printed} tag for Exercise {label}, which "
                                     f"{module or 'this lab'} does not have (its exercises: "
                                     f"{', '.join(labels) or 'none'}); reported as unknown, "
                                     "never counted"})
        elif verdicts is not None and printed == PASSED and verdicts.get(label) != PASSED:
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
                      else f"{_cell_name(nb, cell)}: {f['message']}"})
    flags += _tag_flags(nb, tags, labels, None if verdict is None else
                        {e.exercise: e.result for e in exercises}, module)
    errors = _cell_errors(nb)
    others = [e for e in errors if e["ename"] != "CheckFailed"]
    if others:
        first = others[0]
        evalue = first["evalue"].splitlines()[0] if first["evalue"] else ""
        note = (f"{len(others)} cell(s) raised an error besides failed checks; first: cell "
                f"{first['cell']}, {first['ename']}: {evalue}")
        detail = f"{detail}; {note}" if detail else note
    return NotebookResult(path, run, detail, round(seconds, 1), module, exercises, errors, flags)


# --- Running one notebook (inside a worker process) -------------------------------------------

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


def _grading_cell_source(params: dict) -> str:
    """The last cell: ``inferlab.course.verify``'s text, executed in a namespace of its own, then
    its ``run`` on the notebook's globals."""
    from inferlab.course import verify

    source = Path(verify.__file__).read_text(encoding="utf-8")
    return ("def __inferlab_grading(user_ns):\n"
            "    space = {'__name__': 'inferlab_grading'}\n"
            f"    exec(compile({source!r}, '<inferlab grader>', 'exec'), space)\n"
            f"    space['run'](user_ns, {params!r})\n"
            "__inferlab_grading(globals())\n"
            "del __inferlab_grading\n")


def run_notebook(path: Path, timeout: float, kernel: str = "python3",
                 executed_to: Path | None = None,
                 check_budget: float = CHECK_BUDGET_S) -> NotebookResult:
    """Execute one notebook in a fresh kernel within ``timeout`` seconds, then run the lab's
    checks on it in the same kernel (within ``check_budget`` seconds), and grade it."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    from inferlab.course import catalog, scan
    from inferlab.course import checks as checks_package

    start = time.monotonic()
    name = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return NotebookResult(name, NOT_FOUND, "no such file")
    except OSError as error:
        return NotebookResult(name, UNREADABLE, f"cannot read it: {error}")
    try:
        json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return NotebookResult(name, UNREADABLE, "not a notebook: not UTF-8 text")
    except json.JSONDecodeError as error:
        return NotebookResult(name, UNREADABLE, f"not a notebook: not JSON ({error})")
    try:
        nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
    except Exception as error:  # valid JSON, but not a notebook nbformat understands
        return NotebookResult(name, UNREADABLE, f"not a notebook: {error}".splitlines()[0])

    for cell in nb.cells:  # grade only what this run prints, never the submitted outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
    code = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    module, alias = identify_lab(nb)
    exercises = []
    if module is not None:
        names = catalog.exercise_names(module)
        exercises = [{"check": fn, "name": names.get(fn, fn), "label": label}
                     for fn, label in exercises_of(module).items()]
    submitted = len(nb.cells)
    if exercises:  # the grader's own checks, filled in when the notebook has run
        nb.cells.append(nbformat.v4.new_code_cell("", metadata={"tags": [_GRADING_TAG]}))

    workdir = Path(tempfile.mkdtemp(prefix="inferlab-grade-"))
    (workdir / "tmp").mkdir()
    verdict_dir: dict[str, Path] = {}
    nonce = secrets.token_hex(16)
    deadline = start + timeout
    current: dict[str, int | None] = {"cell": None}

    def remaining(cell=None) -> int:
        if cell is not None and _GRADING_TAG in cell.metadata.get("tags", []):
            return max(1, math.ceil(check_budget))
        return max(1, math.ceil(deadline - time.monotonic()))

    async def on_cell_start(cell, cell_index):
        current["cell"] = cell_index
        if cell_index == submitted:  # the submission has finished: open the private channel
            verdict_dir["path"] = Path(tempfile.mkdtemp(prefix="inferlab-verdict-"))
            cell.source = _grading_cell_source({
                "nonce": nonce, "result_path": str(verdict_dir["path"] / "verdict.json"),
                "checks_dir": str(Path(checks_package.__file__).resolve().parent),
                "module": module, "alias": alias, "exercises": exercises, "cells": code})

    env = {**os.environ, "TMPDIR": str(workdir / "tmp")}
    client = NotebookClient(
        nb, kernel_name=kernel, allow_errors=True, timeout_func=remaining,
        interrupt_on_timeout=False, shutdown_kernel="immediate", record_timing=False,
        startup_timeout=max(10, min(60, math.ceil(timeout))), on_cell_start=on_cell_start,
        resources={"metadata": {"path": str(workdir)}})
    run, detail, stopped_at, verdict = COMPLETED, "", None, None
    try:
        client.execute(env=env)
    except CellTimeoutError:
        run, stopped_at = TIMED_OUT, current["cell"]
        if stopped_at == submitted:
            detail, stopped_at = f"the grader's checks ran out of their {check_budget:g} s", None
        else:
            where = _cell_name(nb, stopped_at) if stopped_at is not None else "kernel start-up"
            detail = f"ran out of its {timeout:g} s budget in {where}"
    except DeadKernelError:
        run, stopped_at = KERNEL_DIED, current["cell"]
        if stopped_at == submitted:
            detail, stopped_at = "the kernel died while the grader's checks ran", None
        else:
            where = _cell_name(nb, stopped_at) if stopped_at is not None else "start-up"
            detail = f"the kernel died in {where} (a crash, an exit() call, or out of memory)"
    except Exception as error:  # a kernel that will not start, a malformed cell, ...
        run, stopped_at = GRADER_ERROR, current["cell"]
        detail = f"{type(error).__name__}: {error}".splitlines()[0]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    grading = nb.cells[submitted:]
    del nb.cells[submitted:]  # the executed notebook is the submission's, without our cell
    if "path" in verdict_dir:
        verdict, problem = _read_verdict(verdict_dir["path"] / "verdict.json", nonce, grading)
        shutil.rmtree(verdict_dir["path"], ignore_errors=True)
        if problem and run == COMPLETED:
            run, detail = GRADER_ERROR, problem
    if executed_to is not None:
        executed_to.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(executed_to))
    return summarise(nb, name, run, detail, time.monotonic() - start, stopped_at, verdict,
                     module, alias, scan.source_flags(code))


def _read_verdict(path: Path, nonce: str, grading_cells) -> tuple[dict | None, str]:
    """The grader's results, if the file holds them with this run's nonce; else why not."""
    try:
        verdict = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        error = next((o for c in grading_cells for o in c.get("outputs", [])
                      if o.get("output_type") == "error"), None)
        why = f": {error.get('ename')}: {error.get('evalue')}" if error else ""
        return None, f"the grader's checks wrote no result{why}"
    if not isinstance(verdict, dict) or verdict.get("nonce") != nonce:
        return None, "the grader's result file does not carry this run's nonce: not trusted"
    if verdict.get("error"):
        return None, f"the grader's checks could not run: {verdict['error']}"
    return verdict, ""


# --- Running many notebooks (in the parent process) -------------------------------------------

def _executed_name(folder: Path, index: int, path: Path) -> Path:
    return folder / f"{index + 1:03d}_{path.name}"


def _grade_in_worker(index: int, path: Path, timeout: float, kernel: str, env: dict,
                     executed_dir: Path | None, memory_gb: float) -> NotebookResult:
    """One notebook in a worker process whose working directory is a fresh, private temporary
    directory and which is told about this notebook only."""
    with tempfile.TemporaryDirectory(prefix="inferlab-grade-") as tmp:
        result_file = Path(tmp) / "result.json"
        workdir = Path(tmp) / "work"
        workdir.mkdir()
        cmd = [sys.executable, "-m", "inferlab.course.grade", str(path.resolve()), "--timeout",
               str(timeout), "--kernel", kernel, "--memory-gb", str(memory_gb),
               "--_worker-result", str(result_file)]
        if executed_dir is not None:
            cmd += ["--executed-dir", str(_executed_name(executed_dir.resolve(), index, path))]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=timeout + CHECK_BUDGET_S + _WORKER_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return NotebookResult(str(path), TIMED_OUT,
                                  f"the grading worker did not finish within {timeout:g} s plus "
                                  f"{CHECK_BUDGET_S + _WORKER_GRACE_S} s and was killed",
                                  round(time.monotonic() - start, 1))
        if result_file.is_file():
            result = NotebookResult.from_dict(json.loads(result_file.read_text(encoding="utf-8")))
            result.notebook = str(path)
            return result
        last = (stderr or b"").decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        return NotebookResult(str(path), GRADER_ERROR,
                              f"the grading worker exited with status {proc.returncode}: {last[0]}",
                              round(time.monotonic() - start, 1))


def limit_memory(gigabytes: float) -> None:
    """Cap this process's data segment (heap and private mappings), and so its children's: an
    allocation beyond it fails with MemoryError instead of taking the machine down. 0: no cap."""
    if gigabytes > 0:
        import resource

        limit = int(gigabytes * 2**30)
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def grade(paths: Iterable[str | Path], timeout: float = 600, jobs: int = 1,
          kernel: str = "python3", profile: str | None = None,
          executed_dir: str | Path | None = None,
          progress: Callable[[int, int, NotebookResult], None] | None = None,
          memory_gb: float = DEFAULT_MEMORY_GB) -> list[NotebookResult]:
    """Grade each notebook in its own worker process; results in the order of ``paths``.

    ``jobs`` notebooks run at once (on a small machine keep 1: the labs time things, and two
    kernels share the cores; with more than one, each kernel gets ``OMP_NUM_THREADS`` = cores /
    jobs unless you set it). ``profile`` sets ``INFERLAB_PROFILE`` for the kernels;
    ``memory_gb`` caps each worker and its kernel (0: no cap).
    """
    paths = [Path(p) for p in paths]
    if timeout <= 0 or jobs < 1 or memory_gb < 0:
        raise ValueError(f"timeout must be positive, jobs at least 1 and memory_gb not negative, "
                         f"got {timeout}, {jobs}, {memory_gb}")
    env = dict(os.environ)
    # The workers and kernels import the same inferlab as this process, wherever they start.
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    if profile:
        env["INFERLAB_PROFILE"] = profile
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    executed = Path(executed_dir) if executed_dir is not None else None
    results: list[NotebookResult | None] = [None] * len(paths)
    lock = threading.Lock()

    def one(index: int) -> None:
        result = _grade_in_worker(index, paths[index], timeout, kernel, env, executed, memory_gb)
        with lock:
            results[index] = result
            if progress:
                progress(sum(r is not None for r in results), len(paths), result)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, range(len(paths))))
    return [r for r in results if r is not None]


def exit_status(results: list[NotebookResult]) -> int:
    """0 all passed and nothing flagged, 1 some exercise not passed or something flagged,
    3 some notebook not graded to its end."""
    if any(not r.graded_to_end for r in results):
        return EXIT_NOT_GRADED
    if any(e.result != PASSED for r in results for e in r.exercises) or any(r.flags for r in results):
        return EXIT_NOT_ALL_PASSED
    return EXIT_ALL_PASSED


# --- Reports --------------------------------------------------------------------------------

def _one_line(text: str) -> str:
    return " ".join(text.split())


def _table(header: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = []
    for row in [header, *rows]:
        cells = [str(x).rjust(w) if i in right else str(x).ljust(w)
                 for i, (x, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_text(results: list[NotebookResult]) -> str:
    """The two tables a person reads, one row a notebook and one row an exercise, with the
    notes on how runs ended and the flags between them."""
    rows = []
    for r in results:
        total = len(r.exercises)
        rows.append([r.notebook, r.run, r.lab or "-", f"{r.count(PASSED)}/{total}",
                     str(r.count(FAILED)), str(r.count(NOT_ATTEMPTED)), str(r.count(NOT_RUN)),
                     str(r.count(FLAGGED)), str(len(r.flags)), f"{r.seconds:.1f}"])
    out = [_table(["notebook", "run", "lab", "passed", "failed", "not attempted", "not run",
                   "flagged", "flags", "seconds"], rows, right={3, 4, 5, 6, 7, 8, 9})]
    notes = [f"  {r.notebook}: {r.run}: {_one_line(r.detail)}" for r in results if r.detail]
    if notes:
        out.append("Notes:\n" + "\n".join(notes))
    flags = [f"  {r.notebook}: {f['kind']}: {_one_line(f['message'])}"
             for r in results for f in r.flags]
    if flags:
        out.append("Flags (each needs a look; a flagged exercise is not passed):\n"
                   + "\n".join(flags))
    ex_rows = [[r.notebook, e.exercise, e.result, _one_line(e.message)]
               for r in results for e in r.exercises]
    if ex_rows:
        out.append(_table(["notebook", "exercise", "result", "message"], ex_rows))
    return "\n\n".join(out) + "\n"


CSV_FIELDS = ["notebook", "run", "detail", "seconds", "lab", "exercise", "result", "message",
              "flags"]


def format_csv(results: list[NotebookResult]) -> str:
    """One row per exercise (a notebook with none gets one row with an empty exercise)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in results:
        base = {"notebook": r.notebook, "run": r.run, "detail": r.detail, "seconds": r.seconds,
                "lab": r.lab or "",
                "flags": " | ".join(f"{f['kind']}: {f['message']}" for f in r.flags)}
        for e in r.exercises or [ExerciseResult("", "", "")]:
            writer.writerow({**base, "exercise": e.exercise, "result": e.result,
                             "message": e.message})
    return buffer.getvalue()


def format_json(results: list[NotebookResult]) -> str:
    return json.dumps({"exit_status": exit_status(results),
                       "notebooks": [r.to_dict() for r in results]}, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferlab.course.grade",
        description="Run submitted lab notebooks headless, then run each lab's checks on them "
                    "yourself, and report, per notebook and per exercise, passed / failed (with "
                    "the check's message) / not attempted / not run / flagged.",
        epilog="Exit status: 0 all passed and nothing flagged; 1 all notebooks ran but some "
               "exercise did not pass or something was flagged; 2 bad usage; 3 some notebook "
               "could not be graded to its end.")
    parser.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="submitted .ipynb files")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON instead of tables")
    fmt.add_argument("--csv", action="store_true", help="print CSV, one row per exercise")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="wall-clock seconds each notebook may run (default 600)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="notebooks run at once (default 1; more only on a machine with "
                             "cores to spare)")
    parser.add_argument("--profile", default=None,
                        help="set INFERLAB_PROFILE for the kernels (cpu, small-gpu, large-gpu)")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    parser.add_argument("--executed-dir", default=None, metavar="DIR",
                        help="also save each executed notebook in DIR, to read its outputs")
    parser.add_argument("--memory-gb", type=float, default=DEFAULT_MEMORY_GB,
                        help="memory each notebook's worker and kernel may allocate, in GiB "
                             f"(default {DEFAULT_MEMORY_GB:g}; 0 for no limit)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--_worker-result", dest="worker_result", default=None,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.jobs < 1 or args.memory_gb < 0:
        parser.error("--timeout must be positive, --jobs at least 1, --memory-gb not negative")

    if args.worker_result:  # inside a worker: one notebook, result as JSON in a file
        limit_memory(args.memory_gb)
        executed = Path(args.executed_dir) if args.executed_dir else None
        result = run_notebook(Path(args.notebooks[0]), args.timeout, args.kernel, executed)
        Path(args.worker_result).write_text(json.dumps(result.to_dict()), encoding="utf-8")
        return 0

    def progress(done: int, total: int, r: NotebookResult) -> None:
        if not args.quiet:
            flagged = f", {len(r.flags)} flag(s)" if r.flags else ""
            print(f"[{done}/{total}] {r.notebook}: {r.run}, {r.count(PASSED)} of "
                  f"{len(r.exercises)} exercises passed{flagged} ({r.seconds:.1f} s)",
                  file=sys.stderr, flush=True)

    results = grade(args.notebooks, timeout=args.timeout, jobs=args.jobs, kernel=args.kernel,
                    profile=args.profile, executed_dir=args.executed_dir, progress=progress,
                    memory_gb=args.memory_gb)
    if args.json:
        sys.stdout.write(format_json(results))
    elif args.csv:
        sys.stdout.write(format_csv(results))
    else:
        sys.stdout.write(format_text(results))
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
