"""Timing built on ``torch.utils.benchmark``, robust to a machine that other programs share.

``torch.utils.benchmark.Timer`` synchronises CUDA around each measurement, warms up, and picks
the number of repetitions itself, so the course never hand-rolls a timer. Around it this module
adds what a shared laptop or CI machine needs:

- **threads chosen and stated.** ``Timer`` runs on ONE thread unless told otherwise. Every
  ``Timing`` records the thread count it ran with. ``choose_threads()`` counts the cores other
  programs leave idle right now (Linux: ``/proc/stat`` over a tenth of a second): a CPU kernel
  split over more threads than there are free cores waits for its slowest thread at every
  step, and its times fall apart, so a lab chooses once and times everything with that many.
- **repeats, with the minimum and the median.** ``blocked_autorange`` measures many blocks of
  calls; ``Timing`` keeps the median (the typical cost) and the minimum (the best the machine
  did: use it for a ceiling such as a roofline), and ``compare()`` times candidates interleaved,
  A B A B, so that a slow minute hurts all of them alike.
- **a warning when the spread says the machine is busy.** When the interquartile range of the
  blocks exceeds 10% of the median (``torch.utils.benchmark`` warns at the same ratio),
  ``warn_if_busy`` prints one line saying so.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.utils.benchmark as benchmark

BUSY_SPREAD = 0.10  # IQR / median above which a timing is called noisy


@dataclass(frozen=True)
class Timing:
    """How long one call took: median and minimum over measured blocks, their interquartile
    range, the number of blocks and the threads they ran on."""

    median_s: float
    iqr_s: float
    runs: int
    label: str = ""
    min_s: float = float("nan")
    threads: int = 0

    @property
    def spread(self) -> float:
        """Interquartile range over median: 0.02 on a quiet machine, 0.3 on a busy one."""
        return self.iqr_s / self.median_s if self.median_s > 0 else float("inf")

    @property
    def busy(self) -> bool:
        return self.spread > BUSY_SPREAD

    def __str__(self) -> str:
        return (f"{self.label + ': ' if self.label else ''}{self.median_s * 1e3:.3f} ms median "
                f"of {self.runs} runs (min {self.min_s * 1e3:.3f} ms, IQR {self.spread:.0%}), "
                f"{self.threads} thread{'s' if self.threads != 1 else ''}")


def _cpu_times(cpus: set[int]) -> tuple[float, float] | None:
    """(busy, total) jiffies of ``cpus`` from /proc/stat; None where there is no /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = [ln.split() for ln in f if ln.startswith("cpu") and ln[3].isdigit()]
    except OSError:
        return None
    busy = total = 0.0
    for fields in lines:
        if int(fields[0][3:]) in cpus:
            values = [float(v) for v in fields[1:9]]
            idle = values[3] + values[4]  # idle and iowait
            total += sum(values)
            busy += sum(values) - idle
    return (busy, total) if total else None


def usable_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def idle_cores(window_s: float = 0.1) -> float:
    """How many of this process's cores other programs left idle over ``window_s`` seconds
    (all of them where the system does not say)."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        return float(usable_cores())
    before = _cpu_times(cpus)
    time.sleep(window_s)
    after = _cpu_times(cpus)
    if before is None or after is None or after[1] <= before[1]:
        return float(len(cpus))
    busy_share = (after[0] - before[0]) / (after[1] - before[1])
    return len(cpus) * (1.0 - busy_share)


def choose_threads(device: str = "cpu") -> int:
    """The thread count to time with: the idle cores, rounded down, at least one, at most
    torch's own setting. On a GPU the host threads hardly matter; torch's setting is kept."""
    if device != "cpu":
        return torch.get_num_threads()
    return max(1, min(torch.get_num_threads(), int(idle_cores() + 0.25)))


def threads_note(threads: int) -> str:
    """A sentence for the output: how many threads the timings use, and why."""
    cores = usable_cores()
    if threads >= cores:
        return f"timing with {threads} thread{'s' if threads != 1 else ''}, one per core"
    return (f"timing with {threads} of {cores} cores: other programs are busy on the rest, and "
            "a kernel split over busy cores waits for its slowest thread")


def time_fn(fn: Callable[[], object], *, min_run_time: float = 0.2, label: str = "",
            num_threads: int | None = None, warn: bool = False) -> Timing:
    """Time ``fn()`` (no arguments) over repeated blocks; median and minimum in seconds.

    ``min_run_time`` is how long to keep measuring, in seconds. ``num_threads`` defaults to
    ``torch.get_num_threads()`` (``Timer`` alone would use one thread); ``warn`` prints a line
    when the spread says the machine is busy.
    """
    if min_run_time <= 0:
        raise ValueError(f"min_run_time must be positive seconds, got {min_run_time}")
    if not callable(fn):
        raise TypeError(f"time_fn takes a function of no arguments, got {type(fn).__name__}")
    threads = num_threads or torch.get_num_threads()
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads, label=label)
    fn()  # one call outside the measurement, so lazy initialisation is not timed
    m = timer.blocked_autorange(min_run_time=min_run_time)
    timing = Timing(median_s=m.median, iqr_s=m.iqr, runs=len(m.times), label=label,
                    min_s=min(m.times), threads=threads)
    if warn:
        warn_if_busy([timing])
    return timing


def warn_if_busy(timings: Iterable[Timing], what: str = "these timings") -> bool:
    """Print one warning if any timing's spread says the machine was busy; True if it did."""
    noisy = [t for t in timings if t.busy]
    if noisy:
        worst = max(noisy, key=lambda t: t.spread)
        name = f" ({worst.label})" if worst.label else ""
        print(f"warning: {what} varied by up to {worst.spread:.0%} between runs{name} (the "
              "interquartile range over the median): something else is using this machine. "
              "The numbers shown are medians, and minimums where a ceiling is measured; for "
              "cleaner ones close other programs and run the cell again.")
    return bool(noisy)


def compare(fns: dict[str, Callable[[], object]], *, rounds: int = 3, min_run_time: float = 0.2,
            num_threads: int | None = None) -> dict[str, Timing]:
    """Time several candidates interleaved (A B C, A B C, ...) for ``rounds`` rounds.

    Each candidate's result is its round with the lowest median, so a burst of load that hits
    one round hits every candidate in it, and a ratio between candidates survives a busy
    machine better than one measured A A A, B B B.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    per_round = max(min_run_time / rounds, 0.01)
    best: dict[str, Timing] = {}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time_fn(fn, min_run_time=per_round, label=name, num_threads=num_threads)
            if name not in best or t.median_s < best[name].median_s:
                best[name] = t
    return best
