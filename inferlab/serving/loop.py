"""The serving loop: requests in as they arrive, a scheduler's steps run, each token out with its time.

``StepLoop`` is the one loop every run goes through, a step at a time: the engine with the model
(``inferlab.serving.engine.Engine`` is a ``StepLoop`` over the model's runner), the
discrete-event simulator with modelled step times (``inferlab.sim.simulator``), Chapter 3's
memory experiment (``inferlab.sim.memory_sim``) and the simulated clusters of Chapter 7
(``inferlab.sim.disaggregation``, which steps several loops on one timeline). ``run`` serves a
list of requests to the end and returns their ``Run`` (``inferlab.serving.run``).

Each step the loop lets in the sequences whose time has come, asks the scheduler for a ``Step``
(already laid out as forward passes of ``Span`` rows), has a *runner* execute each pass, and
hands the tokens and their times back to the scheduler, which keeps them on the sequences. A
runner has one method, ``forward(rows) -> tokens``, a token per row. Every token a row keeps
(``Span.emits``) leaves through one hook, ``on_token(seq, token, time)``, as soon as its forward
pass ends: an online engine streams it from there, so a newcomer's first token does not wait
for the decode batch that runs later in the same step. When nothing can run, the loop skips its
clock to the next arrival instead of sleeping (the stamps are those a real-time server would
have made, but an idle trace costs no waiting).

The padding rows a static batch lists (``Step.padding``: finished members it keeps) ride along
in the decode batch: the runner computes their rows and nothing keeps their tokens.

Every step is logged as an ``Iteration`` of the same shape whatever the policy: its forward
passes, each with its rows (sequence, new tokens, cached tokens, prompt work or a decode) and
its seconds (``inferlab.serving.iteration``).
"""

from __future__ import annotations

import heapq
import math
import time
from typing import Callable

from inferlab.serving.interfaces import Clock, Runner
from inferlab.serving.iteration import Forward, Iteration, Row
from inferlab.serving.request import Request, Sequence, Status
from inferlab.serving.run import Run, results_of
from inferlab.serving.scheduler import Scheduler, Step


def failure(stage: str, error: BaseException) -> str:
    """What ``on_failure`` hears when ``error`` was raised in ``stage``."""
    return f"the engine failed while {stage}: {type(error).__name__}: {error}"


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
    (or skips the clock to the next arrival) and returns the sequences that finished. ``ready_s``
    says when it can next do something, which is how a cluster of loops on one timeline decides
    whose step comes first. The hooks: ``on_token(seq, token, time)`` hears of every token a
    sequence keeps, ``on_iteration(iteration)`` of every step's log.

    With ``on_failure(seq, why)`` (what a server wants) an exception raised while letting a
    sequence in, scheduling, running the model or recording the tokens is contained: the
    sequences it is blamed on are taken out (``Scheduler.abort`` frees their blocks), reported
    to ``on_failure``, and the step goes on for the others. A failure is blamed on one sequence
    where it can be (its arrival; its own prefill's forward pass), else on every sequence the
    stage touched (a decode batch or a chunked step: its rows; scheduling: every running
    sequence and the first waiting one, since a policy may have half-changed any of them).
    Without it (offline runs, the labs) the exception propagates: a bug should stop the
    experiment.
    """

    def __init__(self, scheduler: Scheduler, runner: Runner, clock: Clock,
                 on_iteration: Callable[[Iteration], None] | None = None,
                 on_token: Callable[[Sequence, int, float], None] | None = None,
                 on_failure: Callable[[Sequence, str], None] | None = None):
        self.scheduler, self.runner, self.clock = scheduler, runner, clock
        self.on_iteration, self.on_token, self.on_failure = on_iteration, on_token, on_failure
        self._pending: list[tuple[float, int, Sequence]] = []  # a heap: (time, id, sequence)

    def submit(self, seq: Sequence, at_s: float | None = None) -> None:
        """``seq`` reaches this loop at ``at_s`` (default: its arrival time); it joins the
        waiting queue at the first step that begins at or after that time."""
        heapq.heappush(self._pending, (seq.arrival_s if at_s is None else at_s, seq.seq_id, seq))

    def run(self, requests: list[Request], refused: dict[int, str] | None = None) -> Run:
        """Serve ``requests`` (request i becomes sequence i) except the ``refused`` ones (index:
        why) to the end: their ``Run``, with this run's iteration log and preemptions."""
        refused, sched = refused or {}, self.scheduler
        iterations: list[Iteration] = []
        logging, preempted = self.on_iteration is None, (sched.num_preemptions,
                                                         sched.recomputed_tokens)
        if logging:
            self.on_iteration = iterations.append
        for i, request in enumerate(requests):
            if i not in refused:
                self.submit(Sequence(i, request))
        finished: list[Sequence] = []
        try:
            while not self.done:
                finished += self.step()
        finally:
            if logging:
                self.on_iteration = None
        return Run(results_of(requests, refused, finished), iterations,
                   sched.num_preemptions - preempted[0], sched.config,
                   sched.recomputed_tokens - preempted[1])

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
        """When this loop can next act: now if it has work, else its next arrival (or inf),
        and never before its clock: an arrival that came while its last step ran waits for the
        step to end, beside every other arrival of that time (a driver that steps the loop at
        the first such arrival would otherwise let the others in one step each)."""
        if self.scheduler.has_unfinished:
            return self.clock.now()
        return max(self.clock.now(), self._pending[0][0]) if self._pending else math.inf

    def fail(self, seqs: list[Sequence], stage: str, error: BaseException) -> None:
        """``error`` was raised in ``stage``, blamed on ``seqs``: without ``on_failure``, raise
        it; with it, take ``seqs`` out wherever they are, freeing their blocks, and report each
        (a sequence already finished or taken out is left alone)."""
        if self.on_failure is None:
            raise error
        for seq in dict.fromkeys(seqs):  # once each, in order
            if seq.status is not Status.FINISHED:
                self.scheduler.abort(seq)
                self.on_failure(seq, failure(stage, error))

    def next_step(self, now: float) -> Step:
        """Let the arrivals due by ``now`` into the waiting queue and ask the scheduler for the
        next step, containing a failure as the class says (a failed schedule: an empty step)."""
        while self._pending and self._pending[0][0] <= now:
            seq = heapq.heappop(self._pending)[2]
            try:
                self.scheduler.add(seq)
            except Exception as error:
                self.fail([seq], "admitting it", error)
        try:
            return self.scheduler.schedule(now)
        except Exception as error:  # a policy may have half-changed any of these
            self.fail([*self.scheduler.running, *self.scheduler.waiting[:1]], "scheduling", error)
            return Step(wake_at_s=now)  # woken at once: the next step asks again

    def step(self) -> list[Sequence]:
        """Let in the arrivals, run one scheduled step; return the sequences that finished."""
        now, sched = self.clock.now(), self.scheduler
        step = self.next_step(now)
        if step.is_empty:
            return self._idle(step)
        kept, forwards = {}, []  # kept: id(seq) -> its token and when it came out
        for rows in step.forwards:
            t0 = self.clock.now()
            try:
                tokens = self.runner.forward(rows)
            except Exception as error:  # a prefill alone is blamed; a shared pass, every row
                self._drop(step, [r.seq for r in rows if r.seq not in step.padding], error)
                continue
            t1 = self.clock.now()
            # a row logs the span's (new, start, prefill)
            forwards.append(Forward(tuple(Row(r.seq.seq_id, *r[1:4]) for r in rows), t1 - t0))
            for row, token in zip(rows, tokens):
                if row.emits:
                    kept[id(row.seq)] = int(token), t1
                    if self.on_token is not None:
                        self.on_token(row.seq, int(token), t1)
        if self.on_iteration is not None:
            self.on_iteration(Iteration(
                now, tuple(forwards), tuple(s.seq_id for s in step.preempted),
                sched.memory.num_free, tuple(s.seq_id for s in step.padding)))
        out = [kept.get(id(s), (0, now)) for s in step.scheduled]
        try:
            return sched.update(step, [t for t, _ in out], [w for _, w in out])
        except Exception as error:
            self.fail(step.scheduled, "recording the step's tokens", error)
            return []

    def close(self) -> None:
        """Release what the loop holds between runs (nothing here; a lookahead's worker)."""

    def _idle(self, step) -> list[Sequence]:
        """Nothing to run: skip the clock to the next arrival, or to when the policy asked to be
        woken (``step.wake_at_s``; now, after a failed schedule); a loop with neither is stuck.
        Nothing finished: []."""
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

    def _drop(self, step, seqs: list[Sequence], error: BaseException) -> None:
        """``seqs`` failed in a forward pass: take them out of the engine (``fail``) and of the
        step."""
        self.fail(seqs, "running a forward pass", error)
        gone = set(map(id, seqs))
        step.prefills[:] = [s for s in step.prefills if id(s) not in gone]
        step.decodes[:] = [s for s in step.decodes if id(s) not in gone]
        for seq in seqs:
            step.chunks.pop(seq, None)
