"""Which installed distributions each lab imports while it runs, measured by running it.

    python -m inferlab.course.imports --write    # solutions/*.ipynb -> tests/lab_imports.json
    python -m inferlab.course.imports solutions/09_serving.ipynb    # print one lab's set

Each notebook is executed from top to bottom in a fresh kernel (nbclient, the ``cpu`` profile, a
fresh working directory), and then one more cell asks the kernel which modules it has loaded:
every top-level module in ``sys.modules`` is mapped to the distribution that installed it
(``importlib.metadata.packages_distributions``). A kernel that has run nothing is asked the same,
and what it already holds (ipykernel, ZeroMQ, the standard library) is left out, so a lab's set
is what the lab itself brought in: its own imports, the package's, and whatever those import in
turn, including the ones a function imports only when it is called. The course package itself
is left out too (the learner installs it by name), and so is a module loaded from a package's
``_vendor`` folder (setuptools puts its own copies of jaraco and more-itertools on the path):
it comes with that package, not as a distribution of its own.

The record says, for each lab, the distributions and their top-level modules, and how long the
run took. ``tests/test_learner_setup.py`` reads it: each distribution must be one the learner's
install requires (or one the code imports only where it is installed, a list the test keeps);
in the learner's fresh install it imports every such module, and runs the cheapest lab of each
distinct set to its end, so a lab that needs something the learner's install lacks fails there
without CI running all ten. Regenerate the record after adding a lab or an import to one (it is
made in the development environment, so it also names what is imported only when present).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from inferlab.course.catalog import ROOT

RECORD = ROOT / "tests" / "lab_imports.json"  # read by tests/test_learner_setup.py
MARK = "inferlab_imports.json"  # the probe's answer, in the kernel's working directory
PROBE = f"""\
import importlib.metadata as _md, json as _json, sys as _sys
_where = _md.packages_distributions()
_seen = {{}}
for _name in sorted({{_m.split(".")[0] for _m in list(_sys.modules)}}):
    _mod = _sys.modules.get(_name)
    _file = getattr(_mod, "__file__", None) or next(iter(getattr(_mod, "__path__", [])), "")
    if "_vendor" in str(_file).replace(chr(92), "/").split("/"):
        continue   # a copy another package vendors (setuptools' jaraco): that package is counted
    for _dist in _where.get(_name, []):
        try:
            _dist = _md.distribution(_dist).metadata["Name"]
        except _md.PackageNotFoundError:
            pass
        _seen.setdefault(_dist.lower().replace("_", "-"), []).append(_name)
with open({MARK!r}, "w") as _f:   # a file: the course's style rewraps what a lab prints
    _json.dump(_seen, _f)
"""


def _execute(cells: list, timeout: float) -> tuple[dict[str, list[str]], float]:
    """Run ``cells`` and then the probe in a fresh kernel; the distributions it has loaded
    (name -> top-level modules) and the seconds the run took."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells) + [nbformat.v4.new_code_cell(PROBE)]
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="inferlab-imports-") as cwd:
        os.environ.setdefault("INFERLAB_PROFILE", "cpu")
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": cwd}}).execute()
        seen = json.loads((Path(cwd) / MARK).read_text(encoding="utf-8"))
    return seen, round(time.monotonic() - start, 1)


def lab_imports(notebook: Path, baseline: dict[str, list[str]], timeout: float = 1800) -> dict:
    """One lab's distributions beyond the kernel's ``baseline`` (each with its top-level
    modules), and the seconds its run took."""
    import nbformat

    cells = nbformat.read(notebook, as_version=4).cells
    seen, seconds = _execute(cells, timeout)
    dists = {d: sorted(m) for d, m in seen.items() if d not in baseline and d != "inferlab"}
    return {"distributions": dict(sorted(dists.items())), "seconds": seconds}


def measure(notebooks: list[Path], timeout: float = 1800, jobs: int = 1) -> dict:
    """The record: the bare kernel's distributions, and each notebook's beyond them (``jobs``
    notebooks at once, each in its own process and kernel)."""
    from concurrent.futures import ProcessPoolExecutor

    import torch

    baseline, _ = _execute([], timeout)
    labs = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        runs = {path: pool.submit(lab_imports, path, baseline, timeout) for path in notebooks}
        for path, run in runs.items():
            labs[path.relative_to(ROOT).as_posix()] = row = run.result()
            print(f"{path.name}: {', '.join(row['distributions'])} ({row['seconds']} s)",
                  flush=True)
    return {"command": "python -m inferlab.course.imports --write"
                       + (f" --jobs {jobs}" if jobs > 1 else ""), "jobs": jobs,
            "date": dt.date.today().isoformat(), "python": sys.version.split()[0],
            "torch": torch.__version__, "profile": os.environ.get("INFERLAB_PROFILE", "cpu"),
            "load_average_before": None, "baseline": sorted(baseline), "labs": labs}


def load(path: Path = RECORD) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def covering_labs(record: dict, leave_out=frozenset()) -> list[str]:
    """The cheapest labs (by their recorded seconds) that together import every distribution
    any lab imported; ``leave_out``: distributions not counted (those a lab imports only where
    installed, which an install without them does not see). Fewest labs first among equally
    cheap choices, then the earlier labs; found by trying every subset (ten labs: 1,023)."""
    labs = sorted(record["labs"])
    wanted = {lab: frozenset(record["labs"][lab]["distributions"]) - frozenset(leave_out)
              for lab in labs}
    everything = frozenset().union(*wanted.values())
    best = None
    for r in range(1, len(labs) + 1):
        for choice in itertools.combinations(labs, r):
            if frozenset().union(*(wanted[lab] for lab in choice)) != everything:
                continue
            cost = sum(record["labs"][lab]["seconds"] for lab in choice)
            if best is None or cost < best[0]:
                best = (cost, list(choice))
    return best[1] if best else []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.course.imports",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: every solutions/*.ipynb)")
    parser.add_argument("--write", action="store_true",
                        help=f"write the record to {RECORD.relative_to(ROOT)} (default: print it)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="notebooks run at once (default 1; their seconds then overlap)")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds a cell may take (default 1800)")
    args = parser.parse_args(argv)
    notebooks = ([p.resolve() for p in args.notebooks]
                 or sorted((ROOT / "solutions").glob("*.ipynb")))
    load_before = [round(x, 2) for x in os.getloadavg()]
    record = measure(notebooks, args.timeout, args.jobs)
    record["load_average_before"] = load_before
    text = json.dumps(record, indent=1) + "\n"
    if args.write:
        RECORD.write_text(text, encoding="utf-8")
        print(f"wrote {RECORD.relative_to(ROOT)}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
