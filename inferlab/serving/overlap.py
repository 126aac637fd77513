"""Overlap scheduling: the next step scheduled and prepared while this step's forward runs.

``StepLoop.step`` does its host work (schedule, build the inputs, record the tokens) while the
device waits, and the device works while the host waits: a step takes host + forward. SGLang's
overlap scheduler, vLLM's async scheduling and TensorRT-LLM's overlap scheduler run one step
ahead instead, so that a step takes about max(host, forward). ``LookaheadLoop`` does the same
with the course's scheduler and runner, unchanged:

1. step N's forward passes run on a worker thread (torch releases the GIL inside its kernels;
   on a GPU the thread only launches them), and the scheduler records step N at once with a
   PLACEHOLDER token for every row that emits (``Scheduler.update``): each such sequence is
   one token longer, a sequence at its ``max_new_tokens`` is retired, a prompt's blocks are
   remembered, exactly as if the token were known;
2. while N runs, the host lets arrivals in, schedules step N+1 on that state and builds its
   inputs (``ModelRunner.inputs``): a decode row feeds the placeholder;
3. then it waits for N's tokens and puts each in its placeholder's place, with its time, through
   ``on_token``. A sequence whose token was an end-of-sequence token is done now (the lookahead
   could not know): it is retired, and its row in N+1 is dropped (a static batch's member
   becomes a padding row) and N+1's inputs are built again; so are they when a sequence failed
   or was withdrawn. Otherwise the placeholders in N+1's ids are overwritten with the tokens;
4. N+1 is handed to the worker, recorded with placeholders, and the step returns N's finished
   sequences.

Step N+1's schedule does not depend on N's tokens, only on how many there are, which is why one
step of lookahead is exact for the tokens: every sequence gets the tokens the loop without
overlap gives it (a seeded one draws from its own generator once per emitted token either way).
What can differ is when things happen: a sequence that stopped at an end-of-sequence token
holds its blocks one step longer, so the lookahead may admit a waiting request a step later or
preempt where the plain loop would not. What cannot overlap: the token a forward feeds in is the
one the step before sampled (so N+1 waits for N's tokens), and a check on them (a stop string,
a grammar's mask for the next token) must wait for them too.

A sequence withdrawn between steps (a client hung up) loses the token its in-flight row
produces, as it would have without overlap, where that row would never have run. Failures are
blamed as in ``StepLoop``: a forward's error when its tokens are collected, on its rows.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from inferlab.serving.iteration import Forward, Iteration, Row
from inferlab.serving.loop import StepLoop, failure
from inferlab.serving.request import Sequence, Status
from inferlab.serving.scheduler import Step

PLACEHOLDER = -1  # a token the lookahead has counted but not seen yet


@dataclass
class Flight:
    """A step handed to the worker: what it runs, and where each emitted token goes."""

    step: Step
    start_s: float
    future: Future                       # a (tokens or error, start, end) per forward pass
    slots: list[list[tuple[Sequence, int] | None]]  # per forward, per row: (seq, output index)
    finished: list[Sequence] = field(default_factory=list)  # retired by length at launch


class LookaheadLoop(StepLoop):
    """A ``StepLoop`` one step ahead of its forward passes (the module says how). Its runner
    must offer ``inputs(rows)`` (built on the host) and ``run(*inputs)`` (the forward and the
    sampling, a token per row), as ``ModelRunner`` does."""

    flight: Flight | None = None
    _worker: ThreadPoolExecutor | None = None

    @property
    def done(self) -> bool:
        return super().done and self.flight is None

    def withdraw(self, seq: Sequence) -> None:
        """As ``StepLoop.withdraw``; a sequence retired at launch whose last token is still in
        flight is not returned as finished, and that token is dropped."""
        if self.flight is not None and seq in self.flight.finished:
            self.flight.finished.remove(seq)
        else:
            super().withdraw(seq)

    def step(self) -> list[Sequence]:
        """Let in the arrivals and schedule the next step while the current one runs; collect
        the current one's tokens, launch the next; return the sequences that finished."""
        now = self.clock.now()
        nxt = self.next_step(now)
        inputs, landing = self._inputs(nxt), self.flight is not None
        finished = self._land() if landing else []
        if self._settle(nxt):
            inputs = self._inputs(nxt)
        for each, holes in inputs:
            if holes:  # the tokens the step in flight sampled, in the placeholders' places
                each[0][0, [i for i, _ in holes]] = torch.tensor([s.output[-1] for _, s in holes],
                                                                 device=each[0].device)
        if not nxt.is_empty:
            self._launch(nxt, [each for each, _ in inputs], now)
        elif not landing:  # (after a landing, ask the policy again: it may have room now)
            return self._idle(nxt)
        return finished

    def _inputs(self, step: Step) -> list:
        """Each forward pass's inputs (or the error building them raised, blamed on its rows
        when the pass would have run), and its holes: where its ids hold a placeholder, and
        whose (a row that ends at its sequence's newest token feeds that token last)."""
        out = []
        for rows in step.forwards if not step.is_empty else []:
            try:
                each, holes, end = self.runner.inputs(rows), [], 0
            except Exception as error:
                out.append((error, []))
                continue
            for row in rows:
                end += row.new
                if row.seq.output[-1:] == [PLACEHOLDER] \
                        and row.start + row.new == row.seq.num_tokens:
                    holes.append((end - 1, row.seq))
            out.append((each, holes))
        return out

    def _settle(self, step: Step) -> bool:
        """Take out of ``step`` the sequences that finished or left while it was prepared (a
        held one that finished rides along as padding); whether its layout changed."""
        gone = [s for s in step.scheduled if s.status is not Status.RUNNING or s.is_done]
        padding = [s for s in step.padding if s.status is Status.RUNNING]
        if not gone and len(padding) == len(step.padding):
            return False
        step.prefills[:] = [s for s in step.prefills if s not in gone]
        step.decodes[:] = [s for s in step.decodes if s not in gone]
        for seq in gone:
            step.chunks.pop(seq, None)
            if seq.status is Status.RUNNING:  # held by its static batch: a padding row now
                padding.append(seq)
        step.padding = padding if step.decodes else []
        step.plan(self.scheduler.one_forward)
        return True

    def _launch(self, step: Step, inputs: list, now: float) -> None:
        """Hand ``step`` to the worker and record it at once, a placeholder for each token."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="inferlab-forward")
        slots = [[(r.seq, len(r.seq.output)) if r.emits else None for r in rows]
                 for rows in step.forwards]
        self.flight = Flight(step, now, self._worker.submit(self._run, inputs), slots)
        try:
            self.flight.finished = self.scheduler.update(
                step, [PLACEHOLDER] * len(step.scheduled))
        except Exception as error:
            self.fail(step.scheduled, "recording the step's tokens", error)

    def _run(self, inputs: list) -> list:
        """On the worker: each forward pass in turn, its tokens (or its error) and its times."""
        out = []
        for each in inputs:
            t0 = self.clock.now()
            try:
                tokens = each if isinstance(each, Exception) else self.runner.run(*each)
            except Exception as error:
                tokens = error
            out.append((tokens, t0, self.clock.now()))
        return out

    def _land(self) -> list[Sequence]:
        """Wait for the step in flight; put its tokens in place; retire the sequences an
        end-of-sequence token finished; log the step; the sequences that finished in it."""
        flight, self.flight, sched = self.flight, None, self.scheduler
        finished, forwards, step = flight.finished, [], flight.step
        for rows, slots, (tokens, t0, t1) in zip(step.forwards, flight.slots,
                                                 flight.future.result()):
            if isinstance(tokens, Exception):  # a prefill alone is blamed; a shared pass, all
                blamed = [r.seq for r in rows if r.seq not in step.padding]
                self.fail(blamed, "running a forward pass", tokens)
                for seq in [s for s in blamed if s in finished]:  # retired at launch: fail them
                    finished.remove(seq)
                    self.on_failure(seq, failure("running a forward pass", tokens))
                continue
            forwards.append(Forward(tuple(Row(r.seq.seq_id, *r[1:4]) for r in rows), t1 - t0))
            for slot, token in zip(slots, tokens):
                if slot is None or slot[0].status is Status.FINISHED and slot[0] not in finished:
                    continue  # no token kept, or its sequence left while it ran
                seq, i = slot
                seq.output[i] = int(token)
                seq.token_times.append(t1)
                if self.on_token is not None:
                    self.on_token(seq, int(token), t1)
                if seq.is_done and seq not in finished:  # an end-of-sequence token
                    sched.end(seq)
                    finished.append(seq)
        if self.on_iteration is not None:
            self.on_iteration(Iteration(
                flight.start_s, tuple(forwards), tuple(s.seq_id for s in step.preempted),
                sched.memory.num_free, tuple(s.seq_id for s in step.padding)))
        return finished

    def close(self) -> None:
        """Stop the worker thread (it is started again by the next step)."""
        if self._worker is not None:
            self._worker.shutdown()
            self._worker = None
