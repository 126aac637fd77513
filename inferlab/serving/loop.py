"""The serving loop: requests in as they arrive, a scheduler's steps run, tokens stamped, a Run out.

``StepLoop`` is the one loop every run goes through, a step at a time: the engine with the model
(``inferlab.serving.engine``), the discrete-event simulator with modelled step times
(``inferlab.sim.simulator``), Chapter 3's memory experiment (``inferlab.sim.memory_sim``) and
the simulated clusters of Chapter 7 (``inferlab.sim.disaggregation``, which steps several
servers on one timeline). ``StepLoop.run`` serves a list of requests to the end and returns
their ``Run`` (the token stamps stay in ``StepLoop.stamps``).

Each step the server lets in the requests whose time has come, asks the scheduler for a
``Step``, has a *runner* execute it, stamps each new token with the clock, and hands the tokens
back to the scheduler. A runner has one method, ``forward(rows) -> tokens``: one forward pass
over rows ``(sequence, new tokens)``, a token per row. Without a token budget a step is
Chapter 4's: a forward per prefill (one row, the whole prompt), then one over the decode batch
(a row of one token per sequence). With one (chunked prefill), the whole step is ONE forward
over the decode rows and the prefill chunks; a chunk that leaves part of its prompt for later
produces no token. When nothing can run, the server skips its clock to the next arrival instead
of sleeping (the stamps are those a real-time server would have made, but an idle trace costs
no waiting).

The padding rows a static batch lists (``Step.padding``: finished members it keeps) ride along
in the decode batch: the runner computes their rows and the loop drops what they produce.

Every step is logged as an ``Iteration`` of the same shape whatever the policy: its forward
passes, each with its rows (sequence, new tokens, cached tokens, prompt work or a decode) and
its seconds (``inferlab.serving.iteration``).

What a run returns is a ``Run`` (``inferlab.serving.run``): one ``Result`` per request in the
order given (its tokens and timings, or the error that refused it), the ``Iteration`` log, the
preemptions and a ``summary()`` in the metrics of ``inferlab.serving.metrics``. Both modules'
names can be imported from here too.
"""

from __future__ import annotations

import heapq
import math
import time
from typing import Callable

from inferlab.serving.interfaces import Clock, Runner
from inferlab.serving.iteration import Forward, Iteration, Row
from inferlab.serving.request import Request, Sequence, Status
from inferlab.serving.run import Result, Run, collect_results
from inferlab.serving.scheduler import Scheduler
from inferlab.serving.step import Step

__all__ = ["Forward", "Iteration", "Result", "Row", "Run", "StepLoop", "VirtualClock",
           "WallClock", "collect_results"]  # the log and the run, re-exported


class WallClock(Clock):
    """Seconds since the run started, measured, except that idle gaps can be skipped."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self._skipped = 0.0

    def now(self) -> float:
        return time.perf_counter() - self._t0 + self._skipped

    def skip_to(self, t: float) -> None:
        """Nothing can run before ``t``: jump there rather than wait."""
        self._skipped += max(0.0, t - self.now())


class VirtualClock(Clock):
    """Simulated seconds: advanced by modelled step times, never by the wall clock."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def skip_to(self, t: float) -> None:
        self.t = max(self.t, t)

    def advance(self, seconds: float) -> None:
        self.t += seconds


class StepLoop:
    """One engine's loop over a scheduler, a runner and a clock, a step at a time (vLLM calls
    it the engine core's step; it is not an HTTP server).

    ``submit`` hands it a sequence that reaches it at a given time; ``step`` runs one iteration
    (or skips the clock to the next arrival) and returns the sequences that finished; ``stamps``
    holds every sequence's token times. ``ready_s`` says when it can next do something, which is
    how a cluster of servers on one timeline decides whose step comes first.

    ``on_prefill(seq, token)``, when set, hears of a prefill's token as soon as its own forward
    pass ends, before the step's decode batch runs: an online engine streams it at once, so the
    first token leaves when its stamp says (the scheduler records it at the step's end).

    ``isolate=True`` (what a server wants) contains an exception raised while letting a
    sequence in, scheduling, running the model or recording the tokens: the sequences it is
    blamed on are taken out (``Scheduler.abort`` frees their blocks), listed in ``failures``
    with the error, and the step goes on for the others. A failure is blamed on one sequence
    where it can be (its arrival; its own prefill's forward pass), else on every sequence the
    stage touched (a decode batch or a chunked step: its rows; scheduling: every running
    sequence and the first waiting one, since a policy may have half-changed any of them). By
    default (offline runs, the labs) the exception propagates: a bug should stop the
    experiment.
    """

    def __init__(self, scheduler: Scheduler, runner: Runner, clock: Clock,
                 on_iteration: Callable[[Iteration], None] | None = None,
                 on_prefill: Callable[[Sequence, int], None] | None = None,
                 isolate: bool = False):
        self.scheduler, self.runner, self.clock = scheduler, runner, clock
        self.on_iteration, self.on_prefill = on_iteration, on_prefill
        self.isolate = isolate
        self.chunked = scheduler.token_budget is not None
        self.stamps: dict[int, list[float]] = {}
        self.failures: list[tuple[Sequence, str]] = []  # (sequence, why), for the caller to take
        self._pending: list[tuple[float, int, Sequence]] = []  # a heap: (time, id, sequence)

    def submit(self, seq: Sequence, at_s: float | None = None) -> None:
        """``seq`` reaches this server at ``at_s`` (default: its arrival time); it joins the
        waiting queue at the first step that begins at or after that time."""
        heapq.heappush(self._pending, (seq.arrival_s if at_s is None else at_s, seq.seq_id, seq))
        self.stamps.setdefault(seq.seq_id, [])

    def run(self, requests: list[Request], refused: dict[int, str] | None = None) -> Run:
        """Serve ``requests`` (request i becomes sequence i) except the ``refused`` ones (index:
        why) to the end: their ``Run``, with this loop's iteration log."""
        refused = refused or {}
        iterations: list[Iteration] = []
        if self.on_iteration is None:
            self.on_iteration = iterations.append
        for i, request in enumerate(requests):
            if i not in refused:
                self.submit(Sequence.of(i, request))
        while not self.done:
            self.step()
        sched = self.scheduler
        return Run(collect_results(requests, refused, sched, self.stamps), iterations,
                   sched.num_preemptions, sched.config)

    def withdraw(self, seq: Sequence) -> None:
        """Take ``seq`` out wherever it is (not arrived yet, waiting or running); a running
        one's blocks are freed at once (``Scheduler.abort``). A server calls it between steps
        when a client hangs up."""
        kept = [item for item in self._pending if item[2] is not seq]
        if len(kept) < len(self._pending):
            heapq.heapify(kept)
            self._pending = kept
        else:
            self.scheduler.abort(seq)

    @property
    def pending(self) -> list[Sequence]:
        """Sequences submitted for a later time that have not reached the waiting queue yet."""
        return [seq for _, _, seq in self._pending]

    @property
    def done(self) -> bool:
        """Nothing waiting to arrive and nothing unfinished."""
        return not self._pending and not self.scheduler.has_unfinished

    def ready_s(self) -> float:
        """When this server can next act: now if it has work, else its next arrival (or inf)."""
        if self.scheduler.has_unfinished:
            return self.clock.now()
        return self._pending[0][0] if self._pending else math.inf

    def fail(self, seqs: list[Sequence], stage: str, error: BaseException) -> None:
        """``error`` was raised in ``stage``, blamed on ``seqs``: without ``isolate``, raise it;
        with it, take ``seqs`` out wherever they are, freeing their blocks, and record why in
        ``failures`` (a sequence already finished or taken out is left alone)."""
        if not self.isolate:
            raise error
        why = f"the engine failed while {stage}: {type(error).__name__}: {error}"
        for seq in dict.fromkeys(seqs):  # once each, in order
            if seq.status is not Status.FINISHED:
                self.scheduler.abort(seq)
                self.failures.append((seq, why))

    def step(self) -> list[Sequence]:
        """Let in the arrivals, run one scheduled step; return the sequences that finished."""
        now = self.clock.now()
        while self._pending and self._pending[0][0] <= now:
            seq = heapq.heappop(self._pending)[2]
            try:
                self.scheduler.add(seq)
            except Exception as error:
                self.fail([seq], "admitting it", error)
        try:
            step: Step = self.scheduler.schedule(now)
        except Exception as error:
            self.fail([*self.scheduler.running, *self.scheduler.waiting[:1]], "scheduling",
                      error)
            return []
        if step.is_empty:
            if self.done:
                return []  # the policy retired the last sequences
            wake = [t for t in (self._pending[0][0] if self._pending else None, step.wake_at_s)
                    if t is not None]
            if not wake:
                raise RuntimeError(f"the scheduler is stuck: {len(self.scheduler.waiting)} "
                                   "waiting, none admitted, nothing running and no arrival to "
                                   "wait for")
            self.clock.skip_to(min(wake))
            return []
        tokens = self._run(step, now)
        try:
            return self.scheduler.update(step, tokens)
        except Exception as error:
            self.fail(step.scheduled, "recording the step's tokens", error)
            return []

    def _drop(self, step: Step, seqs: list[Sequence], stage: str, error: BaseException) -> None:
        """``seqs`` failed in ``stage``: take them out of the engine (``fail``) and the step."""
        self.fail(seqs, stage, error)
        gone = set(map(id, seqs))
        step.prefills[:] = [s for s in step.prefills if id(s) not in gone]
        step.decodes[:] = [s for s in step.decodes if id(s) not in gone]
        for seq in seqs:
            step.chunks.pop(seq, None)

    def _forwards(self, step: Step) -> list[list[tuple[Sequence, int]]]:
        """The step's forward passes, as rows ``(sequence, new tokens)``: with a token budget,
        one pass of the decodes (and padding rows) and the prefill chunks; without, a pass per
        prefill (its whole prompt), then one of the decodes and the padding rows."""
        decodes = [(s, 1) for s in step.decodes + step.padding]
        if self.chunked:
            return [decodes + [(s, step.new_tokens(s)) for s in step.prefills]]
        return [[(s, s.num_uncomputed)] for s in step.prefills] + ([decodes] if decodes else [])

    def _run(self, step: Step, now: float) -> list[int]:
        """Run the step's forward passes; return a token per scheduled sequence (its order)."""
        tokens: dict[int, int] = {}
        forwards = []
        padding = set(map(id, step.padding))
        prefills = set(map(id, step.prefills))
        for rows in self._forwards(step):
            logged = tuple(Row(s.seq_id, n, s.row_start(n), id(s) in prefills) for s, n in rows)
            t0 = self.clock.now()
            try:
                out = self.runner.forward(rows)
            except Exception as error:  # a prefill alone is blamed; a shared pass, every row
                self._drop(step, [s for s, _ in rows if id(s) not in padding],
                           "running a forward pass", error)
                continue
            t1 = self.clock.now()
            forwards.append(Forward(logged, t1 - t0))
            for (seq, n), token in zip(rows, out):
                if id(seq) in padding or not step.samples(seq):
                    continue  # padding, or a chunk that leaves part of its prompt
                tokens[id(seq)] = int(token)
                self.stamps[seq.seq_id].append(t1)
                if self.on_prefill is not None and not self.chunked and id(seq) in prefills:
                    self.on_prefill(seq, int(token))
        if self.on_iteration is not None:
            self.on_iteration(Iteration(
                now, tuple(forwards), tuple(s.seq_id for s in step.preempted),
                self.scheduler.memory.num_free, tuple(s.seq_id for s in step.padding)))
        return [tokens.get(id(s), 0) for s in step.scheduled]

