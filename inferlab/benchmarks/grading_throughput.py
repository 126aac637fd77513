"""How fast the grader gets through a class: notebooks graded per minute, as an instructor runs it.

    python -m inferlab.benchmarks.grading_throughput --jobs 2            # one solved copy of each lab
    python -m inferlab.benchmarks.grading_throughput --jobs 1 --copies 2

A class's submissions are stood in for by copies of every solved lab (``solutions/*.ipynb``,
``--copies`` of each, in a temporary folder), graded in one call of
``inferlab.course.grade.grade`` with the CPU profile, as ``python -m inferlab.course.grade
--profile cpu --jobs N`` grades them. The record keeps the wall-clock and CPU seconds of the whole
call (the CPU time of every worker and kernel), each notebook's own seconds and verdict, the
machine's cores and its load average before and after, because on a shared machine the wall
clock says as much about the other work as about the grader; notebooks per minute is the count
over the wall clock. The record goes to ``data/measurements/grading_throughput_<device>_<date>.json``,
which the instructor guide reads.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from inferlab.data import data_path
from inferlab.measurements import write_record


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(notebooks: list[Path], jobs: int, copies: int = 1, timeout: float = 600) -> dict:
    """Grade ``copies`` of each notebook in one call with ``jobs`` at once; the timings."""
    from inferlab.course.grade import grade
    from inferlab.course.results import PASSED

    with tempfile.TemporaryDirectory(prefix="inferlab-class-") as tmp:
        class_ = []
        for i in range(copies):
            for path in notebooks:
                class_.append(Path(tmp) / f"{i + 1:02d}_{path.name}")
                shutil.copy(path, class_[-1])
        load_before, cpu_before = os.getloadavg(), _children_cpu_s()
        start = time.monotonic()
        results = grade(class_, timeout=timeout, jobs=jobs, profile="cpu")
        wall = time.monotonic() - start
        cpu = _children_cpu_s() - cpu_before
    return {"notebooks": len(class_), "jobs": jobs, "copies": copies, "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "notebooks_per_minute": round(60 * len(class_) / wall, 2),
            "cpu_s_per_notebook": round(cpu / len(class_), 1), "cores": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "all_passed": all(e.result == PASSED for r in results for e in r.exercises),
            "results": [{"notebook": Path(r.notebook).name, "seconds": r.seconds, "run": r.run,
                         "passed": r.count(PASSED), "exercises": len(r.exercises)}
                        for r in results]}


def main(argv=None) -> int:
    from inferlab.analysis.hardware import detect_device

    root = data_path("hardware.csv").parent.parent
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.grading_throughput",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="notebooks graded at once (default 2)")
    parser.add_argument("--copies", type=int, default=1,
                        help="copies of each solved lab in the class (default 1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds each may take")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.copies < 1:
        parser.error("--jobs and --copies must be at least 1")
    notebooks = sorted((root / "solutions").glob("*.ipynb"))
    row = measure(notebooks, args.jobs, args.copies, args.timeout)
    print(f"{row['notebooks']} notebooks in {row['wall_s']} s at --jobs {row['jobs']}: "
          f"{row['notebooks_per_minute']} per minute; {row['cpu_s_per_notebook']} CPU s each; "
          f"load average {row['load_average_before'][0]} -> {row['load_average_after'][0]} "
          f"on {row['cores']} cores")
    record = {"benchmark": "grading_throughput",
              "command": " ".join(["python -m inferlab.benchmarks.grading_throughput",
                                   *(argv if argv is not None else sys.argv[1:])]),
              "profile": "cpu", **row}
    out = write_record(record, detect_device("cpu"), args.out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
