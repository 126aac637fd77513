"""Checks for Lab 7, "Prefill and decode apart".

Oracles that need no solution:

- the chunked policy is replayed on fixed traces, with long prompts and too little memory for
  everyone at once, step by step against ``inferlab.serving.scheduler.chunked_policy`` (with a
  hint naming the first rule broken), and it also drives the real engine, whose every output
  must equal generating that request alone (``inferlab.course.checks.oracle``: a 2-layer
  ``tiny`` model in float64, so that no rounding can flip a greedy choice);
- the transfer time against ``inferlab.analysis.formulas.kv_bytes`` over the link;
- the attainment curve against ``inferlab.serving.metrics.SLO.met_by``, request by request.
"""

from __future__ import annotations

import torch

from inferlab.analysis import formulas, request_time
from inferlab.course.checks import CheckFailed, expect_close, expect_equal, lends, run_check
from inferlab.course.checks.oracle import alone, tiny_model
from inferlab.model.config import ModelConfig
from inferlab.serving import scheduler
from inferlab.serving.paged_cache import OutOfBlocksError
from inferlab.serving.config import ServingConfig
from inferlab.serving.interfaces import Runner
from inferlab.serving.engine import serve
from inferlab.serving.loop import StepLoop, VirtualClock
from inferlab.serving.metrics import SLO, RequestTiming
from inferlab.serving.request import Request
from inferlab.serving.scheduler import Scheduler, SchedulingError
from inferlab.sim import goodput

# Points per exercise for the grader's score (inferlab.course.grade; an instructor's
# --weights file overrides them): more for the exercises that are more code.
WEIGHTS = {"7.1": 3, "7.2": 1, "7.3": 2}


def _requests(seed: int, n: int, max_prompt: int, max_new: int, spread_s: float) -> list[Request]:
    """Short and long prompts mixed: every third request has a long one."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        top = max_prompt if i % 3 == 1 else max(2, max_prompt // 8)
        length = int(torch.randint(1, top + 1, (1,), generator=gen))
        prompt = tuple(torch.randint(0, 512, (length,), generator=gen).tolist())
        new = int(torch.randint(1, max_new + 1, (1,), generator=gen))
        out.append(Request(prompt, new, round(spread_s * i / n, 6), f"r{i}"))
    return out


# (seed, requests, num_blocks, block_size, max_batch, token budget): plenty of memory first,
# then too little, so that the policy must preempt while prompts are half computed.
_TRACES = [(0, 6, 200, 4, 3, 8), (1, 9, 14, 4, 4, 12), (2, 10, 24, 2, 5, 6), (3, 8, 40, 8, 2, 20)]


class _FakeRunner(Runner):
    """A model stand-in for replaying a chunked policy: every step is one forward pass."""

    def __init__(self, clock, limit: int):
        self.clock, self.limit, self.steps = clock, limit, 0

    def forward(self, rows):
        self.steps += 1
        if self.steps > self.limit:
            raise CheckFailed(f"the trace did not finish within {self.limit} steps.\n  Hint: "
                              "every step must make progress: decode the running sequences, "
                              "give prompts chunks, and admit waiting ones when there is room.")
        self.clock.advance(1e-3)
        return [len(r.seq.output) + 1 for r in rows]


def _replay(policy, trace):
    """The steps a policy makes: (prefill (id, tokens) pairs, decode ids, preempted ids)."""
    seed, n, num_blocks, block_size, max_batch, budget = trace
    requests = _requests(seed, n, 40, 16, 0.004)
    sched = Scheduler(ServingConfig(block_size=block_size, num_blocks=num_blocks,
                                    max_batch=max_batch, policy=policy, token_budget=budget))
    clock = VirtualClock()
    log = []
    limit = 20 * sum(len(r.prompt) + r.max_new_tokens for r in requests) + 100
    StepLoop(sched, _FakeRunner(clock, limit), clock,
             lambda it: log.append((tuple((r.seq_id, r.new) for r in it.prefill_rows),
                                    it.decode_ids, it.preempted))).run(requests)
    return log, sched


def _where(trace) -> str:
    seed, n, num_blocks, block_size, max_batch, budget = trace
    return (f"{n} requests, {num_blocks} blocks of {block_size} tokens, max_batch={max_batch}, "
            f"token_budget={budget} (trace seed {seed})")


def _call(policy, trace):
    try:
        return _replay(policy, trace)
    except SchedulingError as error:
        raise CheckFailed(f"on {_where(trace)} the scheduler stopped the policy: {error}"
                          "\n  Hint: decode every running sequence whose prompt is computed "
                          "(sched.append_slot), spend at most sched.token_budget tokens (one per "
                          "decode), and give a prefill a chunk with step.prefill(seq, n).") from None
    except OutOfBlocksError as error:
        raise CheckFailed(f"on {_where(trace)} an allocation failed: {error}\n  Hint: ask "
                          "first (sched.can_admit(seq), sched.can_append(seq)).") from None


def _chunk_hint(got, want) -> str:
    (gp, gd, gpre), (wp, wd, wpre) = got, want
    if gpre != wpre:
        return ("when a decoding sequence cannot get its next slot, preempt the latest arrival "
                "(sched.running[-1]), as continuous batching does; prompts being prefilled "
                "already hold all their blocks and need no new ones.")
    if gd != wd:
        return ("decodes come first, every step: each running sequence that is not "
                "prefilling (sched.is_prefilling(seq) is False) gets a slot and decodes.")
    if sum(n for _, n in gp) + len(gd) > sum(n for _, n in wp) + len(wd):
        return "the budget counts every token of the step: one per decode, then the chunks."
    got_ids, want_ids = [s for s, _ in gp], [s for s, _ in wp]
    if got_ids != want_ids and got_ids != want_ids[:len(got_ids)]:
        return ("prefill work goes oldest first: first the prompts begun in earlier steps, then "
                "waiting sequences admitted in arrival order while the budget lasts.")
    return ("give each prefill min(its uncomputed tokens, the budget left): a prompt that "
            "does not fit gets a chunk of what is left, not nothing.")


def chunked_policy(fn):
    """Exercise 7.1: ``chunked_policy(sched, now) -> Step`` with a token budget per step."""
    def cases(f):
        for trace in _TRACES:
            want, _ = _replay(scheduler.chunked_policy, trace)
            got, sched = _call(f, trace)
            for i, (g, w) in enumerate(zip(got, want)):
                if g != w:
                    show = lambda it: (f"prefills (id, tokens)={list(it[0])}, decodes="  # noqa
                                       f"{list(it[1])}, preempted={list(it[2])}")
                    raise CheckFailed(f"chunked_policy on {_where(trace)} differs at step {i}: "
                                      f"it ran {show(g)}; expected {show(w)}.\n  Hint: "
                                      f"{_chunk_hint(g, w)}")
            expect_equal(f"the number of steps on {_where(trace)}", len(got), len(want),
                         hint="the trace ends when the last request finishes.")
            expect_equal(f"free blocks after {_where(trace)}", sched.memory.num_free,
                         sched.memory.num_blocks, hint="use the Scheduler's actions only.")
        requests = _requests(8, 8, 60, 24, 0.0)
        run = serve(tiny_model(), requests, ServingConfig(num_blocks=14, block_size=4, max_batch=4,
                                                      policy=f, token_budget=16))
        if run.num_preemptions == 0:
            raise CheckFailed("8 requests in 14 blocks of 4 tokens ran without a preemption, "
                              "which cannot fit.\n  Hint: preempt the latest arrival when a "
                              "decoding sequence cannot get its next slot.")
        for request, result in zip(requests, run.results):
            expect_equal(f"the tokens of request {result.request_id}", list(result.tokens),
                         list(alone(request.prompt, request.max_new_tokens)),
                         hint="a chunk must continue where the last one stopped; the step "
                              "that computes a prompt's last chunk samples its first token.")
    return run_check("7.1", "chunked_policy", fn, scheduler.chunked_policy, cases,
                     success="no step runs more than its budget, decodes never wait for a "
                             "prompt, and every output equals generating the request alone.")


_LINKS = [("llama-2-13b", 1000, "NVLink A100", "bfloat16"),
          ("llama-3-8b", 4096, "PCIe Gen4 x16", "bfloat16"),
          ("llama-2-70b", 333, "Ethernet 100G", "float32"),
          ("qwen2.5-0.5b", 20000, "InfiniBand NDR", "bfloat16")]


def kv_transfer_seconds(fn):
    """Exercise 7.2: ``kv_transfer_seconds(config, tokens, link_bandwidth, dtype)``, seconds."""
    links = request_time.link_bandwidths()

    def cases(f):
        for name, tokens, link, dtype in _LINKS:
            config = ModelConfig.from_name(name)
            bw = links[link]
            want = formulas.kv_bytes(config, tokens, dtype) / bw
            got = f(config, tokens, bw, dtype)
            hint = ("bytes = 2 (K and V) x layers x KV heads x head_dim x bytes per element x "
                    "tokens, divided by the link's bytes per second.")
            try:
                ratio = float(got) / want
            except (TypeError, ValueError, ZeroDivisionError):
                ratio = None
            if ratio is not None:
                group = config.n_heads // config.n_kv_heads
                if group > 1 and abs(ratio - group) < 1e-6:
                    hint = "the cache stores the KV heads (config.n_kv_heads), not the query heads."
                elif abs(ratio - 0.5) < 1e-6:
                    hint = "keys AND values: a factor of 2."
                elif abs(ratio - 8) < 1e-6 or abs(ratio - 1 / 8) < 1e-6:
                    hint = "the link's bandwidth is in bytes per second already: no bits here."
            expect_close(f"kv_transfer_seconds({name}, {tokens}, {link}, {dtype})", got, want,
                         rel=1e-6, unit=" s", hint=hint)
    reference = lends(lambda config, tokens, link_bandwidth, dtype="bfloat16":
                      request_time.swap_time(config, tokens, link_bandwidth, dtype),
                      request_time.swap_time, formulas.kv_bytes, formulas.kv_bytes_per_token)
    return run_check("7.2", "kv_transfer_seconds", fn, reference, cases)


def _timings() -> list[RequestTiming]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(40):
        arrival = 0.1 * i
        n = 1 if i % 7 == 0 else int(torch.randint(2, 30, (1,), generator=gen))
        first = arrival + float(torch.rand(1, generator=gen)) * 0.6
        gaps = (torch.rand(n - 1, generator=gen) * 0.08).tolist()
        times = [first]
        for g in gaps:
            times.append(times[-1] + g)
        out.append(RequestTiming(arrival, tuple(times)))
    return out


def attainment_curve(fn):
    """Exercise 7.3: ``attainment_curve(timings, ttft_s, tpot_bounds)``: the share of requests
    within the SLO at each TPOT bound."""
    timings = _timings()
    bounds = [0.01, 0.02, 0.03, 0.04, 0.05, 0.08]

    def cases(f):
        for ttft in (0.3, 0.5, 10.0):
            got = f(timings, ttft, bounds)
            want = [sum(SLO(ttft, b).met_by(t) for t in timings) / len(timings) for b in bounds]
            if not hasattr(got, "__len__") or len(got) != len(bounds):
                raise CheckFailed(f"attainment_curve(<40 requests>, {ttft}, {bounds}) returned "
                                  f"{got!r}; expected one share per bound.")
            for b, g, w in zip(bounds, got, want):
                hint = "a request counts when its TTFT AND its TPOT are within the bounds."
                ones = sum(t.n_tokens == 1 and t.ttft <= ttft for t in timings) / len(timings)
                if abs(float(g) - (w - ones)) < 1e-9 and ones:
                    hint = ("a one-token answer has no time per output token (NaN): it meets "
                            "the SLO when its TTFT does.")
                elif abs(float(g) - w * len(timings)) < 1e-9:
                    hint = "return the share of requests (a fraction), not the count."
                expect_close(f"attainment_curve(<40 requests>, ttft_s={ttft}) at TPOT <= "
                             f"{b * 1e3:g} ms", g, w, rel=1e-9, abs_tol=1e-12, hint=hint)

    return run_check("7.3", "attainment_curve", fn, goodput.attainment_curve, cases,
                     success="one simulation gives the whole curve.")
