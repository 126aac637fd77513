"""Steady state: serve a Poisson stream long enough that what is measured stops changing.

The course's one steady-state machinery: Chapter 4's capacity, Chapter 7's goodput per GPU (a
simulated cluster, ``inferlab.sim.goodput``) and Chapter 8's costs all use this window, this
criterion and this search. What serves the requests is any ``Serve``: a function from a trace
to a ``Run`` (``simulated(costs, config)`` for one simulated engine, a cluster's
``inferlab.sim.disaggregation.clustered``).

A finite trace begins with an empty server (warm-up: short queues, small batches) and ends
with a drain (nobody arrives, the backlog is worked off). Neither is the service an operator
runs, and at an offered load above what the server can sustain a short trace hides the worst of
it: the queue grows for as long as requests keep arriving, so every latency depends on how long
the trace was, and a run looks healthy only because the trace ends. This module measures the
part in between, and keeps making the trace longer until the measurement stops moving:

- ``Workload`` (``inferlab.sim.workloads``): where request lengths come from, and
  ``Workload.requests(n, rate)``: ``n`` requests with Poisson arrivals. A longer trace extends a
  shorter one (same seed, same first requests), so growing the trace only adds to it.
- ``window``: one run, whatever served it, summarised over a window that leaves out the first
  ``warmup`` and the last ``cooldown`` share of the arrival period (the one warm-up and
  cool-down rule); ``measure`` serves a trace and measures it. Offered load is what arrived in
  the window; achieved throughput is what was produced in it (output tokens stamped, prompts
  prefilled, requests finished), so a server that falls behind shows achieved below offered.
  Latencies and SLO attainment are those of the requests that arrived in the window, followed
  to their last token.
- ``steady_state``: ``measure`` at n, 2n, 4n, ... requests until two successive lengths agree
  (``Criterion``: both of at least 800 requests; achieved over offered output tokens/s within
  3%, p50 and p99 end-to-end latency within 5% and 10%, neither the wait for the first token
  nor the second token's wait beyond one step growing past its tolerance (``queue_growing``), SLO attainment within 0.02, and neither falling behind), or until the
  server is shown to be *overloaded*: achieved more than 5% below offered at two successive
  lengths, by a shortfall the longer trace does not wear down at all, while the p99 latency
  and one of those two waits keep growing with the trace, or until ``n_max`` (*not
  converged*). Every length's window is kept, as the evidence. (A warm-up's shortfall shrinks
  as the trace doubles; a rule that let it shrink by a quarter called a server overloaded
  while its batches were still filling.)
- ``verdict``: whether a rate *meets* the SLO, *misses* it, or the windows *cannot tell*
  (below); ``capacity_at_slo``: the highest offered rate that meets it (goodput's capacity, as
  DistServe, Zhong et al. OSDI 2024, defines it: ``target`` of the requests within the SLO),
  found by bisection on the rate; ``sweep`` measures a list of rates; ``misled``: whether the
  shortest trace alone would have given another verdict than the longer ones.

A steady state that is *established* (two lengths agree) is not what a verdict needs. At a high
rate a fixed request count is a short stretch of simulated time, and two things keep a trace
from settling that say nothing about the SLO: achieved over offered still climbing from the
warm-up (0.97 at 1,600 requests, 1.01 at 3,200), and a median latency that moves by more than
5% from one length to the next through sampling noise in heavy-tailed answer lengths. Counting
every such rate as a failure put a capacity wherever noise crossed a threshold, in Chapter 7 up
to five times below the rate where the SLO binds. So ``verdict`` reads what the mechanism says:

- *meets*: established with ``target`` met; or, not established, ``target`` met at the two
  longest lengths, the longest carrying the load (achieved within the throughput tolerance of
  offered), and no sign of a queue building up between them: the p99 latency, the time to
  first token and the second token's wait beyond one step (``queue_growing``) not growing
  past their tolerances, the attainment not falling
  by more than ``attainment_drift``. What failed to settle then is a number the SLO does not
  depend on. (A rate a little above what the server can sustain keeps up within a few per
  cent and meets the SLO on any one trace; its queue, and so its time to first token, grows
  with the trace. Judged on the end-to-end p99 alone, which is mostly decode steps, such a
  rate passed with its TTFT doubling from one length to the next. Judged on the TTFT as well,
  a split whose decode pool fell behind still passed: its prefill instances answer at once,
  and the queue is between a request's first token and its second.)
- *misses*: established or overloaded with ``target`` missed; or ``target`` missed at the two
  longest lengths (a longer trace only adds queueing, so it cannot rescue a rate that misses).
- *cannot tell*: anything else (attainment crossing the target between the two lengths, or the
  tail growing while the target is still met: a slow overload looks like that). The search grows
  such a probe's trace, doubling it up to ``extend`` more times; a rate still undecided counts as
  a miss, so the answer can be low by the bracket's resolution but never rests on a rate that was
  not shown to meet.

Growing only the undecided probes keeps the cost bounded: a rate far from the answer is decided
at the ordinary lengths. (The other way out, a fixed simulated duration rather than a fixed
request count, makes every high-rate probe as dear as its duration and still leaves the median's
noise; it would also change every stored length.)

``inferlab.sim.records`` writes these results to JSON and reads them back; ``inferlab.sim.sweeps``
runs Chapter 4's sweep with them and stores it in ``data/``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from inferlab.serving.config import ServingConfig
from inferlab.serving.run import Run
from inferlab.serving.metrics import SLO, Percentiles
from inferlab.serving.request import Request
from inferlab.sim.simulator import CostModel, Resumable
from inferlab.sim.workloads import Workload  # noqa: F401  (re-exported: the steady-state API)

Serve = Callable[[list[Request]], Run]   # serves a trace: one engine, or a whole cluster


def simulated(costs: CostModel, config: ServingConfig) -> Serve:
    """One engine with ``config``, its steps timed by ``costs`` (``inferlab.sim.simulator``).
    It serves a trace that extends one it served before from where that one's last arrival
    found the engine (``Resumable``: the same ``Run`` as ``simulate``, in about half the time
    for a search that doubles its trace)."""
    return Resumable(costs, config)


@dataclass(frozen=True)
class Window:
    """One run, measured between warm-up and drain. Rates are per second of simulated time."""

    n_requests: int               # requests in the trace
    window_requests: int          # of which arrived inside the window
    duration_s: float             # the window's length
    offered_req_s: float
    offered_in_tok_s: float       # prompt tokens arriving per second
    offered_out_tok_s: float      # output tokens asked for per second
    achieved_req_s: float         # requests finished inside the window, per second
    achieved_in_tok_s: float      # prompt tokens of requests first prefilled in the window
    achieved_out_tok_s: float     # output tokens produced inside the window
    ttft: Percentiles             # of the requests that arrived in the window
    tpot: Percentiles
    gap: Percentiles              # first token to second: in a split, the hand-off and the
                                  # wait for a place in the decode pool
    latency: Percentiles
    slo_attainment: float         # share of window arrivals within the SLO (NaN without one)
    goodput_req_s: float          # window arrivals within the SLO, per second (the in-SLO rate
                                  # of this window; goodput proper is the search's result)
    mean_batch: float             # sequences per decode step inside the window
    prefill_s: float              # busy time inside the window spent on prefills
    decode_s: float               # and on decode steps (the rest of the window was idle);
                                  # a cluster's Run logs no steps: 0 for all three
    preemptions: int              # in the whole run
    split: bool = False           # decoded on other instances than the prefill (a disaggregated
                                  # cluster): the second token waits in the decode pool's queue

    @property
    def saturated(self) -> bool:
        """Achieved output more than 5% below offered: the server is falling behind."""
        return self.achieved_out_tok_s < 0.95 * self.offered_out_tok_s

    @property
    def busy_share(self) -> float:
        return (self.prefill_s + self.decode_s) / self.duration_s


def measure(requests: list[Request], serve: Serve, slo: SLO | None = None,
            warmup: float = 0.2, cooldown: float = 0.1) -> Window:
    """Serve ``requests`` (``serve``: one simulated engine or a cluster) and measure ``window``."""
    return window(requests, serve(requests), slo, warmup, cooldown)


def window(requests: list[Request], run: Run, slo: SLO | None = None, warmup: float = 0.2,
           cooldown: float = 0.1) -> Window:
    """``run`` (of ``requests``, in their order) measured between warm-up and drain.

    The window runs from ``warmup`` to ``1 - cooldown`` of the time of the last arrival. The
    run itself goes on to the end, so every request that arrived in the window is followed to
    its last token, however long the queue it met. A chunked step (one forward over decodes and
    prefill chunks) is split between the phases in proportion to the tokens each put through it.
    """
    if not (0 <= warmup and 0 <= cooldown and warmup + cooldown < 1):
        raise ValueError(f"need warmup, cooldown >= 0 with warmup + cooldown < 1, got "
                         f"{warmup}, {cooldown}")
    refused = [r.error for r in run.results if not r.ok]
    if refused:
        raise ValueError(f"{len(refused)} requests were refused, e.g.: {refused[0]}")
    end = max(r.arrival_s for r in requests)
    t0, t1 = warmup * end, (1 - cooldown) * end
    duration = t1 - t0
    if duration <= 0:
        raise ValueError("the trace's arrivals span no time: give it more than one request")
    inside = lambda t: t0 <= t < t1  # noqa: E731
    arrived = [(req, res) for req, res in zip(requests, run.results) if inside(req.arrival_s)]
    if not arrived:
        raise ValueError("no request arrived inside the window: make the trace longer")
    timings = [res.timing for _, res in arrived]
    out_tokens = sum(sum(1 for t in res.timing.token_times_s if inside(t)) for res in run.results)
    finished = sum(inside(res.timing.token_times_s[-1]) for res in run.results)
    first_in = sum(len(req.prompt) for req, res in zip(requests, run.results)
                   if inside(res.timing.token_times_s[0]))
    prefill_s = decode_s = 0.0
    steps = rows = 0
    for it in run.iterations:
        if inside(it.start_s):
            for f in it.forwards:  # each forward's time split by its tokens' phases
                prefill_s += f.prefill_share * f.seconds
                decode_s += (1 - f.prefill_share) * f.seconds
            if it.decode_ids:
                steps += 1
                rows += it.decode_batch
    met = sum(slo.met_by(t) for t in timings) if slo is not None else math.nan
    return Window(
        n_requests=len(requests), window_requests=len(arrived), duration_s=duration,
        offered_req_s=len(arrived) / duration,
        offered_in_tok_s=sum(len(req.prompt) for req, _ in arrived) / duration,
        offered_out_tok_s=sum(req.max_new_tokens for req, _ in arrived) / duration,
        achieved_req_s=finished / duration, achieved_in_tok_s=first_in / duration,
        achieved_out_tok_s=out_tokens / duration,
        ttft=Percentiles.of(t.ttft for t in timings), tpot=Percentiles.of(t.tpot for t in timings),
        gap=Percentiles.of(t.token_times_s[1] - t.token_times_s[0] for t in timings
                           if len(t.token_times_s) > 1),
        latency=Percentiles.of(t.latency for t in timings),
        slo_attainment=met / len(arrived) if slo is not None else math.nan,
        goodput_req_s=met / duration if slo is not None else math.nan,
        mean_batch=rows / steps if steps else 0.0, prefill_s=prefill_s, decode_s=decode_s,
        preemptions=run.num_preemptions, split=run.split)


@dataclass(frozen=True)
class Criterion:
    """When two successive trace lengths count as one steady state, or as an overload.

    No verdict is drawn from a trace shorter than ``min_requests``: a short trace is mostly
    warm-up, and a server still filling its batch also produces less than is offered.
    Throughput is compared as achieved over offered: the offered load itself differs from one
    trace length to the next (Poisson arrivals, random lengths), and a server that keeps up
    follows it.
    """

    throughput_rtol: float = 0.03   # achieved over offered output tokens/s
    p50_rtol: float = 0.05          # median end-to-end latency
    p99_rtol: float = 0.10          # p99 end-to-end latency (a tail moves more)
    attainment_atol: float = 0.02   # SLO attainment, as a share of requests
    min_requests: int = 800         # the shorter trace of a pair at least this long
    shortfall_kept: float = 1.0     # overload: the shortfall does not shrink at all
    attainment_drift: float = 0.01  # a verdict without a steady state: attainment may fall
                                    # by this much between the two longest traces (about two
                                    # standard errors of a 98% share over 1,000 requests)
    wait_p50_rtol: float = 0.05     # the wait for the first token (``queue_growing``):
    wait_p99_rtol: float = 0.10     # median and p99
    gap_excess_rtol: float = 0.05   # in a split, the wait for the second token beyond one
                                    # step's time, as a share of that wait (``queue_growing``)

    def agree(self, a: Window, b: Window) -> bool:
        """Both long enough, neither falling behind, and every tracked number within bounds."""
        if a.n_requests < self.min_requests or a.saturated or b.saturated:
            return False
        close = lambda x, y, rtol: abs(x - y) <= rtol * max(abs(x), abs(y))  # noqa: E731
        kept = lambda w: w.achieved_out_tok_s / w.offered_out_tok_s  # noqa: E731
        ok = (close(kept(a), kept(b), self.throughput_rtol)
              and close(a.latency.p50, b.latency.p50, self.p50_rtol)
              and close(a.latency.p99, b.latency.p99, self.p99_rtol)
              and not self.queue_growing(a, b))
        if not math.isnan(a.slo_attainment):
            ok = ok and abs(a.slo_attainment - b.slo_attainment) <= self.attainment_atol
        return ok

    def queue_growing(self, a: Window, b: Window) -> bool:
        """A queue builds up between the two windows. In front of the prefill it shows in the
        time to first token: its median or p99 grew past the tolerance. In a split (both
        windows ``split``) a queue also forms in front of the decode pool, and it shows only
        after the first token (the prefill instance answers at once, and the request then waits
        for a place to decode): the median wait from the first token to the second, less the
        median time per output token (what one step takes anyway), grew by more than
        ``gap_excess_rtol`` of that wait. One engine has no such queue: its second token comes
        from the next step that holds the sequence, and that step grows with the batch and with
        the prefill chunks it carries, which is not a queue (read as one, the rule refused
        Llama-3-8B on an H100 at 28 req/s under a 15 ms TPOT bound because that wait went from
        10 to 17 ms while the first token's did not move). The end-to-end latency, mostly decode
        steps, can hide a doubling of either wait."""
        first = (b.ttft.p50 > (1 + self.wait_p50_rtol) * a.ttft.p50
                 or b.ttft.p99 > (1 + self.wait_p99_rtol) * a.ttft.p99)
        if first or not (a.split and b.split):
            return first
        excess = lambda w: max(0.0, w.gap.p50 - w.tpot.p50)  # noqa: E731
        return excess(b) - excess(a) > self.gap_excess_rtol * a.gap.p50

    def overloaded(self, a: Window, b: Window) -> bool:
        """Both long enough and falling behind, by a shortfall the longer trace does not wear
        down at all (a warm-up's shortfall shrinks when the trace doubles; a true overload's
        stays, since the server finishes at its own rate whatever arrives), while the p99
        latency and the wait for the first token grow with the trace."""
        if a.n_requests < self.min_requests or not (a.saturated and b.saturated):
            return False
        short = lambda w: 1 - w.achieved_out_tok_s / w.offered_out_tok_s  # noqa: E731
        return (short(b) >= self.shortfall_kept * short(a)
                and b.latency.p99 > (1 + self.p99_rtol) * a.latency.p99
                and self.queue_growing(a, b))


STABLE, OVERLOADED, UNSETTLED = "stable", "overloaded", "not converged"


@dataclass(frozen=True)
class SteadyState:
    """The windows measured at growing trace lengths, and what they came to."""

    rate: float
    status: str                       # STABLE, OVERLOADED or UNSETTLED
    history: tuple[Window, ...]       # one window per trace length, shortest first

    @property
    def window(self) -> Window:
        """The longest trace's window: the measurement to report."""
        return self.history[-1]

    @property
    def stable(self) -> bool:
        return self.status == STABLE


def _settled(history: list[Window], criterion: Criterion) -> str:
    """The status the two longest windows of ``history`` give (``UNSETTLED`` if they do not)."""
    if len(history) >= 2:
        a, b = history[-2], history[-1]
        if criterion.overloaded(a, b):
            return OVERLOADED
        if criterion.agree(a, b):
            return STABLE
    return UNSETTLED


def steady_state(workload: Workload, rate: float, serve: Serve, slo: SLO | None = None,
                 n0: int = 400, n_max: int = 6400, seed: int = 0,
                 criterion: Criterion = Criterion(), warmup: float = 0.2,
                 cooldown: float = 0.1) -> SteadyState:
    """``measure`` at ``n0``, ``2 n0``, ... requests until ``criterion`` says two agree."""
    history: list[Window] = []
    n = n0
    while True:
        history.append(measure(workload.requests(n, rate, seed), serve, slo, warmup, cooldown))
        status = _settled(history, criterion)
        if status != UNSETTLED:
            return SteadyState(rate, status, tuple(history))
        if 2 * n > n_max:
            return SteadyState(rate, UNSETTLED, tuple(history))
        n *= 2


def longer(state: SteadyState, workload: Workload, serve: Serve, slo: SLO | None = None,
           seed: int = 0, criterion: Criterion = Criterion(), warmup: float = 0.2,
           cooldown: float = 0.1) -> SteadyState:
    """``state`` with one more window, at twice its longest trace (which extends the others)."""
    history = list(state.history)
    n = 2 * history[-1].n_requests
    history.append(measure(workload.requests(n, state.rate, seed), serve, slo, warmup, cooldown))
    return SteadyState(state.rate, _settled(history, criterion), tuple(history))


def sweep(workload: Workload, rates, serve: Serve, slo: SLO | None = None,
          **kw) -> list[SteadyState]:
    """``steady_state`` at each of ``rates``."""
    return [steady_state(workload, r, serve, slo, **kw) for r in rates]


@dataclass(frozen=True)
class SLOCapacity:
    """The highest rate found whose steady state meets the SLO, and the probes that found it."""

    rate: float                        # requests per second (0.0: not even the lowest probe)
    state: SteadyState | None          # the steady state at ``rate``
    probes: tuple[SteadyState, ...]    # every rate tried, in the order tried
    target: float = 0.9                # the share of requests to keep within the SLO
    criterion: Criterion = Criterion() # the steady state's criterion, which the verdicts use

    @property
    def window(self) -> Window | None:
        return None if self.state is None else self.state.window

    def verdict(self, probe: SteadyState) -> str:
        """``verdict`` of one of the probes, with the search's own target and criterion."""
        return verdict(probe, self.target, self.criterion)


MEETS, MISSES, UNDECIDED = "meets", "misses", "cannot tell"


def verdict(state: SteadyState, target: float, criterion: Criterion = Criterion()) -> str:
    """``MEETS``, ``MISSES`` or ``UNDECIDED``: does ``state``'s rate keep ``target`` of the
    requests within the SLO (the module's docstring gives the rules)."""
    b = state.window
    if state.status == OVERLOADED:
        return MISSES
    if state.status == STABLE:
        return MEETS if b.slo_attainment >= target else MISSES
    if len(state.history) < 2 or state.history[-2].n_requests < criterion.min_requests:
        return UNDECIDED
    a = state.history[-2]
    met = [w.slo_attainment >= target for w in (a, b)]
    if not any(met):
        return MISSES
    carried = b.achieved_out_tok_s >= (1 - criterion.throughput_rtol) * b.offered_out_tok_s
    queue_steady = (b.latency.p99 <= (1 + criterion.p99_rtol) * a.latency.p99
                    and not criterion.queue_growing(a, b)
                    and b.slo_attainment >= a.slo_attainment - criterion.attainment_drift)
    return MEETS if all(met) and carried and queue_steady else UNDECIDED


def first_verdict(state: SteadyState, target: float) -> str:
    """What the shortest trace alone says: ``MEETS`` if ``target`` met and keeping up."""
    w = state.history[0]
    return MEETS if w.slo_attainment >= target and not w.saturated else MISSES


def misled(state: SteadyState, target: float, criterion: Criterion = Criterion()) -> str | None:
    """``"over"`` if the shortest trace alone would have passed a rate that the longer traces
    showed to miss, ``"under"`` if it would have failed one they showed to meet, else None (the
    same verdict, or the longer traces could not tell)."""
    final = verdict(state, target, criterion)
    if final == UNDECIDED or final == first_verdict(state, target):
        return None
    return "over" if final == MISSES else "under"


def saturation_estimate(workload: Workload, costs: CostModel, config: ServingConfig) -> float:
    """A quick upper estimate of the requests/s a server can sustain, to start a search from.

    At its largest batch B (``max_batch``, or fewer if the pool cannot hold B requests of mean
    length), a request costs its prefill plus its share of ``output`` decode steps of B:
    1 / (prefill(P) + O x decode(B, B x (P + O/2)) / B), with P and O the mean lengths.
    """
    p, o = workload.mean_lengths
    batch = config.max_batch
    if config.num_blocks is not None:
        batch = max(1, min(batch, int(config.num_blocks * config.block_size // (p + o))))
    context = int(batch * (p + o / 2))
    per_request = costs.prefill_s(int(round(p))) + o * costs.decode_s(batch, context) / batch
    return 1.0 / per_request


def capacity_at_slo(workload: Workload, serve: Serve, slo: SLO, start: float,
                    target: float = 0.9, rtol: float = 0.05, max_probes: int = 16,
                    extend: int = 2, **kw) -> SLOCapacity:
    """The highest offered rate (requests/s) whose steady state keeps ``target`` within ``slo``.

    Each rate tried is a ``steady_state`` (keyword arguments go to it) and gets a ``verdict``;
    one the windows cannot tell is grown, doubling its trace up to ``extend`` times past
    ``n_max``, and counts as a miss if still undecided. From ``start`` (for one engine, half of
    ``saturation_estimate`` is a good one) the rate goes up by 1.5x until one misses, or down by
    2x until one meets; then the bracket is bisected geometrically until its ends are within
    ``rtol``. Assumes attainment falls as the rate grows: the answer is a rate that met with
    every rate above it that was tried a miss.
    """
    criterion = kw.get("criterion", Criterion())
    grow = {k: kw[k] for k in ("seed", "warmup", "cooldown") if k in kw}
    probes: list[SteadyState] = []

    def meets(rate: float) -> tuple[bool, SteadyState]:
        if len(probes) >= max_probes:
            raise RuntimeError(f"no bracket within {max_probes} probes: rates tried "
                               f"{[round(p.rate, 4) for p in probes]}")
        state = steady_state(workload, rate, serve, slo, **kw)
        for _ in range(extend):
            if verdict(state, target, criterion) != UNDECIDED:
                break
            state = longer(state, workload, serve, slo, criterion=criterion, **grow)
        probes.append(state)
        return verdict(state, target, criterion) == MEETS, state

    def result(good: SteadyState | None) -> SLOCapacity:
        return SLOCapacity(0.0 if good is None else good.rate, good, tuple(probes), target,
                           criterion)

    rate = start
    ok, state = meets(rate)
    good, bad = (state, None) if ok else (None, state)
    while good is None:
        rate /= 2
        ok, state = meets(rate)
        if ok:
            good = state
        else:
            bad = state
        if good is None and rate < 1e-6:
            return result(None)
    while bad is None:
        rate *= 1.5
        ok, state = meets(rate)
        if ok:
            good = state
        else:
            bad = state
    while bad.rate / good.rate > 1 + rtol:
        ok, state = meets(math.sqrt(good.rate * bad.rate))
        if ok:
            good = state
        else:
            bad = state
    return result(good)
