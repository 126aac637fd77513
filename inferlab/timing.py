"""Timing built on ``torch.utils.benchmark``.

``torch.utils.benchmark.Timer`` synchronises CUDA around each measurement, warms up, and picks
the number of repetitions itself, so the course never hand-rolls a timer. Two things it does
that surprise people are handled here: it runs on ONE thread unless told otherwise (we pass the
thread count torch is using), and it reports a mean per block, so we keep the median of blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.utils.benchmark as benchmark


@dataclass(frozen=True)
class Timing:
    """How long one call took: the median over measured blocks, and their interquartile range."""

    median_s: float
    iqr_s: float
    runs: int
    label: str = ""

    def __str__(self) -> str:
        return f"{self.label + ': ' if self.label else ''}{self.median_s * 1e3:.3f} ms " \
               f"(IQR {self.iqr_s * 1e3:.3f} ms, {self.runs} runs)"


def time_fn(fn: Callable[[], object], *, min_run_time: float = 0.2, label: str = "",
            num_threads: int | None = None) -> Timing:
    """Time ``fn()`` (no arguments) and return its median run time in seconds.

    ``min_run_time`` is how long to keep measuring, in seconds. ``num_threads`` defaults to
    ``torch.get_num_threads()`` (``Timer`` alone would use one thread).
    """
    if min_run_time <= 0:
        raise ValueError(f"min_run_time must be positive seconds, got {min_run_time}")
    if not callable(fn):
        raise TypeError(f"time_fn takes a function of no arguments, got {type(fn).__name__}")
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn},
                            num_threads=num_threads or torch.get_num_threads(), label=label)
    fn()  # one call outside the measurement, so lazy initialisation is not timed
    m = timer.blocked_autorange(min_run_time=min_run_time)
    return Timing(median_s=m.median, iqr_s=m.iqr, runs=len(m.times), label=label)
