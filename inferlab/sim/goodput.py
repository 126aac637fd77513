"""Goodput in a steady state: the highest arrival rate at which a server keeps its SLO.

DistServe (Zhong et al., OSDI 2024) scores a serving system by its *goodput*: the highest
request rate at which a share (90% in its evaluation) of the requests meet both a TTFT and a
TPOT bound, divided by the GPUs used, so that designs of different sizes compare at equal cost.
``goodput_rate`` finds that rate by bisection, simulating the system at each rate it tries.

A simulated server starts empty, so the first requests of a trace meet no queue, and a trace
that is short next to a request's lifetime ends before the queues settle: both flatter a server
that is in fact overloaded. Two helpers guard against that: ``steady_summary`` leaves the first
``warmup`` share of the arrivals out of the metrics, and ``achieved_rate`` reports the load the
server actually carried while requests kept arriving, which equals the offered rate only when
it keeps up. A result is a steady-state one once it no longer changes as the trace grows
longer, which Chapter 7 checks. (These helpers are Chapter 7's own; the course's steady-state
machinery for throughput at an SLO may replace them.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from inferlab.serving.loop import Run
from inferlab.serving.metrics import SLO, RequestTiming, Summary, summarize
from inferlab.serving.request import Request


def _window(run: Run, warmup: float) -> tuple[list[RequestTiming], float, float]:
    timings = [r.timing for r in run.results if r.ok]
    first = min(t.arrival_s for t in timings)
    last = max(t.arrival_s for t in timings)
    return timings, first + warmup * (last - first), last


def steady_summary(run: Run, slo: SLO | None = None, warmup: float = 0.1) -> Summary:
    """``run``'s metrics over the requests that arrived after the first ``warmup`` share of the
    arrival span (the cluster started empty; those requests met no queue)."""
    timings, start, _ = _window(run, warmup)
    return summarize([t for t in timings if t.arrival_s >= start], slo)


def achieved_rate(run: Run, warmup: float = 0.1) -> float:
    """Requests finished per second from the end of the warm-up to the last arrival: the load
    the cluster carried while requests kept arriving (the offered rate, in a steady state)."""
    timings, start, end = _window(run, warmup)
    if end <= start:
        return math.nan
    return sum(start <= t.token_times_s[-1] <= end for t in timings) / (end - start)


@dataclass(frozen=True)
class Goodput:
    """The highest rate found at which ``attainment`` of the requests met the SLO."""

    name: str
    gpus: int
    rate: float                # offered: requests per second, the whole cluster
    attainment: float          # at that rate, after the warm-up (``steady_summary``)
    achieved: float            # ``achieved_rate`` at that rate: close to the offered rate
                               # when the cluster keeps up and the trace is long enough

    @property
    def per_gpu(self) -> float:
        return self.rate / self.gpus


def goodput_rate(make_requests: Callable[[float], list[Request]],
                 serve: Callable[[list[Request]], Run], slo: SLO, gpus: int = 1,
                 name: str = "", target: float = 0.9, start: float = 1.0,
                 rel_tol: float = 0.05, max_probes: int = 16, warmup: float = 0.1,
                 step: float = 2.0) -> Goodput:
    """Bisect the arrival rate for the highest at which ``target`` of the requests (after the
    warm-up) meet ``slo``; ``make_requests(rate)`` gives the trace at a rate, long enough to
    reach a steady state (``inferlab.sim.workloads.stream``), and ``serve(requests)`` runs it
    (a simulation of ``gpus`` GPUs, e.g. ``inferlab.sim.disaggregation.simulate_cluster``).

    The rate starts at ``start`` and is multiplied (or divided) by ``step`` until it brackets
    the answer (a known answer makes a good start and a small step), then the bracket is halved
    until it is within ``rel_tol``. Zero if even the lowest rate misses.
    """
    def attain(rate: float) -> tuple[float, float]:
        run = serve(make_requests(rate))
        return steady_summary(run, slo, warmup).slo_attainment, achieved_rate(run, warmup)

    probes, lo, hi, best = 0, 0.0, math.inf, (0.0, math.nan, math.nan)
    rate = start
    while probes < max_probes:
        a, achieved = attain(rate)
        probes += 1
        if a >= target:
            lo, best = rate, (rate, a, achieved)
        else:
            hi = rate
        if hi < math.inf and (hi - lo) <= rel_tol * hi:
            break
        if hi == math.inf:
            rate *= step
        elif lo == 0.0:
            if rate < start / 64:
                break
            rate /= step
        else:
            rate = (lo + hi) / 2
    return Goodput(name, gpus, *best)


def attainment_curve(timings: list[RequestTiming], ttft_s: float,
                     tpot_bounds: list[float]) -> list[float]:
    """For each TPOT bound, the share of ``timings`` that meet it and the TTFT bound ``ttft_s``
    (``SLO.met_by``; a one-token answer has no TPOT to miss). One run gives the whole curve."""
    return [sum(SLO(ttft_s, b).met_by(t) for t in timings) / len(timings) for b in tpot_bounds]
