"""How long each lab takes: run every solved lab headless, one at a time, and record the times.

    python -m inferlab.benchmarks.lab_times                       # solutions/*.ipynb
    python -m inferlab.benchmarks.lab_times solutions/02_kv_cache.ipynb --out times.json

Each notebook goes through the grader (``inferlab.course.grade``), so it runs exactly as a submission
would: a fresh kernel, a fresh working directory, the device's own profile unless
``INFERLAB_PROFILE`` says otherwise. For each one the record keeps the wall-clock seconds (kernel
start-up included) and the CPU seconds the notebook's worker and kernel used, and around the
whole run the machine's load average, because wall-clock times on a shared machine are noisy.
With ``--repeat N`` every notebook runs N times and the fastest run is the one reported (all
are kept): on a busy machine the fastest is the best estimate of the notebook's own cost.
The record goes to ``data/measurements/lab_times_<device>_<date>.json``; the instructor guide
and the status page read it from there.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
from pathlib import Path

from inferlab.data import data_path
from inferlab.measurements import write_record


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_labs(notebooks: list[Path], timeout: float = 900, repeat: int = 1) -> list[dict]:
    """One row per notebook: wall and CPU seconds of its fastest run, how the run ended, the
    exercises passed, and every run's wall-clock time."""
    from inferlab.course.grade import grade
    from inferlab.course.results import PASSED

    rows = []
    for path in notebooks:
        runs = []
        for _ in range(repeat):
            before = _children_cpu_s()
            [result] = grade([path], timeout=timeout)
            runs.append((result.seconds, round(_children_cpu_s() - before, 1), result))
        wall, cpu, result = min(runs, key=lambda r: r[0])
        rows.append({"notebook": path.as_posix(), "wall_s": wall, "cpu_s": cpu, "run": result.run,
                     "exercises": len(result.exercises), "passed": result.count(PASSED),
                     "wall_s_all": [r[0] for r in runs]})
        print(f"{path}: {wall:.1f} s wall, {cpu:.1f} s CPU (fastest of {repeat}), {result.run}, "
              f"{rows[-1]['passed']}/{rows[-1]['exercises']} passed", flush=True)
    return rows


def main(argv=None) -> int:
    from inferlab.device import choose_profile
    from inferlab.analysis.hardware import detect_device

    root = data_path("hardware.csv").parent.parent
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.lab_times",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to time (default: every solutions/*.ipynb)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds each may take")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs of each notebook; the fastest is reported (default 2)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON file to write (default: data/measurements/lab_times_<device>_<date>.json)")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((root / "solutions").glob("*.ipynb"))
    if not notebooks:
        parser.error("no notebooks to time")
    profile = choose_profile()
    info = detect_device(profile.device)
    load_before = os.getloadavg()
    rows = time_labs([Path(os.path.relpath(p, Path.cwd())) if p.is_absolute() else p
                      for p in notebooks], args.timeout, args.repeat)
    record = {"benchmark": "lab_times",
              "command": " ".join(["python -m inferlab.benchmarks.lab_times",
                                   *(argv if argv is not None else sys.argv[1:])]),
              "profile": profile.name, "cores": os.cpu_count(), "machine": platform.machine(),
              "repeat": args.repeat,
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "results": rows}
    out = write_record(record, info, args.out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
