"""Grade submitted lab notebooks: run each one headless, then run the lab's checks on it.

    python -m inferlab.course.grade submissions/*.ipynb               # 80-column report
    python -m inferlab.course.grade alice.ipynb bob.ipynb --csv > grades.csv   # or --json
    python -m inferlab.course.grade submissions/*.ipynb --weights points.csv   # your own points
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

**Scores.** Each exercise is worth the points its lab's check module gives it (``WEIGHTS``; 1
where it gives none), or those of a ``--weights`` file; a notebook scores the points of its
passed exercises out of all of its lab's. The text report fits an 80-column terminal: one line
a notebook, then each notebook's findings, one per offence (an exercise that uses the reference
is one flagged exercise, not also a flag); ``--csv`` gives one row per exercise with its weight
and points.

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
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from inferlab.course.report import (EXIT_ALL_PASSED, EXIT_NOT_ALL_PASSED, EXIT_NOT_GRADED,
    EXIT_USAGE, exit_status, format_csv, format_json, format_text, load_weights, score,
    submission_names)
from inferlab.course.results import PASSED, TIMED_OUT, GRADER_ERROR, NotebookResult
from inferlab.course.runner import CHECK_BUDGET_S, run_notebook

__all__ = ["grade", "main", "exit_status", "score", "format_text", "format_csv", "format_json",
           "load_weights", "submission_names", "EXIT_ALL_PASSED", "EXIT_NOT_ALL_PASSED", "EXIT_USAGE",
           "EXIT_NOT_GRADED"]
_WORKER_GRACE_S = 90  # kernel start-up and shutdown on top of a notebook's own budget
DEFAULT_MEMORY_GB = 8.0  # the worker's (and so its kernel's) data-segment limit


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
    parser.add_argument("--weights", default=None, metavar="CSV",
                        help="points per exercise, a CSV file with the columns exercise,weight "
                             "(default: each lab's WEIGHTS in its check module)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--_worker-result", dest="worker_result", default=None,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.jobs < 1 or args.memory_gb < 0:
        parser.error("--timeout must be positive, --jobs at least 1, --memory-gb not negative")
    overrides = None
    if args.weights:
        try:
            overrides = load_weights(args.weights)
        except (OSError, ValueError) as error:
            parser.error(f"--weights: {error}")

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
        sys.stdout.write(format_json(results, overrides))
    elif args.csv:
        sys.stdout.write(format_csv(results, overrides))
    else:
        sys.stdout.write(format_text(results, overrides))
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
