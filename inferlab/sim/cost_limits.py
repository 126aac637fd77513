"""What held a simulated server's batch down, read from its own stored search.

Chapter 8's cost of an output token is set by the batch the server ran within its SLO
(``inferlab.sim.token_cost``). Why that batch and not a larger one is a question each row
answers for itself, from its own record (``data/simulations/ch08_costs.json``), not from a
general story:

- **max batch**: the mean batch is at the configured cap (``max_batch`` sequences);
- **KV memory**: the mean batch is at the number of requests the cache's blocks can hold;
- otherwise the rate is what stops the batch from growing (Little's law: batch = rate x time
  each request decodes), and the search's first rate above the capacity says why that rate
  could not rise. If the server fell behind there (its steady state overloaded or never
  settled), the device's time ran out, and the share of it spent on prompts says whether
  **prefill compute** (half or more of the busy time on prefills or prefill chunks) or the
  **decode steps** took it. If it kept up but missed the SLO, the bound it missed (p95 beyond
  the bound) says **TTFT** or **TPOT**.

The thresholds (90% of a cap, half of the busy time, the p95) are OUR choice of what counts as
"at" a limit; ``BatchLimit`` keeps the numbers, so a reader can judge.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.sim.steady_state import SLOCapacity, Window

AT_CAP = 0.9           # a mean batch this close to a cap counts as held there
PREFILL_MAJORITY = 0.5


@dataclass(frozen=True)
class BatchLimit:
    """What held the batch down, and the numbers the verdict was read from."""

    reason: str            # "max batch", "KV memory", "prefill compute", "decode steps",
                           # "TTFT bound", "TPOT bound"
    mean_batch: float      # at the capacity
    max_batch: int
    fits: int              # requests of the case's lengths the KV blocks hold
    prefill_share: float   # of the busy time at the capacity
    next_rate: float       # the lowest rate tried above the capacity (nan: none)
    next_status: str       # its steady state's status ("" when none)

    def __str__(self) -> str:
        return self.reason


def prefill_share(w: Window) -> float:
    """Share of the busy time spent on prompts (whole prefills, or chunks' share of steps)."""
    busy = w.prefill_s + w.decode_s
    return w.prefill_s / busy if busy else float("nan")


def batch_limit(capacity: SLOCapacity, max_batch: int, fits: int, ttft_s: float,
                tpot_s: float) -> BatchLimit:
    """Read what held the batch down from a search's own probes (``capacity_at_slo``)."""
    w = capacity.window
    share = prefill_share(w)
    above = sorted((p for p in capacity.probes if p.rate > capacity.rate), key=lambda p: p.rate)
    nxt = above[0] if above else None
    info = dict(mean_batch=w.mean_batch, max_batch=max_batch, fits=fits, prefill_share=share,
                next_rate=nxt.rate if nxt else float("nan"),
                next_status=nxt.status if nxt else "")
    if w.mean_batch >= AT_CAP * min(max_batch, fits):
        return BatchLimit("max batch" if max_batch <= fits else "KV memory", **info)
    if nxt is None or not nxt.stable:
        return BatchLimit("prefill compute" if share >= PREFILL_MAJORITY else "decode steps",
                          **info)
    missed = nxt.window
    ttft_over = missed.ttft.p95 / ttft_s
    tpot_over = missed.tpot.p95 / tpot_s
    return BatchLimit("TTFT bound" if ttft_over >= tpot_over else "TPOT bound", **info)
