"""The grader's report: scores with per-exercise weights, and the text, CSV and JSON forms.

``score`` gives a notebook the points of its passed exercises out of its lab's (each check
module's ``WEIGHTS``, overridden by an instructor's ``--weights`` file, ``load_weights``).
``format_text`` is what a person reads in an 80-column terminal: one line a notebook (its path
below the submissions' common folder in full, last), then each notebook's findings, one line
(wrapped) per offence; ``format_csv`` one row per exercise, for a
spreadsheet; ``format_json`` everything. ``exit_status`` is the grading command's status.
"""
from __future__ import annotations

import csv
import io
import json
import os
import textwrap
from pathlib import Path

from inferlab.course.results import (FAILED, FLAGGED, NOT_ATTEMPTED, NOT_RUN, PASSED,
    ExerciseResult, NotebookResult, weights_of)

EXIT_ALL_PASSED, EXIT_NOT_ALL_PASSED, EXIT_USAGE, EXIT_NOT_GRADED = 0, 1, 2, 3


def exit_status(results: list[NotebookResult]) -> int:
    """0 all passed and nothing flagged, 1 some exercise not passed or something flagged,
    3 some notebook not graded to its end."""
    if any(not r.graded_to_end for r in results):
        return EXIT_NOT_GRADED
    if any(e.result != PASSED for r in results for e in r.exercises) or any(r.flags for r in results):
        return EXIT_NOT_ALL_PASSED
    return EXIT_ALL_PASSED


# --- Scores and reports ----------------------------------------------------------------------

def load_weights(path: str | Path) -> dict[str, float]:
    """``{exercise: points}`` from a CSV file with the columns ``exercise`` and ``weight``
    (``1.2,3``), which overrides the check modules' ``WEIGHTS`` for the exercises it lists."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"exercise", "weight"} <= set(rows[0]):
        raise ValueError(f"{path}: expected a CSV file with the columns exercise,weight")
    out = {}
    for row in rows:
        weight = float(row["weight"])
        if not weight >= 0:
            raise ValueError(f"{path}: the weight of {row['exercise']} must not be negative")
        out[row["exercise"].strip()] = weight
    return out


def weights(result: NotebookResult, overrides: dict[str, float] | None = None) -> dict[str, float]:
    """Points of each of the notebook's exercises: its lab's ``WEIGHTS``, then ``overrides``."""
    base = weights_of(result.lab) if result.lab else {}
    return {e.exercise: (overrides or {}).get(e.exercise, base.get(e.exercise, 1.0))
            for e in result.exercises}


def score(result: NotebookResult, overrides: dict[str, float] | None = None) -> tuple[float, float]:
    """``(earned, possible)``: the points of the passed exercises, and of all of them. A failed,
    unattempted, unrun or flagged exercise earns nothing."""
    w = weights(result, overrides)
    return (sum(w[e.exercise] for e in result.exercises if e.result == PASSED), sum(w.values()))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _points(x: float) -> str:
    return f"{x:g}"


WIDTH = 80  # the report reads in an 80-column terminal


def submission_names(paths: list[str]) -> tuple[str, list[str]]:
    """The folder every notebook lies under, and each notebook's path below it: the part that
    tells two submissions apart (``alice/01_roofline.ipynb`` and ``bob/01_roofline.ipynb``
    under ``submissions``; the file names when they share one folder), shown in full."""
    if not paths:
        return "", []
    absolute = [os.path.abspath(p) for p in paths]
    common = os.path.commonpath([os.path.dirname(p) for p in absolute])
    names = [os.path.relpath(p, common) for p in absolute]
    shown = os.path.relpath(common) if common == os.getcwd() or \
        common.startswith(os.getcwd() + os.sep) else common
    return shown, names


def format_text(results: list[NotebookResult], overrides: dict[str, float] | None = None) -> str:
    """A table of one line a notebook (score and counts, then the notebook's path below the
    folder all of them share, in full however long), then the findings of each notebook that
    has any: one line (wrapped to 80 columns) per exercise not passed, per flag and per note.
    The counts fit in ``WIDTH`` columns; a name longer than the room left runs past them
    rather than being cut, since it is what tells one learner's notebook from another's."""
    folder, names = submission_names([r.notebook for r in results])
    head = (f"{'lab':<5} {'score':>12} {'pass':>4} {'fail':>4} {'todo':>4} "
            f"{'norun':>5} {'flag':>4} {'secs':>6}  notebook")
    lines = [head, "-" * max([len(head)] + [len(head) - len("notebook") + len(n) for n in names])]
    for r, name in zip(results, names):
        earned, possible = score(r, overrides)
        pct = f"{earned / possible:.0%}" if possible else "-"
        mark = "" if r.graded_to_end else "*"
        cell = f"{_points(earned)}/{_points(possible)} {pct}{mark}"
        lines.append(f"{(r.lab or '-'):<5} {cell:>12} "
                     f"{r.count(PASSED):>4} {r.count(FAILED):>4} {r.count(NOT_ATTEMPTED):>4} "
                     f"{r.count(NOT_RUN):>5} {r.count(FLAGGED):>4} {r.seconds:>6.1f}  {name}")
    lines.append("score: points of the passed exercises / points of the lab; todo: not "
                 "attempted;")
    lines.append("norun: not run; * the notebook did not run to its end (see its note).")
    lines.append(f"notebook: its path under {folder or '.'}{os.sep}")
    out = ["\n".join(lines)]

    def wrapped(first: str, text: str) -> str:
        return textwrap.fill(_one_line(text), WIDTH, initial_indent=first,
                             subsequent_indent=" " * 6, break_long_words=True,
                             break_on_hyphens=False)

    blocks = []
    for r, name in zip(results, names):
        w = weights(r, overrides)
        earned, possible = score(r, overrides)
        found = []
        if r.detail:
            found.append(wrapped(f"  note ({r.run}): ", r.detail))
        for e in r.exercises:
            if e.result in (FAILED, NOT_RUN, FLAGGED):
                pts = _points(w[e.exercise])
                found.append(wrapped(f"  {e.exercise} {e.result} ({pts} pt): ", e.message))
        todo = [e.exercise for e in r.exercises if e.result == NOT_ATTEMPTED]
        if todo:
            found.append(wrapped("  not attempted: ", ", ".join(todo)))
        for f in r.flags:
            found.append(wrapped(f"  flag, {f['kind']}: ", f["message"]))
        if found:
            title = f"{name} ({r.lab or 'no lab'}, {_points(earned)} of " \
                    f"{_points(possible)} points)"
            blocks.append("\n".join([wrapped("", title), *found]))
    if blocks:
        out.append("Findings, one per offence (a flagged exercise earns no points):\n\n"
                   + "\n\n".join(blocks))
    return "\n\n".join(out) + "\n"


CSV_FIELDS = ["notebook", "run", "detail", "seconds", "lab", "score", "possible", "exercise",
              "result", "weight", "points", "message", "flags"]


def format_csv(results: list[NotebookResult], overrides: dict[str, float] | None = None) -> str:
    """One row per exercise (a notebook with none gets one row with an empty exercise), with
    the exercise's weight and the points it earned, and the notebook's score on every row."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in results:
        w = weights(r, overrides)
        earned, possible = score(r, overrides)
        base = {"notebook": r.notebook, "run": r.run, "detail": r.detail, "seconds": r.seconds,
                "lab": r.lab or "", "score": _points(earned), "possible": _points(possible),
                "flags": " | ".join(f"{f['kind']}: {f['message']}" for f in r.flags)}
        for e in r.exercises or [ExerciseResult("", "", "")]:
            weight = w.get(e.exercise)
            writer.writerow({**base, "exercise": e.exercise, "result": e.result,
                             "weight": "" if weight is None else _points(weight),
                             "points": "" if weight is None else
                             _points(weight if e.result == PASSED else 0),
                             "message": e.message})
    return buffer.getvalue()


def format_json(results: list[NotebookResult], overrides: dict[str, float] | None = None) -> str:
    notebooks = []
    for r in results:
        earned, possible = score(r, overrides)
        notebooks.append({**r.to_dict(), "score": earned, "possible": possible,
                          "weights": weights(r, overrides)})
    return json.dumps({"exit_status": exit_status(results), "notebooks": notebooks},
                      indent=2) + "\n"
