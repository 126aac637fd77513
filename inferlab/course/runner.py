"""One submitted notebook, executed in a fresh kernel and then checked by the grader itself.

``run_notebook`` reads the file (a missing, non-UTF-8, non-JSON or malformed one gets a result
that says so), clears its saved outputs, executes it with nbclient in a kernel whose working
directory and ``TMPDIR`` are a fresh temporary directory, within a wall-clock budget, and lets a
cell that raises not stop the run. When the submission's last cell has run it appends one more
cell: the text of ``inferlab.course.verify``, which runs the lab's checks on the learner's own
functions and writes the results, with this run's nonce, to a file created only then. The
executed notebook (without that cell) and the verdict go to ``inferlab.course.results``.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from inferlab.course.results import (COMPLETED, GRADER_ERROR, KERNEL_DIED, NOT_FOUND, TIMED_OUT,
    UNREADABLE, NotebookResult, cell_name, exercises_of, identify_lab, summarise)

CHECK_BUDGET_S = 180  # seconds the grader's own checks may take after the notebook has run
WAIT_SLICE_S = 1.0  # the longest single wait for a kernel message; then the socket is asked


def slice_waits(kc):
    """``kc``, a kernel client, with every wait for a kernel message (the shell reply of a
    cell, its outputs on iopub) made a series of polls of at most ``WAIT_SLICE_S`` seconds.

    The kernel client's sockets are ZeroMQ sockets driven by asyncio: a wait for a message
    sleeps until the socket's file descriptor signals, and ZeroMQ signals only when the pipe
    from the kernel turns from empty to not empty. A signal the event loop misses is not sent
    again while the message sits unread, and later messages (a ``kernel_info`` reply, say) do
    not signal either: the wait then lasts as long as its timeout, the whole cell's budget,
    and ends quietly, because at its timeout the poll asks the socket once and finds the reply
    there (pyzmq issue 1558 reports the same: the event comes back only at the timeout). A
    grader that waited 420 s for a cell of Lab 1 with the kernel idle, and then graded it as if
    nothing had happened, fits that; so does a book build in which solutions/02 took 643 s
    (43 s of work) with its kernel idle in its event loop. Each poll ends by asking the socket,
    so here a missed signal costs at most one slice; nothing a cell computes changes."""
    import time
    from queue import Empty

    def sliced(get_msg):
        async def get_msg_in_slices(timeout=None):
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = WAIT_SLICE_S if deadline is None else min(
                    WAIT_SLICE_S, max(0.0, deadline - time.monotonic()))
                try:
                    return await get_msg(timeout=left)
                except Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise
        return get_msg_in_slices

    for channel in (kc.shell_channel, kc.iopub_channel):
        channel.get_msg = sliced(channel.get_msg)
    return kc


def _sliced_client():
    """nbclient's ``NotebookClient`` whose kernel client waits in slices (``slice_waits``)."""
    from nbclient import NotebookClient

    class SlicedClient(NotebookClient):
        async def async_start_new_kernel_client(self):
            return slice_waits(await super().async_start_new_kernel_client())

    return SlicedClient


def execute(nb, cwd, timeout: float = 600, kernel_name: str = "python3"):
    """Execute ``nb`` (an ``nbformat`` notebook) in place from top to bottom, as ``jupyter
    nbconvert --execute`` would, in a kernel whose working directory is ``cwd``, each cell
    allowed ``timeout`` seconds; a cell's error raises. The one difference from nbconvert: every
    wait for a kernel message is made in slices (``slice_waits``). Returns ``nb``."""
    _sliced_client()(nb, timeout=timeout, kernel_name=kernel_name,
                     resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def slice_every_notebook_client() -> None:
    """Make every ``nbclient.NotebookClient`` of this process wait in slices (``slice_waits``):
    for executions that other libraries start (myst-nb's, jupyter-cache's), which take no client
    class. Idempotent."""
    from nbclient import NotebookClient

    if getattr(NotebookClient, "_waits_sliced", False):
        return
    start = NotebookClient.async_start_new_kernel_client

    async def start_sliced(self):
        return slice_waits(await start(self))

    NotebookClient.async_start_new_kernel_client = start_sliced
    NotebookClient._waits_sliced = True


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
    grading_cell = None
    if exercises:  # the grader's own checks, filled in when the notebook has run
        grading_cell = nbformat.v4.new_code_cell("")
        nb.cells.append(grading_cell)

    workdir = Path(tempfile.mkdtemp(prefix="inferlab-grade-"))
    (workdir / "tmp").mkdir()
    verdict_dir: dict[str, Path] = {}
    nonce = secrets.token_hex(16)
    deadline = start + timeout
    current: dict[str, int | None] = {"cell": None}

    def remaining(cell=None) -> int:
        if cell is not None and cell is grading_cell:  # by identity: a tag could be forged
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
    client = _sliced_client()(
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
            where = cell_name(nb, stopped_at) if stopped_at is not None else "kernel start-up"
            detail = f"ran out of its {timeout:g} s budget in {where}"
    except DeadKernelError:
        run, stopped_at = KERNEL_DIED, current["cell"]
        if stopped_at == submitted:
            detail, stopped_at = "the kernel died while the grader's checks ran", None
        else:
            where = cell_name(nb, stopped_at) if stopped_at is not None else "start-up"
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
