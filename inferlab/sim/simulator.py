"""A discrete-event simulator of the serving engine: the same scheduler, modelled step times.

A serving run is a sequence of iterations, and an iteration's cost depends on few things: how
many prompt tokens it prefills, how many sequences it decodes and how many K/V tokens those
attend over. So a simulator can replay a trace with the *real* scheduler and block manager
(``inferlab.serving.scheduler``, ``inferlab.serving.paged_cache``) and the *real* loop
(``inferlab.serving.loop.StepLoop``), and replace only the model by a cost model that says how long each step takes, charged to a
virtual clock. Policy effects (queueing, preemption, batch occupancy) are then exact, and only
step times are modelled; ``simulate`` returns the same ``Run`` as ``serve``. Two cost models:

- ``FittedCosts``: calibrated on this machine. Prefill time a + b T + c T^2 in the prompt
  length T; decode time a + b n + c C in the batch n and the context C (K/V tokens read), fitted
  by least squares to step times measured with ``torch.utils.benchmark`` (``measure_costs``)
  or taken from an engine run's iteration log (``FittedCosts.from_iterations``). A chunked
  step (decodes and prefill chunks in one forward, Chapter 7) costs a + b N + c P + d C in its
  tokens N, the query-key pairs P of its chunks (``chunk_pairs``) and the decodes' context C.
- ``inferlab.analysis.step_time.StepModel``: a table GPU and model (``data/hardware.csv``,
  ``data/models.csv``): the course's one model of a step's time, each kernel class (linear
  layers, attention over the cache, LM head, collectives) on its own roofline, summed;
  optionally derated by an efficiency and padded with a fixed per-step overhead. With
  efficiency 1 and no overhead it is a lower bound: no real engine is faster.

Vidur (Agrawal et al., MLSys 2024) simulates LLM serving the same way, at far greater detail.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Iterable, Protocol

import numpy as np
import torch

from inferlab.serving.config import ServingConfig
from inferlab.serving.interfaces import Runner
from inferlab.serving.iteration import Iteration
from inferlab.serving.loop import StepLoop, VirtualClock
from inferlab.serving.paged_attention import ModelRunner
from inferlab.serving.paged_cache import blocks_for
from inferlab.serving.paged_int8 import pool_for
from inferlab.serving.request import Request, Sequence, Span, longest_tokens
from inferlab.serving.run import Run, results_of
from inferlab.sim.work import CountingScheduler, Work
from inferlab.timing import time_fn


class CostModel(Protocol):
    def prefill_s(self, n_tokens: int) -> float: ...
    def decode_s(self, batch: int, context_tokens: int) -> float: ...
    def step_s(self, chunks, batch: int, context_tokens: int) -> float: ...


def chunk_pairs(chunks) -> float:
    """Query-key pairs the attention of ``chunks`` computes: a chunk of n new tokens after c
    cached ones has its i-th token (i = 1..n) attend to c + i keys."""
    return sum(n * c + n * (n + 1) / 2 for n, c in chunks)


def _nonnegative_lstsq(rows: list[list[float]], ys: list[float]) -> tuple[float, ...]:
    """Least squares with every coefficient >= 0 (a step never gets cheaper as it grows).

    With three unknowns, trying every subset of columns is exact and simple: solve each subset
    by ordinary least squares, keep the non-negative solutions, return the best fit.
    """
    X, y = np.asarray(rows, dtype=float), np.asarray(ys, dtype=float)
    best, best_err = np.zeros(X.shape[1]), float(y @ y)
    for mask in itertools.product((False, True), repeat=X.shape[1]):
        cols = np.flatnonzero(mask)
        if not len(cols):
            continue
        coef, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(X.shape[1])
        full[cols] = coef
        err = float(((X @ full - y) ** 2).sum())
        if err < best_err:
            best, best_err = full, err
    return tuple(float(c) for c in best)


@dataclass(frozen=True)
class FittedCosts:
    """Step times fitted to measurements: prefill a + bT + cT^2, decode a + bn + cC (seconds).

    Every coefficient is non-negative, so a longer prompt, a bigger batch or a longer context
    never makes a step cheaper, however noisy the measurements.
    """

    prefill: tuple[float, float, float]
    decode: tuple[float, float, float]
    source: str = ""
    prefill_samples: tuple[tuple[int, float], ...] = field(default=(), repr=False)
    decode_samples: tuple[tuple[int, int, float], ...] = field(default=(), repr=False)
    mixed: tuple[float, float, float, float] | None = None  # chunked steps: a + bN + cP + dC
    mixed_samples: tuple = field(default=(), repr=False)   # (chunks, batch, context, seconds)

    def prefill_s(self, n_tokens: int) -> float:
        a, b, c = self.prefill
        return max(0.0, a + b * n_tokens + c * n_tokens**2)

    def decode_s(self, batch: int, context_tokens: int) -> float:
        a, b, c = self.decode
        return max(0.0, a + b * batch + c * context_tokens)

    def step_s(self, chunks, batch: int, context_tokens: int) -> float:
        """A chunked step: ``chunks`` of (new tokens, cached tokens) and ``batch`` decodes over
        ``context_tokens``; with no chunks it is a decode step."""
        if not chunks:
            return self.decode_s(batch, context_tokens)
        if self.mixed is None:
            raise ValueError("these costs have no fit for chunked steps: fit them to a chunked "
                             "run's iterations (from_iterations)")
        a, b, c, d = self.mixed
        tokens = sum(n for n, _ in chunks) + batch
        return max(0.0, a + b * tokens + c * chunk_pairs(chunks) + d * context_tokens)

    @classmethod
    def fit(cls, prefills: Iterable[tuple[int, float]],
            decodes: Iterable[tuple[int, int, float]], source: str = "",
            mixed: Iterable[tuple] = ()) -> "FittedCosts":
        """Least squares over (T, seconds) prefill samples, (n, C, seconds) decode samples and
        (chunks, n, C, seconds) chunked-step samples (kept in ``*_samples``). With chunked
        samples alone, the prefill and decode fits are the chunked fit's special cases."""
        prefills, decodes, mixed = list(prefills), list(decodes), list(mixed)
        m = None
        if mixed:
            if len({(tuple(ch), n, c) for ch, n, c, _ in mixed}) < 4:
                raise ValueError("need chunked steps of 4 or more shapes to fit their cost")
            m = _nonnegative_lstsq([[1, sum(n for n, _ in ch) + b, chunk_pairs(ch), c]
                                    for ch, b, c, _ in mixed], [s for *_, s in mixed])
        if len({t for t, _ in prefills}) >= 3:
            p = _nonnegative_lstsq([[1, t, t * t] for t, _ in prefills], [s for _, s in prefills])
        elif m is not None:  # a prefill is one chunk from scratch, without decodes
            p = (m[0], m[1] + m[2] / 2, m[2] / 2)
        else:
            raise ValueError("need prefills at 3 or more lengths (or chunked steps) to fit the "
                             "cost model")
        if len({(n, c) for n, c, _ in decodes}) >= 3:
            d = _nonnegative_lstsq([[1, n, c] for n, c, _ in decodes], [s for _, _, s in decodes])
        elif m is not None:  # a decode step is a step without chunks
            d = (m[0], m[1], m[3])
        else:
            raise ValueError("need decodes at 3 or more (batch, context) points (or chunked "
                             "steps) to fit the cost model")
        return cls(p, d, source, tuple(prefills), tuple(decodes), m, tuple(mixed))

    @classmethod
    def from_iterations(cls, iterations: Iterable[Iteration], source: str = "") -> "FittedCosts":
        """Fit to the prefills, decode batches and chunked steps an engine run logged
        (``Run.iterations``)."""
        prefills, decodes, mixed = [], [], []
        for it in iterations:
            for f in it.forwards:
                chunks = tuple((r.new, r.cached) for r in f.rows if r.prefill)
                batch = sum(not r.prefill for r in f.rows)
                context = sum(r.new + r.cached for r in f.rows if not r.prefill)
                if len(f.rows) == 1 and chunks and chunks[0][1] == 0:  # a whole prompt
                    prefills.append((chunks[0][0], f.seconds))
                elif chunks:
                    mixed.append((chunks, batch, context, f.seconds))
                else:
                    decodes.append((batch, context, f.seconds))
        return cls.fit(prefills, decodes, source or "fitted to an engine run's iterations", mixed)


def measure_costs(model, prefill_lens=(8, 32, 64, 128), batches=(1, 8, 16, 32),
                  contexts=(16, 64, 128), config: ServingConfig | None = None,
                  min_run_time: float = 0.05) -> FittedCosts:
    """Time the engine's own prefill and decode steps at a grid of sizes; fit ``FittedCosts``.

    Each decode point runs ``batch`` sequences that each hold ``context`` tokens, so it reads
    batch x context K/V tokens. The pool has ``config``'s block size (and enough blocks).
    Timing uses ``inferlab.timing.time_fn`` (medians).
    """
    config = config or ServingConfig()
    longest = max(max(prefill_lens), max(contexts) + 1)
    num_blocks = max(batches) * blocks_for(longest, config.block_size) + 1
    cache = pool_for(model, config.replace(num_blocks=num_blocks))
    runner = ModelRunner(model, cache)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size

    def sequence(i: int, n_tokens: int) -> Sequence:
        prompt = tuple(torch.randint(0, vocab, (n_tokens - 1,), generator=gen).tolist())
        seq = Sequence(i, Request(prompt, 2), output=[int(torch.randint(0, vocab, (1,),
                                                                            generator=gen))])
        seq.table = cache.new_table()
        seq.table.append(seq.num_tokens)
        return seq

    prefills, decodes = [], []
    for t in prefill_lens:
        rows = [Span(sequence(0, t), t, 0, True, True)]  # a whole prompt: nothing computed yet
        prefills.append((t, time_fn(lambda: runner.forward(rows),
                                    min_run_time=min_run_time).median_s))
        rows[0].seq.table.free()
    for n in batches:
        for c in contexts:
            seqs = [sequence(i, c) for i in range(n)]
            for seq in seqs:
                seq.num_computed = c - 1  # decoding its newest token
            rows = [Span(seq, 1, c - 1, False, True) for seq in seqs]
            s = time_fn(lambda: runner.forward(rows), min_run_time=min_run_time).median_s
            decodes.append((n, n * c, s))
            for seq in seqs:
                seq.table.free()
    return FittedCosts.fit(prefills, decodes, f"measured on {model.device} with time_fn")


def measure_costs_for(model, requests: list[Request], config: ServingConfig,
                      min_run_time: float = 0.05) -> FittedCosts:
    """``measure_costs`` on a grid that spans a trace: prompt lengths up to its longest prompt,
    batches up to ``config.max_batch``, contexts from its shorter to its longer requests."""
    max_batch = config.max_batch
    prompts = sorted(len(r.prompt) for r in requests)
    totals = sorted(longest_tokens(len(r.prompt), r.max_new_tokens) for r in requests)
    pick = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    prefill_lens = sorted({max(1, pick(prompts, q)) for q in (0.05, 0.5, 0.9)} | {prompts[-1]})
    while len(prefill_lens) < 3:
        prefill_lens.append(prefill_lens[-1] + 1)
    contexts = sorted({max(2, pick(totals, q) // 2) for q in (0.1, 0.5, 0.9)})
    while len(contexts) < 3:
        contexts.append(contexts[-1] + 1)
    batches = sorted({1, max(1, max_batch // 4), max(1, max_batch // 2), max_batch})
    return measure_costs(model, tuple(prefill_lens), tuple(batches), tuple(contexts), config,
                         min_run_time)


class SimRunner(Runner):
    """Stands in for ``ModelRunner``: charges each forward's modelled time; emits token 0.

    A row is a decode when it runs one token of a sequence whose prompt is computed (``not
    row.prefill``); the others are prompt work. Without a token budget
    (``chunked=False``) a forward of prompt work is one whole prompt, priced by
    ``costs.prefill_s``, and a forward of decodes by ``costs.decode_s``; with one, every forward
    is priced by ``costs.step_s``. Every forward it charges is counted in ``work``
    (``inferlab.sim.work.Work``: tokens computed, first time or again, and forwards).
    """

    def __init__(self, costs: CostModel, clock: VirtualClock, chunked: bool = False,
                 work: Work | None = None):
        self.costs, self.clock, self.chunked = costs, clock, chunked
        self.work = Work() if work is None else work

    def forward(self, rows: list[Span]) -> list[int]:
        context = sum(r.seq.table.num_tokens for r in rows if not r.prefill)
        if self.chunked:
            shape = [(r.new, r.start) for r in rows if r.prefill]
            seconds = self.costs.step_s(shape, len(rows) - len(shape), context)
        elif not any(r.prefill for r in rows):
            seconds = self.costs.decode_s(len(rows), context)
        else:
            seconds = self.costs.prefill_s(rows[0].seq.num_tokens)
        self.work.record(rows, seconds)
        self.clock.advance(seconds)
        return [0] * len(rows)


def simulate(requests: list[Request], costs: CostModel, config: ServingConfig,
             work: Work | None = None) -> Run:
    """Replay ``requests`` through the real scheduler and loop with step times from ``costs``.

    Prompts only need the right length (token values are ignored): see
    ``inferlab.sim.workloads.trace_requests``. Returns the ``Run`` that ``serve`` would, on a
    virtual clock; ``work``, if given, receives the counts of what was computed.
    """
    clock = VirtualClock()
    work = Work("engine") if work is None else work
    runner = SimRunner(costs, clock, chunked=config.token_budget is not None, work=work)
    return StepLoop(CountingScheduler(config, work), runner, clock).run(list(requests))


class Resumable:
    """``simulate`` for traces that extend one another, as a steady-state search serves them
    (``inferlab.sim.steady_state``: n requests, then 2n whose first n are the same).

    It keeps the engine as it stood just before each trace's last arrival was let in, and a
    longer trace that starts with that one (and whose further requests arrive no earlier)
    continues from there instead of being served again from the start. The ``Run`` is the one
    ``simulate`` returns, to the last bit: the loop lets an arrival in only at a step that
    begins at or after its time, and skips an idle clock only as far as its next arrival, so
    every step before that point is the same in both runs. The last ``keep`` states are kept.
    """

    def __init__(self, costs: CostModel, config: ServingConfig, keep: int = 3):
        self.costs, self.config, self.keep = costs, config, keep
        self._kept: list[tuple[list[Request], tuple]] = []  # (trace, (loop, log, finished))

    def __call__(self, requests: list[Request]) -> Run:
        requests = list(requests)
        start, state = self._resume(requests)
        if state is None:
            clock = VirtualClock()
            work = Work("engine")
            runner = SimRunner(self.costs, clock, chunked=self.config.token_budget is not None,
                               work=work)
            state = (StepLoop(CountingScheduler(self.config, work), runner, clock), [], [])
        loop, iterations, finished = state
        loop.on_iteration = iterations.append
        for i in range(start, len(requests)):
            loop.submit(Sequence(i, requests[i]))
        last = max(r.arrival_s for r in requests)
        kept = start == len(requests)  # this very trace was kept: nothing new to keep
        while not loop.done:
            if not kept and loop.clock.now() >= last:
                self._keep(requests, state)
                kept = True
            finished += loop.step()
        loop.on_iteration = None
        sched = loop.scheduler
        return Run(results_of(requests, {}, finished), iterations, sched.num_preemptions,
                   self.config, sched.recomputed_tokens)

    def _copy(self, state: tuple) -> tuple:
        """A copy of the loop that shares what no later step changes: the cost model, the
        configuration, the requests, the log's past iterations and the finished sequences that
        have left the batch."""
        loop, iterations, finished = state
        loop.on_iteration = None  # a bound list.append would not be copied with its list
        held = {id(s) for s in loop.scheduler.running}  # a static batch keeps its finished
        shared = [self.costs, self.config, *iterations,  # members until the batch ends
                  *(s for s in finished if id(s) not in held),
                  *(s.request for s in loop.pending), *(s.request for s in loop.scheduler.running),
                  *(s.request for s in loop.scheduler.waiting)]
        loop, finished = copy.deepcopy((loop, finished), {id(x): x for x in shared})
        return loop, list(iterations), finished

    def _keep(self, requests: list[Request], state: tuple) -> None:
        self._kept = [*self._kept, (list(requests), self._copy(state))][-self.keep:]
        state[0].on_iteration = state[1].append

    def _resume(self, requests: list[Request]) -> tuple[int, tuple | None]:
        n, state = resume_point(self._kept, requests)
        return (n, None) if state is None else (n, self._copy(state))


def resume_point(kept: list[tuple[list[Request], object]],
                 requests: list[Request]) -> tuple[int, object | None]:
    """Of ``kept`` (trace, state) pairs, the longest trace that ``requests`` starts with, each
    further request arriving no earlier than its last: (its length, its state), else
    (0, None)."""
    best = None
    for trace, state in kept:
        n = len(trace)
        if n <= len(requests) and (best is None or n > len(best[0])) \
                and requests[:n] == trace \
                and all(r.arrival_s >= max(t.arrival_s for t in trace) for r in requests[n:]):
            best = (trace, state)
    return (0, None) if best is None else (len(best[0]), best[1])
