"""What ``/metrics`` exports: the engine's state and its requests' latencies, for Prometheus.

Each server has its own ``CollectorRegistry`` (so that several servers in one process, as in
the tests, do not collide). Gauges are read from the engine when Prometheus scrapes them:
requests running and waiting, KV blocks in use out of the pool. Histograms take every finished
request's TTFT, time per output token and end-to-end latency, as the engine stamped them; a
counter counts requests by tenant and how they ended (``stop``, ``length``, ``abort``,
``error``, ``rejected``), and two more the prompt tokens taken and the tokens generated (the
throughput an operator graphs as a rate). Queue depth and KV utilisation are the signals to alert and autoscale on;
Chapter 9 explains why GPU utilisation is not.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Bucket edges in seconds: from a fast CPU token to a long queue.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    """The Prometheus series of one server over one ``OnlineEngine``."""

    def __init__(self, engine):
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
        return generate_latest(self.registry)
