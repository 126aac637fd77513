"""Checks for Lab 4, "Batching: from static to continuous".

Oracles that need no solution:

- the scheduling policies are replayed on fixed traces under memory pressure, step by step,
  against the policies of ``inferlab.serving.scheduler`` (with a hint naming the first rule
  broken), and the continuous one also drives the real engine, whose every output must equal generating that
  request alone with the contiguous KV cache (``inferlab.course.checks.oracle``), preemptions
  included;
- the metrics are compared with ``inferlab.serving.metrics`` and ``numpy.percentile``;
- the predictions with ``inferlab.analysis.formulas.static_slot_utilisation`` and
  ``inferlab.analysis.formulas.overlapped_step_s``.

The model the checks run is the oracle's 2-layer ``tiny`` in float64 on the CPU, whatever the
learner's device (``inferlab.course.checks.oracle`` says why).
"""

from __future__ import annotations

import numpy as np
import torch

from inferlab.course.checks import CheckFailed, expect_close, expect_equal, lends, run_check
from inferlab.course.checks.oracle import alone, tiny_model
from inferlab.analysis import formulas
from inferlab.serving import metrics, scheduler
from inferlab.serving.paged_cache import OutOfBlocksError
from inferlab.serving.config import ServingConfig
from inferlab.serving.interfaces import Runner
from inferlab.serving.engine import serve
from inferlab.serving.loop import StepLoop, VirtualClock
from inferlab.serving.request import Request
from inferlab.serving.scheduler import Scheduler, SchedulingError

# Points per exercise for the grader's score (inferlab.course.grade; an instructor's
# --weights file overrides them): more for the exercises that are more code.
WEIGHTS = {"4.1": 2, "4.2": 3, "4.3a": 2, "4.3b": 1, "4.4": 1, "4.5": 1}


# -- the oracle's traces ----------------------------------------------------------
def _requests(seed: int, n: int, max_prompt: int, max_new: int, spread_s: float) -> list[Request]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(1, max_prompt + 1, (1,), generator=gen))
        prompt = tuple(torch.randint(0, 512, (length,), generator=gen).tolist())
        new = int(torch.randint(1, max_new + 1, (1,), generator=gen))
        out.append(Request(prompt, new, round(spread_s * i / n, 6), f"r{i}"))
    return out


# (seed, requests, num_blocks, block_size, max_batch): the first has plenty of memory, the
# others too little for everyone at once, so that continuous batching must preempt.
_TRACES = [(0, 6, 200, 4, 4), (1, 10, 14, 4, 6), (2, 12, 13, 2, 8), (3, 8, 24, 8, 3)]


class _FakeRunner(Runner):
    """A model stand-in for replaying decisions: each token says how far along its sequence is."""

    def __init__(self, clock, limit: int):
        self.clock, self.limit, self.steps = clock, limit, 0

    def _tick(self):
        self.steps += 1
        if self.steps > self.limit:
            raise CheckFailed(f"the trace did not finish within {self.limit} forward passes."
                              "\n  Hint: make sure every step makes progress: running sequences "
                              "decode, and waiting ones are admitted when the engine is idle.")
        self.clock.advance(1e-3)

    def forward(self, rows):
        self._tick()
        return [len(r.seq.output) + 1 for r in rows]


def _replay(policy, trace) -> tuple[list[tuple], Scheduler]:
    """The iterations (prefill ids, decode ids, padding ids, preempted ids) a policy makes."""
    seed, n, num_blocks, block_size, max_batch = trace
    requests = _requests(seed, n, 12, 12, 0.004)
    sched = Scheduler(ServingConfig(block_size=block_size, num_blocks=num_blocks,
                                    max_batch=max_batch, policy=policy))
    clock = VirtualClock()
    log = []
    total = sum(r.max_new_tokens for r in requests)
    StepLoop(sched, _FakeRunner(clock, 20 * total + 100), clock,
             lambda it: log.append((tuple(r.seq_id for r in it.prefill_rows), it.decode_ids,
                                    it.padding_ids, it.preempted))).run(requests)
    return log, sched


def _where(trace) -> str:
    seed, n, num_blocks, block_size, max_batch = trace
    return (f"{n} requests, {num_blocks} blocks of {block_size} tokens, max_batch={max_batch} "
            f"(trace seed {seed})")


def _call(policy, trace):
    """Replay, turning rule breaks into failures with a hint (NotImplementedError passes)."""
    try:
        return _replay(policy, trace)
    except SchedulingError as error:
        raise CheckFailed(f"on {_where(trace)} the scheduler stopped the policy: {error}"
                          "\n  Hint: use the Scheduler's actions (admit, append_slot, preempt) "
                          "and put every running sequence in the step.") from None
    except OutOfBlocksError as error:
        raise CheckFailed(f"on {_where(trace)} an allocation failed: {error}"
                          "\n  Hint: ask first (sched.can_admit(seq), sched.can_append(seq)) "
                          "and act only when the answer is yes.") from None


def _compare(name: str, got_log, want_log, trace, diagnose) -> None:
    for i, (got, want) in enumerate(zip(got_log, want_log)):
        if got != want:
            labels = ("prefills", "decodes", "padding", "preempted")
            show = lambda it: ", ".join(f"{k}={list(v)}" for k, v in zip(labels, it) if v)  # noqa: E731
            raise CheckFailed(f"{name} on {_where(trace)} differs at iteration {i}: it ran "
                              f"[{show(got)}], expected [{show(want)}].\n  Hint: "
                              f"{diagnose(got, want)}")
    expect_equal(f"the number of iterations of {name} on {_where(trace)}", len(got_log),
                 len(want_log), hint="the trace should end when the last request finishes.")


def _static_hint(got, want) -> str:
    (gp, gd, gpad, gpre), (wp, wd, wpad, wpre) = got, want
    if gpre:
        return "static batching never preempts: it reserves each member's full length."
    if gp and (wd or wpad):
        return "nobody may join a batch in flight: admit only when every member is done."
    if gpad != wpad:
        return ("finished members keep their row as padding until the whole batch is done: "
                "while the batch is in flight, list them in the step "
                "(step.padding = [seq for seq in sched.running if seq.is_done]), and hold "
                "each member when you admit it (sched.hold(seq)) so that the scheduler does "
                "not retire it when it finishes; retire them all when the batch is over.")
    if len(gp) > len(wp):
        return ("too many admitted: at most max_batch, and only while the blocks reserved for "
                "each member's longest length (sched.blocks_for(seq.max_tokens)) fit in "
                "sched.memory.num_free.")
    if len(gp) < len(wp):
        return ("admit as many waiting requests as fit (up to max_batch, in arrival order) "
                "when the engine is idle.")
    return "compare your decisions with the rules in the exercise text."


def _continuous_hint(got, want) -> str:
    (gp, gd, gpad, gpre), (wp, wd, wpad, wpre) = got, want
    if gpre != wpre:
        if gpre and wpre and set(gpre) != set(wpre):
            return ("preempt the LATEST-arrived running sequence first (sched.running[-1]), "
                    "possibly the one you are trying to grow, and only while it is needed.")
        if not gpre:
            return "when sched.can_append(seq) is False, preempt instead of skipping a sequence."
        return "preempt only when a running sequence cannot get its next slot."
    if set(gp) - set(wp):
        return ("admit in arrival order and stop at the first waiting sequence that does not "
                "fit (first come, first served), within max_batch and the prefill budget.")
    if set(wp) - set(gp):
        return ("admit every waiting sequence that fits, in arrival order: sched.can_admit(seq) "
                "checks the batch slot and the blocks.")
    if gd != wd:
        return "every running sequence, oldest first, decodes in every step it is not preempted."
    return "compare your decisions with the rules in the exercise text."


def static_policy(fn):
    """Exercise 4.1: ``static_policy(sched, now) -> Step`` (request-level batching)."""
    def cases(f):
        for trace in _TRACES:
            want, _ = _replay(scheduler.static_policy, trace)
            got, sched = _call(f, trace)
            _compare("static_policy", got, want, trace, _static_hint)
            expect_equal(f"free blocks after {_where(trace)}", sched.memory.num_free,
                         sched.memory.num_blocks, hint="retire every member when the batch ends.")
    return run_check("4.1", "static_policy", fn, scheduler.static_policy, cases,
                     success="no one joins a batch in flight, and padding rows wait for the longest.")


def continuous_policy(fn):
    """Exercise 4.2: ``continuous_policy(sched, now) -> Step``, with preemption by recompute."""
    def cases(f):
        for trace in _TRACES:
            want, _ = _replay(scheduler.continuous_policy, trace)
            got, sched = _call(f, trace)
            _compare("continuous_policy", got, want, trace, _continuous_hint)
            expect_equal(f"free blocks after {_where(trace)}", sched.memory.num_free,
                         sched.memory.num_blocks, hint="a finished or preempted sequence "
                         "must give its blocks back (the Scheduler's actions do).")
        # The check that matters most: real tokens, under memory pressure, equal generating alone.
        requests = _requests(7, 8, 12, 12, 0.0)
        run = serve(tiny_model(), requests, ServingConfig(num_blocks=8, block_size=4, max_batch=6,
                                                      policy=f))
        if run.num_preemptions == 0:
            raise CheckFailed("8 requests in 8 blocks of 4 tokens ran without a single "
                              "preemption, which cannot fit.\n  Hint: check that you call "
                              "sched.preempt when sched.can_append(seq) is False.")
        for request, result in zip(requests, run.results):
            expect_equal(f"the tokens of request {result.request_id} (preempted "
                         f"{result.num_preemptions} times)", list(result.tokens),
                         list(alone(request.prompt, request.max_new_tokens)),
                         hint="with the same scheduler decisions the engine recomputes a "
                              "preempted request from its prompt and output; a difference "
                              "means a sequence was run at the wrong time.")
    return run_check("4.2", "continuous_policy", fn, scheduler.continuous_policy, cases,
                     success="under memory pressure every request's tokens equal generating it "
                             "alone, preemptions included.")


_STAMPS = [(0.0, [0.5, 0.6, 0.7, 1.0]), (2.0, [2.25]), (1.0, [3.0, 3.5]),
           (0.3, [0.4 + 0.01 * i for i in range(20)])]


def request_metrics(fn):
    """Exercise 4.3a: ``request_metrics(arrival_s, token_times_s) -> (ttft, tpot, latency)``."""
    def cases(f):
        for arrival, times in _STAMPS:
            got = f(arrival, list(times))
            if not isinstance(got, tuple) or len(got) != 3:
                raise CheckFailed(f"request_metrics({arrival}, {times}) returned {got!r}; "
                                  "expected a tuple (ttft, tpot, latency).")
            ttft, tpot, latency = got
            call = f"request_metrics({arrival}, {[round(t, 3) for t in times]})"
            expect_close(f"{call} TTFT", ttft, metrics.ttft(arrival, times), rel=1e-9,
                         abs_tol=1e-12, unit=" s", hint="from the arrival to the first token.")
            want = metrics.tpot(times)
            if np.isnan(want):
                if not (isinstance(tpot, float) and np.isnan(tpot)):
                    raise CheckFailed(f"{call} TPOT returned {tpot!r}, expected nan.\n  Hint: a "
                                      "one-token answer has no gap between tokens, so no time "
                                      "per output token: return float('nan'), which the "
                                      "percentiles then leave out.")
            else:
                hint = "(last - first) / (n - 1): the gaps AFTER the first token."
                if abs(float(tpot) - (times[-1] - times[0]) / len(times)) < 1e-12:
                    hint = "there are n - 1 gaps between n tokens, not n."
                expect_close(f"{call} TPOT", tpot, want, rel=1e-9, unit=" s", hint=hint)
            expect_close(f"{call} latency", latency, metrics.latency(arrival, times), rel=1e-9,
                         unit=" s", hint="from the arrival to the last token.")

    def reference(arrival_s, token_times_s):
        t = metrics.RequestTiming(arrival_s, tuple(token_times_s))
        return t.ttft, t.tpot, t.latency

    return run_check("4.3a", "request_metrics", fn,
                     lends(reference, metrics.ttft, metrics.tpot, metrics.latency,
                           metrics.RequestTiming), cases)


def percentile(fn):
    """Exercise 4.3b: ``percentile(values, q)`` with linear interpolation between ranks."""
    rng = np.random.default_rng(0)
    samples = [[3.0, 1.0, 2.0], [5.0], list(rng.exponential(1.0, 37)), list(rng.normal(0, 1, 100))]

    def cases(f):
        for values in samples:
            for q in (0, 50, 95, 99, 100):
                want = float(np.percentile(values, q))
                got = f(list(values), q)
                hint = ("sort the values; the q-th percentile sits at rank q/100 * (n - 1); "
                        "interpolate linearly between the two ranks around it.")
                try:
                    if abs(float(got) - np.percentile(values, q,
                                                  method="nearest")) < 1e-12 and got != want:
                        hint = "you took the nearest rank; interpolate between the two ranks."
                except (TypeError, ValueError):
                    pass
                expect_close(f"percentile(<{len(values)} values>, {q})", got, want, rel=1e-9,
                             abs_tol=1e-12, hint=hint)

    return run_check("4.3b", "percentile", fn, metrics.percentile, cases,
                     success="p99 of a hundred requests is the second-worst, give or take.")


def static_slot_utilisation(fn):
    """Exercise 4.4: the useful share of decode slots under static batching."""
    rng = np.random.default_rng(1)
    cases_ = [([1, 3], 2), ([5, 5, 5], 2), ([4, 1, 1, 1, 9], 2), ([1, 2, 3], 1),
              ([int(x) for x in rng.integers(1, 100, 50)], 8)]

    def cases(f):
        for lens, b in cases_:
            want = formulas.static_slot_utilisation(lens, b)
            got = f(list(lens), b)
            hint = ("group the requests in arrival order, batch_size at a time; each group "
                    "holds len(group) slots for max(group) steps; divide the useful tokens by "
                    "the slots held.")
            try:
                if abs(float(got) - sum(lens) / (len(lens) * max(lens))) < 1e-12 and got != want:
                    hint = "each group waits for ITS longest member, not the longest overall."
            except (TypeError, ValueError):
                pass
            expect_close(f"static_slot_utilisation({lens if len(lens) < 8 else '<50 lengths>'}, "
                         f"{b})", got, want, rel=1e-9, hint=hint)

    return run_check("4.4", "static_slot_utilisation", fn, formulas.static_slot_utilisation,
                     cases)


def overlapped_step_s(fn):
    """Exercise 4.5: seconds per step ``(without, with)`` one step of lookahead."""
    pairs = [(2e-3, 17e-3), (4e-3, 60e-3), (5e-3, 1e-3), (3e-3, 3e-3), (0.0, 8e-3)]

    def cases(f):
        for host, device in pairs:
            got = f(host, device)
            if not isinstance(got, tuple) or len(got) != 2:
                raise CheckFailed(f"overlapped_step_s({host}, {device}) returned {got!r}; "
                                  "expected a tuple (without, with).")
            want = formulas.overlapped_step_s(host, device)
            call = f"overlapped_step_s(host={host * 1e3:g} ms, device={device * 1e3:g} ms)"
            expect_close(f"{call}, without overlap", got[0], want[0], rel=1e-9, abs_tol=1e-15,
                         unit=" s", hint="without overlap the host's work and the device's run "
                         "one after the other: they add.")
            hint = "with one step of lookahead each step's host work runs during the device's " \
                   "work of the step before: the step takes the LONGER of the two."
            if abs(float(got[1]) - min(host, device)) < 1e-15 and host != device:
                hint = "the overlapped step is as long as the longer part, not the shorter."
            expect_close(f"{call}, with overlap", got[1], want[1], rel=1e-9, abs_tol=1e-15,
                         unit=" s", hint=hint)

    return run_check("4.5", "overlapped_step_s", fn, formulas.overlapped_step_s, cases,
                     success="the saving is the shorter part: min(host, device) a step.")
