"""Grade submitted lab notebooks: run each one headless and read what its check cells said.

    python -m inferlab.course.grade submissions/*.ipynb               # tables on stdout
    python -m inferlab.course.grade alice.ipynb bob.ipynb --json       # or --csv
    python -m inferlab.course.grade submissions/*.ipynb --timeout 300 --jobs 2 --profile cpu

Every notebook runs in a worker process of its own, with a Jupyter kernel of its own, in a fresh
temporary directory, after its saved outputs are cleared (an output pasted into a submission
counts for nothing). A cell that raises does not stop the run, so later exercises are still
graded. Each notebook has a wall-clock budget (``--timeout``): when it runs out the kernel is
killed and the exercises not reached are reported as not run. A notebook that is missing, is not
JSON, is not a notebook, kills its kernel or hangs its worker gets a row that says so; the other
notebooks are graded as usual.

The checks in ``inferlab.course.checks`` end in one of three fixed tags, which the grader reads from
the outputs: ``[PASS] Exercise N.M`` printed means passed; a ``CheckFailed`` error whose message
starts ``[FAIL] Exercise N.M`` means failed (the row carries the message and its hint);
``[TODO] Exercise N.M`` printed means not attempted. An exercise with no tag at all is *not run*,
with the reason: its check cell raised some other error (say, a NameError because the exercise
cell had a syntax error), was never reached, or is missing. Which exercises a lab has comes from
its check module, ``inferlab.course.checks.labNN``, whose check functions' docstrings start
``Exercise N.M:``; tags for other labels are reported too.

Exit status:
    0  every notebook ran to its end and every exercise passed;
    1  every notebook ran to its end, but some exercise failed, was not attempted or did not run;
    2  the command line was wrong (argparse's convention);
    3  some notebook could not be graded to its end: missing, unreadable, timed out, kernel died.

Grading runs the submitted code with your permissions: grade untrusted submissions inside a
container or a throwaway virtual machine. The tags are feedback, not proof: a learner can print
a fake ``[PASS]`` line, so spot-check the executed notebooks (``--executed-dir``).
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

# What an exercise can come to.
PASSED, FAILED, NOT_ATTEMPTED, NOT_RUN = "passed", "failed", "not attempted", "not run"
_TAG_STATUS = {PASS: PASSED, FAIL: FAILED, TODO: NOT_ATTEMPTED}
_WORST_FIRST = {FAILED: 0, NOT_ATTEMPTED: 1, PASSED: 2}  # an exercise reported twice keeps its worst

# What a notebook's run can come to. Only COMPLETED means the notebook ran to its last cell.
COMPLETED, TIMED_OUT, KERNEL_DIED = "completed", "timed out", "kernel died"
NOT_FOUND, UNREADABLE, GRADER_ERROR = "not found", "unreadable", "grader error"

EXIT_ALL_PASSED, EXIT_NOT_ALL_PASSED, EXIT_USAGE, EXIT_NOT_GRADED = 0, 1, 2, 3

_LABEL = r"[0-9A-Za-z_.]*[0-9A-Za-z_]"
_TAG = re.compile("(" + "|".join(map(re.escape, _TAG_STATUS)) + rf") Exercise\s+({_LABEL})")
_IMPORTS = (re.compile(r"^\s*from\s+inferlab\.course\.checks\s+import\s+(lab\w+)(?:\s+as\s+(\w+))?", re.M),
            re.compile(r"^\s*import\s+inferlab\.course\.checks\.(lab\w+)(?:\s+as\s+(\w+))?", re.M))
_WORKER_GRACE_S = 90  # kernel start-up and shutdown on top of a notebook's own budget


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

    def count(self, result: str) -> int:
        return sum(e.result == result for e in self.exercises)

    @property
    def graded_to_end(self) -> bool:
        return self.run == COMPLETED

    def to_dict(self) -> dict:
        out = asdict(self)
        out["counts"] = {r: self.count(r) for r in (PASSED, FAILED, NOT_ATTEMPTED, NOT_RUN)}
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


def summarise(nb, path: str, run: str, detail: str, seconds: float,
              stopped_at: int | None = None) -> NotebookResult:
    """Turn an executed (or partly executed) notebook into a ``NotebookResult``."""
    module, alias = find_check_module(c.source for c in nb.cells if c.cell_type == "code")
    checks = exercises_of(module) if module else {}
    tags = read_tags(nb)
    labels = list(dict.fromkeys([*checks.values(), *tags]))
    stop_reason = {TIMED_OUT: "the notebook ran out of time", KERNEL_DIED: "the kernel died",
                   GRADER_ERROR: "the run stopped on a grader error"}.get(run, "")
    exercises = []
    for label in labels:
        if label in tags:
            result, message = tags[label]
        else:
            result = NOT_RUN
            message = _why_not_run(nb, label, checks, alias, stopped_at, stop_reason)
        exercises.append(ExerciseResult(label, result, message))
    errors = _cell_errors(nb)
    others = [e for e in errors if e["ename"] != "CheckFailed"]
    if others:
        first = others[0]
        evalue = first["evalue"].splitlines()[0] if first["evalue"] else ""
        note = (f"{len(others)} cell(s) raised an error besides failed checks; first: cell "
                f"{first['cell']}, {first['ename']}: {evalue}")
        detail = f"{detail}; {note}" if detail else note
    return NotebookResult(path, run, detail, round(seconds, 1), module, exercises, errors)


# --- Running one notebook (inside a worker process) -------------------------------------------

def run_notebook(path: Path, timeout: float, kernel: str = "python3",
                 executed_to: Path | None = None) -> NotebookResult:
    """Execute one notebook in a fresh kernel within ``timeout`` seconds and grade it."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

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

    deadline = start + timeout
    current: dict[str, int | None] = {"cell": None}

    def remaining(cell=None) -> int:
        return max(1, math.ceil(deadline - time.monotonic()))

    async def on_cell_start(cell, cell_index):
        current["cell"] = cell_index

    workdir = tempfile.mkdtemp(prefix="inferlab-grade-")
    client = NotebookClient(
        nb, kernel_name=kernel, allow_errors=True, timeout_func=remaining,
        interrupt_on_timeout=False, shutdown_kernel="immediate", record_timing=False,
        startup_timeout=max(10, min(60, math.ceil(timeout))), on_cell_start=on_cell_start,
        resources={"metadata": {"path": workdir}})
    run, detail, stopped_at = COMPLETED, "", None
    try:
        client.execute()
    except CellTimeoutError:
        run, stopped_at = TIMED_OUT, current["cell"]
        where = _cell_name(nb, stopped_at) if stopped_at is not None else "kernel start-up"
        detail = f"ran out of its {timeout:g} s budget in {where}"
    except DeadKernelError:
        run, stopped_at = KERNEL_DIED, current["cell"]
        where = _cell_name(nb, stopped_at) if stopped_at is not None else "start-up"
        detail = f"the kernel died in {where} (a crash, an exit() call, or out of memory)"
    except Exception as error:  # a kernel that will not start, a malformed cell, ...
        run, stopped_at = GRADER_ERROR, current["cell"]
        detail = f"{type(error).__name__}: {error}".splitlines()[0]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if executed_to is not None:
        executed_to.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(executed_to))
    return summarise(nb, name, run, detail, time.monotonic() - start, stopped_at)


# --- Running many notebooks (in the parent process) -------------------------------------------

def _executed_name(folder: Path, index: int, path: Path) -> Path:
    return folder / f"{index + 1:03d}_{path.name}"


def _grade_in_worker(index: int, path: Path, timeout: float, kernel: str, env: dict,
                     executed_dir: Path | None) -> NotebookResult:
    with tempfile.TemporaryDirectory(prefix="inferlab-grade-") as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "inferlab.course.grade", str(path), "--timeout", str(timeout),
               "--kernel", kernel, "--_worker-result", str(result_file)]
        if executed_dir is not None:
            cmd += ["--executed-dir", str(_executed_name(executed_dir, index, path))]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=timeout + _WORKER_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return NotebookResult(str(path), TIMED_OUT,
                                  f"the grading worker did not finish within {timeout:g} s plus "
                                  f"{_WORKER_GRACE_S} s and was killed",
                                  round(time.monotonic() - start, 1))
        if result_file.is_file():
            return NotebookResult.from_dict(json.loads(result_file.read_text(encoding="utf-8")))
        last = (stderr or b"").decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        return NotebookResult(str(path), GRADER_ERROR,
                              f"the grading worker exited with status {proc.returncode}: {last[0]}",
                              round(time.monotonic() - start, 1))


def grade(paths: Iterable[str | Path], timeout: float = 600, jobs: int = 1,
          kernel: str = "python3", profile: str | None = None,
          executed_dir: str | Path | None = None,
          progress: Callable[[int, int, NotebookResult], None] | None = None) -> list[NotebookResult]:
    """Grade each notebook in its own worker process; results in the order of ``paths``.

    ``jobs`` notebooks run at once (on a small machine keep 1: the labs time things, and two
    kernels share the cores; with more than one, each kernel gets ``OMP_NUM_THREADS`` = cores /
    jobs unless you set it). ``profile`` sets ``INFERLAB_PROFILE`` for the kernels.
    """
    paths = [Path(p) for p in paths]
    if timeout <= 0 or jobs < 1:
        raise ValueError(f"timeout must be positive and jobs at least 1, got {timeout}, {jobs}")
    env = dict(os.environ)
    if profile:
        env["INFERLAB_PROFILE"] = profile
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    executed = Path(executed_dir) if executed_dir is not None else None
    results: list[NotebookResult | None] = [None] * len(paths)
    lock = threading.Lock()

    def one(index: int) -> None:
        result = _grade_in_worker(index, paths[index], timeout, kernel, env, executed)
        with lock:
            results[index] = result
            if progress:
                progress(sum(r is not None for r in results), len(paths), result)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, range(len(paths))))
    return [r for r in results if r is not None]


def exit_status(results: list[NotebookResult]) -> int:
    """0 all passed, 1 some exercise not passed, 3 some notebook not graded to its end."""
    if any(not r.graded_to_end for r in results):
        return EXIT_NOT_GRADED
    if any(e.result != PASSED for r in results for e in r.exercises):
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
    """The two tables a person reads: one row a notebook, then one row an exercise."""
    rows = []
    for r in results:
        total = len(r.exercises)
        rows.append([r.notebook, r.run, r.lab or "-", f"{r.count(PASSED)}/{total}",
                     str(r.count(FAILED)), str(r.count(NOT_ATTEMPTED)), str(r.count(NOT_RUN)),
                     f"{r.seconds:.1f}"])
    out = [_table(["notebook", "run", "lab", "passed", "failed", "not attempted", "not run",
                   "seconds"], rows, right={3, 4, 5, 6, 7})]
    notes = [f"  {r.notebook}: {r.run}: {_one_line(r.detail)}" for r in results if r.detail]
    if notes:
        out.append("Notes:\n" + "\n".join(notes))
    ex_rows = [[r.notebook, e.exercise, e.result, _one_line(e.message)]
               for r in results for e in r.exercises]
    if ex_rows:
        out.append(_table(["notebook", "exercise", "result", "message"], ex_rows))
    return "\n\n".join(out) + "\n"


CSV_FIELDS = ["notebook", "run", "detail", "seconds", "lab", "exercise", "result", "message"]


def format_csv(results: list[NotebookResult]) -> str:
    """One row per exercise (a notebook with none gets one row with an empty exercise)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in results:
        base = {"notebook": r.notebook, "run": r.run, "detail": r.detail, "seconds": r.seconds,
                "lab": r.lab or ""}
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
        description="Run submitted lab notebooks headless and report, per notebook and per "
                    "exercise, passed / failed (with the check's message) / not attempted / "
                    "not run.",
        epilog="Exit status: 0 all passed; 1 all notebooks ran but some exercise did not pass; "
               "2 bad usage; 3 some notebook could not be graded to its end.")
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
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--_worker-result", dest="worker_result", default=None,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.jobs < 1:
        parser.error("--timeout must be positive and --jobs at least 1")

    if args.worker_result:  # inside a worker: one notebook, result as JSON in a file
        executed = Path(args.executed_dir) if args.executed_dir else None
        result = run_notebook(Path(args.notebooks[0]), args.timeout, args.kernel, executed)
        Path(args.worker_result).write_text(json.dumps(result.to_dict()), encoding="utf-8")
        return 0

    def progress(done: int, total: int, r: NotebookResult) -> None:
        if not args.quiet:
            print(f"[{done}/{total}] {r.notebook}: {r.run}, {r.count(PASSED)} of "
                  f"{len(r.exercises)} exercises passed ({r.seconds:.1f} s)", file=sys.stderr,
                  flush=True)

    results = grade(args.notebooks, timeout=args.timeout, jobs=args.jobs, kernel=args.kernel,
                    profile=args.profile, executed_dir=args.executed_dir, progress=progress)
    if args.json:
        sys.stdout.write(format_json(results))
    elif args.csv:
        sys.stdout.write(format_csv(results))
    else:
        sys.stdout.write(format_text(results))
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
