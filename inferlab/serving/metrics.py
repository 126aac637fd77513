"""What serving operators watch: TTFT, time per output token, end-to-end latency, throughput.

A serving engine stamps the wall-clock time at which each output token of a request becomes
available (streamed to the user). Everything here is computed from those stamps and the
request's arrival time:

- **TTFT** (time to first token) = first stamp - arrival: queueing plus prefill. It is what a
  chat user feels before anything appears.
- **TPOT** (time per output token) = (last stamp - first stamp) / (tokens - 1): the average gap
  between tokens once streaming has started (undefined for a one-token answer). It is the
  decode speed a user reads at.
- **Latency** (end to end) = last stamp - arrival.
- **Largest gap** = the longest wait between two consecutive tokens of one request: a
  *generation stall*, which a mean TPOT hides (Chapter 7: another request's prefill).
- **Throughput** = output tokens of all requests / the time from the first arrival to the last
  token; **request rate** the same with requests.
- **In-SLO rate** = requests per second of one run that met a service-level objective (SLO) on
  TTFT and TPOT, and **SLO attainment** their share. *Goodput*, as DistServe (Zhong et al., OSDI
  2024) defines it, is a property of a configuration, not of a run: the highest arrival rate at
  which the attainment stays at a target such as 90% (``inferlab.sim.goodput`` searches for it).

Operators report percentiles (p50, p95, p99) rather than means: a mean hides the tail, and the
tail is what a service promises. Percentiles here use linear interpolation between the two
nearest ranks, the convention of ``numpy.percentile``.

A server exports the same numbers to Prometheus (``ServerMetrics``, what ``/metrics`` of
``inferlab.serve`` answers; ``prometheus_client`` is imported only when one is made). Each
server has its own ``CollectorRegistry``, so that several servers in one process, as in the
tests, do not collide. Gauges are read from the engine when Prometheus scrapes them: requests
running and waiting, KV blocks in use out of the pool (and what a second KV tier holds and
moved). Histograms take every finished request's TTFT, time per output token and end-to-end
latency, as the engine stamped them; a counter counts requests by tenant and how they ended
(``stop``, ``length``, ``abort``, ``error``, ``rejected``), and two more the prompt tokens taken
and the tokens generated (the throughput an operator graphs as a rate). Queue depth and KV
utilisation are the signals to alert and autoscale on; Chapter 9 explains why GPU utilisation
is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

PERCENTILES = (50, 95, 99)


def ttft(arrival_s: float, token_times_s: Sequence[float]) -> float:
    """Time to first token: the first token's stamp minus the arrival time (seconds)."""
    if not token_times_s:
        raise ValueError("a request with no output tokens has no time to first token")
    return token_times_s[0] - arrival_s


def tpot(token_times_s: Sequence[float]) -> float:
    """Time per output token after the first: (last - first) / (n - 1); NaN when n == 1."""
    if not token_times_s:
        raise ValueError("a request with no output tokens has no time per output token")
    n = len(token_times_s)
    return math.nan if n == 1 else (token_times_s[-1] - token_times_s[0]) / (n - 1)


def latency(arrival_s: float, token_times_s: Sequence[float]) -> float:
    """End-to-end latency: the last token's stamp minus the arrival time (seconds)."""
    if not token_times_s:
        raise ValueError("a request with no output tokens has no end-to-end latency")
    return token_times_s[-1] - arrival_s


def largest_gap(token_times_s: Sequence[float]) -> float:
    """The longest wait between two consecutive tokens (seconds); NaN for fewer than 2 tokens."""
    if len(token_times_s) < 2:
        return math.nan
    return max(b - a for a, b in zip(token_times_s, token_times_s[1:]))


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0 <= q <= 100) of ``values``, NaNs dropped; NaN if none remain.

    Sort the values; the percentile sits at fractional rank r = q/100 x (n - 1) and is
    interpolated linearly between the values at ranks floor(r) and ceil(r).
    """
    if not 0 <= q <= 100:
        raise ValueError(f"q must lie in [0, 100], got {q}")
    xs = sorted(v for v in values if not math.isnan(v))
    if not xs:
        return math.nan
    rank = q / 100 * (len(xs) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


@dataclass(frozen=True)
class RequestTiming:
    """One request's arrival and the stamps of its output tokens, in seconds on one clock."""

    arrival_s: float
    token_times_s: tuple[float, ...]

    def __post_init__(self) -> None:
        times = tuple(float(t) for t in self.token_times_s)
        object.__setattr__(self, "token_times_s", times)
        if any(b < a for a, b in zip(times, times[1:])):
            raise ValueError("token times must not decrease")
        if times and times[0] < self.arrival_s:
            raise ValueError(f"the first token ({times[0]:.6f} s) is stamped before the "
                             f"request arrived ({self.arrival_s:.6f} s)")

    @property
    def n_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def ttft(self) -> float:
        return ttft(self.arrival_s, self.token_times_s)

    @property
    def tpot(self) -> float:
        return tpot(self.token_times_s)

    @property
    def latency(self) -> float:
        return latency(self.arrival_s, self.token_times_s)


@dataclass(frozen=True)
class SLO:
    """A service-level objective: first token within ``ttft_s``, then ``tpot_s`` per token."""

    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ValueError(f"SLO bounds must be positive seconds, got {self}")

    def met_by(self, timing: RequestTiming) -> bool:
        """Whether a finished request met both bounds (a one-token answer has no TPOT)."""
        if timing.n_tokens == 0 or timing.ttft > self.ttft_s:
            return False
        return timing.n_tokens == 1 or timing.tpot <= self.tpot_s


@dataclass(frozen=True)
class Percentiles:
    """The mean and the p50, p95 and p99 of one metric, in seconds."""

    mean: float
    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: Iterable[float]) -> "Percentiles":
        xs = [v for v in values if not math.isnan(v)]
        mean = sum(xs) / len(xs) if xs else math.nan
        return cls(mean, *(percentile(xs, q) for q in PERCENTILES))


@dataclass(frozen=True)
class Summary:
    """A serving run in numbers: counts, rates and the three latency metrics' percentiles."""

    n_requests: int
    n_tokens: int
    duration_s: float        # first arrival to last token
    throughput: float        # output tokens per second
    request_rate: float      # finished requests per second
    ttft: Percentiles
    tpot: Percentiles
    latency: Percentiles
    slo: SLO | None = None
    slo_attainment: float = math.nan  # fraction of requests within the SLO
    in_slo_rate: float = math.nan     # requests per second within the SLO (not goodput)

    def row(self) -> dict:
        """A flat dictionary (seconds and per-second rates), for tables and JSON files."""
        out = {"n_requests": self.n_requests, "n_tokens": self.n_tokens,
               "duration_s": self.duration_s, "throughput_tok_s": self.throughput,
               "request_rate": self.request_rate}
        for name in ("ttft", "tpot", "latency"):
            p = getattr(self, name)
            out.update({f"{name}_mean_s": p.mean, f"{name}_p50_s": p.p50,
                        f"{name}_p95_s": p.p95, f"{name}_p99_s": p.p99})
        if self.slo is not None:
            out.update(slo_ttft_s=self.slo.ttft_s, slo_tpot_s=self.slo.tpot_s,
                       slo_attainment=self.slo_attainment, in_slo_req_s=self.in_slo_rate)
        return out

    def __str__(self) -> str:
        ms = 1e3
        text = (f"{self.n_requests} requests, {self.n_tokens} tokens in {self.duration_s:.2f} s: "
                f"{self.throughput:,.1f} tok/s | TTFT p50 {self.ttft.p50 * ms:.0f} ms, "
                f"p99 {self.ttft.p99 * ms:.0f} ms | TPOT p50 {self.tpot.p50 * ms:.1f} ms | "
                f"latency p50 {self.latency.p50 * ms:.0f} ms, p99 {self.latency.p99 * ms:.0f} ms")
        if self.slo is not None:
            text += f" | {self.in_slo_rate:.2f} req/s within the SLO ({self.slo_attainment:.0%})"
        return text


def summarize(timings: Sequence[RequestTiming], slo: SLO | None = None) -> Summary:
    """Throughput, percentiles and (with an SLO) the in-SLO rate of a set of finished requests."""
    done = [t for t in timings if t.n_tokens > 0]
    if not done:
        raise ValueError("no request produced a token: nothing to summarise")
    start = min(t.arrival_s for t in done)
    end = max(t.token_times_s[-1] for t in done)
    duration = end - start
    n_tokens = sum(t.n_tokens for t in done)
    rate = (lambda count: count / duration if duration > 0 else math.inf)
    attainment = in_slo = math.nan
    if slo is not None:
        met = sum(slo.met_by(t) for t in done)
        attainment, in_slo = met / len(done), rate(met)
    return Summary(n_requests=len(done), n_tokens=n_tokens, duration_s=duration,
                   throughput=rate(n_tokens), request_rate=rate(len(done)),
                   ttft=Percentiles.of(t.ttft for t in done),
                   tpot=Percentiles.of(t.tpot for t in done),
                   latency=Percentiles.of(t.latency for t in done),
                   slo=slo, slo_attainment=attainment, in_slo_rate=in_slo)


# -- exported: what a server's ``/metrics`` gives Prometheus ---------------------------------
# Bucket edges in seconds: from a fast CPU token to a long queue.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    """The Prometheus series of one server over one ``OnlineEngine``."""

    def __init__(self, engine):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        Gauge("inferlab_requests_running", "Sequences in the running batch",
              registry=r).set_function(lambda: engine.num_running)
        Gauge("inferlab_requests_waiting", "Requests queued, not yet running",
              registry=r).set_function(lambda: engine.num_waiting)
        Gauge("inferlab_kv_blocks_in_use", "KV cache blocks allocated",
              registry=r).set_function(lambda: engine.blocks_in_use)
        Gauge("inferlab_kv_blocks_total", "KV cache blocks in the pool",
              registry=r).set(engine.cache.num_blocks)
        tier = getattr(engine, "tier", None)
        if tier is not None:  # the second KV tier: what it holds and moved since start-up
            for name, doc in (("blocks", "prefix blocks held in the second KV tier"),
                              ("hits", "prefix blocks reloaded from the second KV tier"),
                              ("misses", "prefix blocks looked up below the pool, not found"),
                              ("bytes_loaded", "bytes copied from the second KV tier"),
                              ("bytes_stored", "bytes copied down to the second KV tier")):
                Gauge(f"inferlab_kv_tier_{name}", doc, registry=r).set_function(
                    lambda name=name: tier.stats()[name])
        self.ttft = Histogram("inferlab_time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("inferlab_time_per_output_token_seconds",
                              "Mean gap between a request's tokens after the first",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("inferlab_e2e_request_latency_seconds", "Arrival to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("inferlab_requests", "Requests by tenant and how they ended",
                                ["tenant", "finish_reason"], registry=r)
        self.prompt_tokens = Counter("inferlab_prompt_tokens",
                                     "Prompt tokens of the requests the engine took", registry=r)
        self.generation_tokens = Counter("inferlab_generation_tokens",
                                         "Tokens the engine generated", registry=r)
        self.num_prompt_tokens = self.num_generation_tokens = 0  # the same, for the stats log

    def tokens(self, prompt: int, generated: int) -> None:
        """Count a request's prompt tokens and the tokens generated for it, when it ends."""
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)
        self.num_prompt_tokens += prompt
        self.num_generation_tokens += generated

    def finished(self, tenant: str, reason: str, timing) -> None:
        """Record a request that ended (``timing``: the engine's ``RequestTiming`` or None)."""
        self.requests.labels(tenant, reason).inc()
        if timing is None:
            return
        self.ttft.observe(timing.ttft)
        self.e2e.observe(timing.latency)
        if timing.n_tokens > 1:
            self.tpot.observe(timing.tpot)

    def rejected(self, tenant: str) -> None:
        self.requests.labels(tenant, "rejected").inc()

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
