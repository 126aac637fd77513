"""The serving loop: requests in as they arrive, a scheduler's steps run, tokens stamped, a Run out.

``drive`` is the one loop every run goes through: the engine with the model
(``inferlab.serving.engine``), the discrete-event simulator with modelled step times
(``inferlab.sim.simulator``) and Chapter 3's memory experiment (``inferlab.sim.memory_sim``).
Each step it lets in the requests whose arrival time has come, asks the scheduler for a
``Step``, has a *runner* execute it (``prefill(seq) -> token``, ``decode(seqs) -> tokens``),
stamps each new token with the clock, and hands the tokens back to the scheduler. When nothing
can run it skips the clock to the next arrival instead of sleeping (the stamps are those a
real-time server would have made, but an idle trace costs no waiting).

A static batch's finished members that the policy holds (``Scheduler.padding``) ride along in
the decode batch: the runner computes their rows and the loop drops what they produce.

What a run returns is a ``Run``: one ``Result`` per request in the order given (its tokens and
timings, or the error that refused it), the ``Iteration`` log, the preemptions and a
``summary()`` in the metrics of ``inferlab.serving.metrics``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from inferlab.serving.config import ServingConfig
from inferlab.serving.metrics import SLO, RequestTiming, Summary, summarize
from inferlab.serving.request import Request, Sequence
from inferlab.serving.scheduler import Scheduler, Step


@dataclass(frozen=True)
class Result:
    """What came back for one request: its tokens and timings, or the error that refused it."""

    request_id: object
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]           # the generated tokens (the prompt not included)
    timing: RequestTiming | None      # None for a refused request
    num_preemptions: int = 0
    error: str | None = None
    finish_reason: str | None = None  # "stop" (end-of-sequence token) or "length"

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Iteration:
    """One step of the loop as it ran: its prefills, its decode batch and how long each took."""

    start_s: float
    prefills: tuple[tuple[int, int, float], ...]  # (seq_id, tokens, seconds), one forward each
    decode_ids: tuple[int, ...]
    padding_ids: tuple[int, ...]                  # finished rows riding along (static batching)
    decode_context: int                           # K/V tokens the decode batch attends over
    decode_s: float
    preempted: tuple[int, ...]
    free_blocks: int                              # after the step's allocations

    @property
    def decode_batch(self) -> int:
        """Rows in the decode forward, padding included."""
        return len(self.decode_ids) + len(self.padding_ids)

    @property
    def end_s(self) -> float:
        return self.start_s + sum(s for _, _, s in self.prefills) + self.decode_s


@dataclass
class Run:
    """A serving run: one ``Result`` per request (in the order given), the iteration log, the
    preemptions, and the configuration it ran with (``num_blocks`` filled in)."""

    results: list[Result]
    iterations: list[Iteration] = field(default_factory=list)
    num_preemptions: int = 0
    config: ServingConfig | None = None

    @property
    def timings(self) -> list[RequestTiming | None]:
        return [r.timing for r in self.results]

    def summary(self, slo: SLO | None = None) -> Summary:
        """Throughput and latency percentiles over the requests that completed."""
        return summarize([r.timing for r in self.results if r.ok], slo)


class WallClock:
    """Seconds since the run started, measured, except that idle gaps can be skipped."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self._skipped = 0.0

    def now(self) -> float:
        return time.perf_counter() - self._t0 + self._skipped

    def skip_to(self, t: float) -> None:
        """Nothing can run before ``t``: jump there rather than wait."""
        self._skipped += max(0.0, t - self.now())


class VirtualClock:
    """Simulated seconds: advanced by modelled step times, never by the wall clock."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def skip_to(self, t: float) -> None:
        self.t = max(self.t, t)

    def advance(self, seconds: float) -> None:
        self.t += seconds


def drive(requests: dict[int, Request], scheduler: Scheduler, runner, clock,
          on_iteration: Callable[[Iteration], None] | None = None) -> dict[int, list[float]]:
    """Serve ``requests`` (key i becomes sequence i); return each one's token stamps.

    ``runner`` has ``prefill(seq) -> token`` and ``decode(seqs) -> tokens``; ``clock`` has
    ``now()`` and ``skip_to(t)``. The sequences end in ``scheduler.finished``.
    """
    order = sorted(requests, key=lambda i: (requests[i].arrival_s, i))
    pending = deque((i, requests[i]) for i in order)
    stamps: dict[int, list[float]] = {i: [] for i in order}
    while pending or scheduler.has_unfinished:
        now = clock.now()
        while pending and pending[0][1].arrival_s <= now:
            i, r = pending.popleft()
            scheduler.add(Sequence.of(i, r))
        step: Step = scheduler.schedule(now)
        if step.is_empty:
            if not pending and not scheduler.has_unfinished:
                break  # the policy retired the last sequences
            wake = [t for t in (pending[0][1].arrival_s if pending else None, step.wake_at_s)
                    if t is not None]
            if not wake:
                raise RuntimeError(f"the scheduler is stuck: {len(scheduler.waiting)} waiting, "
                                   "none admitted, nothing running and no arrival to wait for")
            clock.skip_to(min(wake))
            continue
        tokens, prefills = [], []
        for seq in step.prefills:
            t0 = clock.now()
            tokens.append(runner.prefill(seq))
            t1 = clock.now()
            stamps[seq.seq_id].append(t1)
            prefills.append((seq.seq_id, seq.num_tokens, t1 - t0))
        padding = scheduler.padding
        rows = step.decodes + padding
        decode_s, context = 0.0, sum(s.table.num_tokens for s in rows)
        if step.decodes:
            t0 = clock.now()
            tokens.extend(runner.decode(rows)[:len(step.decodes)])  # padding tokens are dropped
            t1 = clock.now()
            decode_s = t1 - t0
            for seq in step.decodes:
                stamps[seq.seq_id].append(t1)
        if on_iteration is not None:
            on_iteration(Iteration(now, tuple(prefills), tuple(s.seq_id for s in step.decodes),
                                   tuple(s.seq_id for s in padding), context, decode_s,
                                   tuple(s.seq_id for s in step.preempted),
                                   scheduler.memory.num_free))
        scheduler.update(step, tokens)
    return stamps


def collect_results(requests: list[Request], refused: dict[int, str], scheduler: Scheduler,
                    stamps: dict[int, list[float]]) -> list[Result]:
    """One ``Result`` per request, in the order given; sequence ids index ``requests``."""
    done = {seq.seq_id: seq for seq in scheduler.finished}
    results = []
    for i, r in enumerate(requests):
        rid = i if r.request_id is None else r.request_id
        if i in refused:
            results.append(Result(rid, r.prompt, (), None, 0, refused[i]))
            continue
        seq = done[i]
        results.append(Result(rid, r.prompt, tuple(seq.output),
                              RequestTiming(r.arrival_s, tuple(stamps[i])), seq.num_preemptions,
                              finish_reason=seq.finish_reason))
    return results


def run_loop(requests: list[Request], scheduler: Scheduler, runner, clock,
             refused: dict[int, str] | None = None) -> Run:
    """``drive`` the requests not ``refused`` and collect a ``Run``."""
    refused = refused or {}
    iterations: list[Iteration] = []
    valid = {i: r for i, r in enumerate(requests) if i not in refused}
    stamps = drive(valid, scheduler, runner, clock, iterations.append)
    return Run(collect_results(requests, refused, scheduler, stamps), iterations,
               scheduler.num_preemptions, scheduler.config)
