"""How prefills interfere with decodes, measured: stalls, the TPOT tail and TTFT, by chunk size.

A colocated engine runs a newly admitted prompt's prefill in the same iteration as everyone
else's decode step, so each running request waits for it: the gap between two of its tokens
jumps from one decode step to a whole prefill (a *generation stall*). Chunked prefill
(Sarathi-Serve, Agrawal et al. 2024) bounds that gap by a token budget per step, and pays for it
in the long prompt's own TTFT, which now spans several steps. This module turns runs of a mixed
trace (``inferlab.sim.workloads.mixed_requests``) into those numbers:

- ``interference``: one run's largest generation stall (``inferlab.serving.metrics.largest_gap``
  over every request), TPOT percentiles, throughput, and the long prompts' TTFT;
- ``chunk_sweep``: the same trace served without chunking and at several token budgets,
  repeated in interleaved order (A, B, A, B: a machine whose load drifts affects every
  configuration alike) and reduced to each configuration's median;
- ``simulator_error``: the discrete-event simulator's prediction of the same runs, with step
  costs fitted to another trace's runs (``FittedCosts.from_iterations``), against the measured
  throughput and TPOT.

Chapter 7, Lab 7 and ``python -m inferlab.benchmarks.prefill_decode`` use them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, fields, replace
from typing import Callable

from inferlab.serving.config import ServingConfig
from inferlab.serving.run import Run
from inferlab.serving.metrics import largest_gap, percentile
from inferlab.serving.request import Request


@dataclass(frozen=True)
class Interference:
    """One run of a mixed trace in numbers (seconds, and tokens per second)."""

    label: str                 # "whole prompts", or "budget 64"
    token_budget: int | None
    throughput: float          # output tokens per second
    stall_s: float             # the largest gap between two consecutive tokens of any request
    tpot_p50_s: float
    tpot_p99_s: float
    tpot_mean_s: float
    long_ttft_s: float         # mean TTFT of the long prompts
    steps: int                 # forward passes the engine ran

    def row(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def label(config: ServingConfig) -> str:
    return "whole prompts" if config.token_budget is None else f"budget {config.token_budget}"


def interference(run: Run, is_long: Callable[[object], bool] | None = None) -> Interference:
    """The numbers of one run; ``is_long(request_id)`` says which requests are the long prompts
    (default: ids that start with "long", as ``mixed_requests`` names them)."""
    is_long = is_long or (lambda rid: str(rid).startswith("long"))
    timings = [r.timing for r in run.results if r.ok]
    tpots = [t.tpot for t in timings]
    longs = [r.timing.ttft for r in run.results if r.ok and is_long(r.request_id)]
    steps = sum(len(it.forwards) for it in run.iterations)
    config = run.config
    return Interference(
        label(config), config.token_budget, run.summary().throughput,
        max(largest_gap(t.token_times_s) for t in timings if t.n_tokens > 1),
        percentile(tpots, 50), percentile(tpots, 99),
        statistics.fmean(x for x in tpots if x == x),
        statistics.fmean(longs) if longs else float("nan"), steps)


def chunk_sweep(serve: Callable[[list[Request], ServingConfig], Run], requests: list[Request],
                config: ServingConfig, budgets: tuple[int, ...], repeats: int = 3,
                on_run: Callable[[Run], None] | None = None) -> list[Interference]:
    """Serve ``requests`` without chunking and at each budget in ``budgets``, ``repeats``
    times in interleaved order; each configuration's median of every number.

    ``serve(requests, config)`` runs the engine (or the simulator); ``on_run`` sees every run.
    """
    configs = [config.replace(policy="continuous", token_budget=None)]
    configs += [config.replace(policy="chunked", token_budget=b) for b in budgets]
    seen: list[list[Interference]] = [[] for _ in configs]
    for _ in range(repeats):
        for i, c in enumerate(configs):
            run = serve(requests, c)
            if on_run is not None:
                on_run(run)
            seen[i].append(interference(run))
    return [_median(runs) for runs in seen]


def _median(runs: list[Interference]) -> Interference:
    numbers = {f.name: statistics.median(getattr(r, f.name) for r in runs)
               for f in fields(Interference) if f.name not in ("label", "token_budget")}
    numbers["steps"] = int(numbers["steps"])
    return replace(runs[0], **numbers)


def simulator_error(measured: list[Interference], predicted: list[Interference]) -> list[dict]:
    """Relative error (predicted / measured - 1) of throughput and TPOT, per configuration."""
    out = []
    for m, p in zip(measured, predicted):
        out.append({"label": m.label, "measured_tok_s": m.throughput,
                    "predicted_tok_s": p.throughput,
                    "throughput_error": p.throughput / m.throughput - 1,
                    "measured_tpot_s": m.tpot_mean_s, "predicted_tpot_s": p.tpot_mean_s,
                    "tpot_error": p.tpot_mean_s / m.tpot_mean_s - 1,
                    "tpot_p50_error": p.tpot_p50_s / m.tpot_p50_s - 1})
    return out
