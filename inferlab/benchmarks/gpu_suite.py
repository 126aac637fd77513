"""Everything a GPU should run for the course, in one command, within nine and a half minutes.

    python -m inferlab.benchmarks.gpu_suite --out DIR                       # this GPU's profile
    python -m inferlab.benchmarks.gpu_suite --out DIR --profile small-gpu   # T4-class sizes
    python -m inferlab.benchmarks.gpu_suite --plan                          # print it, run nothing

Two kinds of part, each run as a subprocess with a wall-clock budget (a part that runs over is
killed and reported as timed out, so the whole suite stays under ``TOTAL_BUDGET_S``):

1. **Every solved lab** (``solutions/*.ipynb``), executed headless under the GPU profile through
   the grader (``inferlab.course.grade``): a fresh kernel driven by nbclient, every cell's error
   reported, and each exercise checked by the grader's own checks.
2. **Every GPU benchmark in ``BENCHMARKS``**, with the profile's sizes (``SIZES``), each writing
   its record to ``data/measurements/`` through ``inferlab.measurements.write_record`` (device,
   driver, torch, CUDA, date, git commit). A new benchmark joins the suite with one line there.

Then the labs' run is recorded as ``lab_times`` in ``data/measurements/`` too, and a summary of
every part goes to ``DIR/summary.json`` and ``DIR/summary.md`` (with the executed notebooks in
``DIR/executed/`` and each part's output in ``DIR/logs/``).

The profile is the GPU's own (``inferlab.device.choose_profile``), or ``--profile small-gpu`` to
run a T4's sizes on a larger GPU. The dtype comes from the device: bfloat16 where the GPU has it
natively (``torch.cuda.is_bf16_supported(including_emulation=False)``), else float16, and always
float16 for ``small-gpu`` (a T4 has no bfloat16).

Without CUDA nothing is measured: every part is reported as skipped, saying why, while the
plumbing is still checked (the plan for both GPU profiles, each benchmark's arguments parsed by
its own parser, each lab's notebook and check module found) and the summary is written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Nine and a half minutes, all told: one call of the device tool runs at most 600 s, and a
# session's 900 s of device time must also pay for the machine's start, so the suite is one call.
TOTAL_BUDGET_S = 570
SUITE_MARGIN_S = 30   # of those, kept for the suite itself: start-up, records, summary
GPU_PROFILES = ("large-gpu", "small-gpu")


@dataclass(frozen=True)
class Benchmark:
    """A module of ``inferlab.benchmarks`` the suite runs: its option that names the record's
    file, its budget in seconds, and its arguments, with ``{size}`` fields from ``SIZES``."""

    name: str
    out_flag: str
    budget_s: int
    args: str
    what: str


# One entry a benchmark.
BENCHMARKS = (
    Benchmark("decode_gpu", "--out", 90, "--model {decode_model} --dtype {dtype} --new-tokens 64 "
              "--min-run-time 0.5", "batch-1 decode against the bandwidth floor, CUDA graphs"),
    Benchmark("paged", "--json", 30, "--device cuda --dtype {dtype} --requests 300 --batch {batch} "
              "--context {context} --heads 32 --head-dim 128 --min-run-time 0.3",
              "the Triton paged kernel against contiguous attention"),
    Benchmark("batching", "--out", 55, "--profile {profile} --dtype {dtype} --model {serve_model} "
              "--requests {requests} --scale {scale}", "static against continuous batching; "
              "simulator error"),
)
# Not registered, for want of budget (the suite is one 600 s device call): Chapter 5's
# `python -m inferlab.benchmarks.quant --device cuda --model {decode_model} --dtype {dtype}
# --no-quality` (two compiled decode loops of the 7B-shaped model, 16-bit then int8).

# The sizes each GPU profile gives the benchmarks' arguments.
SIZES = {
    "large-gpu": dict(decode_model="llama-2-7b", batch=32, context=2048, serve_model="small",
                      requests=128, scale=0.5),
    "small-gpu": dict(decode_model="medium", batch=16, context=1024, serve_model="small",
                      requests=64, scale=0.25),
}

# Seconds each solved lab may take under a GPU profile (kernel start and the grader's checks
# included); a lab not listed gets the default.
# These are estimates (no lab has run on a GPU yet): a GPU does the labs' arithmetic in a blink,
# so what remains is the kernel's start, torch's CUDA start-up, and the work every lab does on
# the host (simulations, tables, plots). The first GPU run's summary gives the real times.
LAB_BUDGET_S = {"01_roofline": 35, "02_kv_cache": 35, "03_paged_attention": 30,
                "04_batching": 55, "05_quantization": 35, "07_prefill_decode": 35, "08_cost": 35}
# (Lab 10 took the default; four estimates gave 5 s each so that ten labs and the three
# benchmarks still fit one 600 s device call.)
DEFAULT_LAB_BUDGET_S = 35
_CHECKS_MARGIN_S = 15  # of a lab's budget, kept for kernel start-up and the grader's checks


@dataclass
class Part:
    """One thing the suite runs: what, how, within how long, and how it ended."""

    kind: str                    # "lab" or "benchmark"
    name: str
    budget_s: int
    command: list[str]
    record: str | None = None    # the data/measurements/ file it writes (benchmarks)
    status: str = "planned"      # passed, failed, timed out, skipped
    seconds: float = 0.0
    detail: str = ""
    results: dict = field(default_factory=dict)


def root() -> Path:
    return Path(__file__).resolve().parents[2]


def gpu_dtype(profile: str) -> str:
    """float16 for T4-class sizes and GPUs without native bfloat16; else bfloat16."""
    import torch

    if profile == "small-gpu" or not torch.cuda.is_available():
        return "float16" if profile == "small-gpu" else "bfloat16"
    return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float16"


def _own_gpu_profile() -> str:
    """This GPU's profile, whatever ``INFERLAB_PROFILE`` says (the suite's parts get the
    profile they run under from the suite)."""
    from inferlab.device import choose_profile

    saved = os.environ.pop("INFERLAB_PROFILE", None)
    try:
        return choose_profile("cuda").name
    finally:
        if saved is not None:
            os.environ["INFERLAB_PROFILE"] = saved


def plan(profile: str, dtype: str, out: Path, slug: str, date: str) -> list[Part]:
    """The labs and benchmarks to run under ``profile``, in order, with their commands."""
    from inferlab.course import catalog

    if profile not in SIZES:
        raise ValueError(f"the suite runs GPU profiles {GPU_PROFILES}, not {profile!r}")
    measurements = root() / "data" / "measurements"
    parts = []
    for lab in catalog.labs(root()):
        budget = LAB_BUDGET_S.get(lab.stem, DEFAULT_LAB_BUDGET_S)
        parts.append(Part("lab", lab.stem, budget, [
            sys.executable, "-m", "inferlab.course.grade", str(lab.solution), "--json", "--quiet",
            "--timeout", str(budget - _CHECKS_MARGIN_S), "--profile", profile, "--memory-gb", "0",
            "--executed-dir", str(out / "executed")]))
    for bench in BENCHMARKS:
        record = measurements / f"{bench.name}_{slug}_{date}_{profile}.json"
        args = bench.args.format(profile=profile, dtype=dtype, **SIZES[profile]).split()
        parts.append(Part("benchmark", bench.name, bench.budget_s,
                          [sys.executable, "-m", f"inferlab.benchmarks.{bench.name}", *args,
                           bench.out_flag, str(record)], str(record)))
    total = sum(p.budget_s for p in parts)
    if total > TOTAL_BUDGET_S - SUITE_MARGIN_S:
        raise ValueError(f"the parts' budgets add up to {total} s, over the suite's "
                         f"{TOTAL_BUDGET_S} s less {SUITE_MARGIN_S} s for itself: shrink a "
                         "budget or a size")
    return parts


class _Parsed(Exception):
    def __init__(self, namespace):
        self.namespace = namespace


def parse_only(module: str, argv: list[str]) -> dict:
    """The options ``python -m inferlab.benchmarks.<module> argv`` would run with, read by the
    module's own parser, without running it; ValueError if the parser rejects them."""
    mod = importlib.import_module(f"inferlab.benchmarks.{module}")
    original = argparse.ArgumentParser.parse_args

    def capture(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    argparse.ArgumentParser.parse_args = capture
    try:
        mod.main(list(argv))
    except _Parsed as parsed:
        return vars(parsed.namespace)
    except SystemExit as error:
        raise ValueError(f"inferlab.benchmarks.{module} rejects {' '.join(argv)} "
                         f"(exit {error.code})") from None
    finally:
        argparse.ArgumentParser.parse_args = original
    raise ValueError(f"inferlab.benchmarks.{module}.main() ran without parsing its arguments")


def check_plumbing(out: Path) -> list[str]:
    """What can be checked without a GPU; a line for each check that passed (raises if not)."""
    from inferlab.course import catalog

    done = []
    for profile in GPU_PROFILES:
        dtype = "float16" if profile == "small-gpu" else "bfloat16"
        parts = plan(profile, dtype, out, "gpu", "0000-00-00")
        for part in (p for p in parts if p.kind == "benchmark"):
            options = parse_only(part.name, part.command[3:])
            flag = next(b.out_flag for b in BENCHMARKS if b.name == part.name)
            dest = flag.lstrip("-").replace("-", "_")
            if str(options.get(dest)) != part.record:
                raise ValueError(f"{part.name}: {flag} does not name the record's file")
        budget = sum(p.budget_s for p in parts)
        done.append(f"{profile} ({dtype}): {len(parts)} parts planned within {budget} s of "
                    f"{TOTAL_BUDGET_S} s; every benchmark's arguments accepted by its parser")
    for lab in catalog.labs(root()):
        if not lab.solution.is_file() or not lab.check_module:
            raise ValueError(f"lab {lab.stem} has no solution or no check module")
    done.append(f"{len(catalog.labs(root()))} solved labs found, each with its check module")
    return done


def run_part(part: Part, env: dict, logs: Path) -> None:
    """Run one part within its budget, killing its whole process group if it runs over."""
    logs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    proc = subprocess.Popen(part.command, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=root())
    try:
        output, errors = proc.communicate(timeout=part.budget_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, errors = proc.communicate()
        timed_out = True
    part.seconds = round(time.monotonic() - start, 1)
    text = output.decode("utf-8", "replace")
    (logs / f"{part.kind}_{part.name}.log").write_text(
        text + "\n--- stderr ---\n" + errors.decode("utf-8", "replace"), encoding="utf-8")
    if timed_out:
        part.status, part.detail = "timed out", f"killed after its {part.budget_s} s budget"
    elif part.kind == "lab":
        _read_lab(part, text)
    else:
        _read_benchmark(part, proc.returncode, text)


def _read_lab(part: Part, text: str) -> None:
    try:
        [nb] = json.loads(text)["notebooks"]
    except (ValueError, KeyError):
        part.status, part.detail = "failed", "the grader printed no report: " + text[-300:]
        return
    errors = nb.get("cell_errors", [])
    passed = nb["counts"]["passed"]
    part.results = {"run": nb["run"], "notebook_s": nb["seconds"], "exercises": len(nb["exercises"]),
                    "passed": passed, "cell_errors": errors, "flags": nb.get("flags", [])}
    ok = nb["run"] == "completed" and not errors and passed == len(nb["exercises"])
    part.status = "passed" if ok else "failed"
    if not ok:
        first = errors[0] if errors else None
        part.detail = (f"{nb['run']}; {passed}/{len(nb['exercises'])} exercises passed"
                       + (f"; cell {first['cell']} raised {first['ename']}: "
                          f"{first['evalue'].splitlines()[0] if first['evalue'] else ''}"
                          if first else "") + (f"; {nb['detail']}" if nb.get("detail") else ""))


_HEADLINES = ("best_tokens_per_s", "best_utilisation_of_measured_bandwidth",
              "best_utilisation_of_datasheet_bandwidth", "throughput_ratio", "preemptions")


def _read_benchmark(part: Part, returncode: int, text: str) -> None:
    record = Path(part.record)
    if returncode != 0 or not record.is_file():
        last = text.strip().splitlines()[-1:] or [""]
        part.status = "failed"
        part.detail = f"exit status {returncode}" + ("" if record.is_file() else
                                                      ", no record written") + f": {last[0][:200]}"
        return
    data = json.loads(record.read_text(encoding="utf-8"))
    part.results = {k: data[k] for k in _HEADLINES if k in data}
    if part.name == "paged":
        part.results.update({f"{k}_vs_contiguous": v["vs_contiguous"]
                             for k, v in data.get("kernels", {}).items()})
    if data.get("errors"):
        part.detail = "; ".join(f"{k}: {v}" for k, v in data["errors"].items())[:300]
    part.status = "passed"


def write_summary(out: Path, header: dict, parts: list[Part]) -> tuple[Path, Path]:
    """``summary.json`` and ``summary.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    data = {**header, "parts": [asdict(p) for p in parts]}
    (out / "summary.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    lines = [f"# GPU suite: {header['device']}", "",
             f"Profile `{header['profile']}`, {header['dtype']}; torch {header['torch']}, "
             f"CUDA {header['cuda']}, driver {header['driver']}; commit "
             f"{(header['git_commit'] or '?')[:10]}; {header['date']}. "
             f"{header['seconds']:.0f} s of a {TOTAL_BUDGET_S} s budget.", ""]
    if header.get("checked"):
        lines += ["Checked without a GPU:", ""] + [f"- {c}" for c in header["checked"]] + [""]
    lines += ["| part | status | seconds | budget | results |", "|---|---|---|---|---|"]
    for p in parts:
        results = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in p.results.items() if not isinstance(v, (list, dict)))
        note = f"{results}{'; ' if results and p.detail else ''}{p.detail}".replace("|", "/")
        lines.append(f"| {p.kind} {p.name} | {p.status} | {p.seconds:.1f} | {p.budget_s} | "
                     f"{note} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out / "summary.json", out / "summary.md"


def record_labs(parts: list[Part], profile: str, info, date: str, slug: str,
                folder: Path | None = None) -> Path | None:
    """The labs' run as a ``lab_times`` record (the instructor guide reads it) in ``folder``
    (default ``data/measurements/``), through ``write_record``; None when no lab ran."""
    from inferlab.measurements import write_record

    labs = [p for p in parts if p.kind == "lab" and p.status != "skipped"]
    if not labs:
        return None
    rows = [{"notebook": f"solutions/{p.name}.ipynb", "wall_s": p.seconds, "cpu_s": None,
             "run": p.results.get("run", p.status), "exercises": p.results.get("exercises", 0),
             "passed": p.results.get("passed", 0), "wall_s_all": [p.seconds],
             "cell_errors": len(p.results.get("cell_errors", []))} for p in labs]
    record = {"benchmark": "lab_times", "profile": profile, "repeat": 1,
              "command": f"python -m inferlab.benchmarks.gpu_suite --profile {profile}",
              "cores": os.cpu_count(), "results": rows}
    folder = folder or root() / "data" / "measurements"
    return write_record(record, info, folder / f"lab_times_{slug}_{date}_{profile}.json")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.gpu_suite",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for summary.json, summary.md, executed notebooks and logs")
    parser.add_argument("--profile", choices=GPU_PROFILES, default=None,
                        help="GPU profile (default: this GPU's own)")
    parser.add_argument("--plan", action="store_true", help="print the plan and run nothing")
    args = parser.parse_args(argv)
    if args.out is None and not args.plan:
        parser.error("--out DIR is required (or --plan)")

    import torch

    from inferlab.analysis.hardware import detect_device
    from inferlab.measurements import driver_version, git_commit

    start = time.monotonic()
    out = (args.out or Path("gpu-suite")).resolve()
    cuda = torch.cuda.is_available()
    profile = args.profile or (_own_gpu_profile() if cuda else "large-gpu")
    dtype = gpu_dtype(profile)
    info = detect_device("cuda" if cuda else "cpu")
    slug = "".join(c if c.isalnum() else "-" for c in info.name.lower()).strip("-")
    date = dt.date.today().isoformat()
    parts = plan(profile, dtype, out, slug, date)
    if args.plan:
        for p in parts:
            print(f"{p.kind:9s} {p.name:20s} {p.budget_s:4d} s  {' '.join(p.command[1:])}")
        print(f"total budget {sum(p.budget_s for p in parts)} s of {TOTAL_BUDGET_S} s")
        return 0

    header = {"device": info.name, "profile": profile, "dtype": dtype, "torch": torch.__version__,
              "cuda": torch.version.cuda, "driver": driver_version(), "git_commit": git_commit(),
              "date": date, "checked": []}
    if not cuda:
        print("no CUDA GPU here (torch.cuda.is_available() is False): every lab and benchmark "
              "is skipped; checking the suite's plumbing instead")
        header["checked"] = check_plumbing(out)
        for p in parts:
            p.status, p.detail = "skipped", "needs a CUDA GPU; none here"
        for line in header["checked"]:
            print(f"  checked: {line}")
    else:
        env = {**os.environ, "INFERLAB_PROFILE": profile,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(root()),
                                                           os.environ.get("PYTHONPATH")]))}
        for p in parts:
            print(f"{p.kind} {p.name} (budget {p.budget_s} s) ...", flush=True)
            run_part(p, env, out / "logs")
            print(f"  {p.status} in {p.seconds:.1f} s {p.detail}", flush=True)
        lab_record = record_labs(parts, profile, info, date, slug)
        if lab_record:
            print(f"wrote {lab_record}")
    header["seconds"] = round(time.monotonic() - start, 1)
    for path in write_summary(out, header, parts):
        print(f"wrote {path}")
    for p in parts:
        print(f"  {p.kind:9s} {p.name:20s} {p.status:9s} {p.detail}")
    return 0 if all(p.status in ("passed", "skipped") for p in parts) else 1


if __name__ == "__main__":
    sys.exit(main())
