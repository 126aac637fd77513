"""What held a simulated server's batch down, read from its own stored search.

Chapter 8's cost of an output token is set by the batch the server ran within its SLO
(``inferlab.sim.token_cost``). Why that batch and not a larger one is a question each row
answers for itself, from its own record (``data/simulations/ch08_costs.json``), not from a
general story:

- **max batch**: the mean batch is at the configured cap (``max_batch`` sequences);
- **KV memory**: the mean batch is at the number of requests the cache's blocks can hold;
- otherwise the rate is what stops the batch from growing (Little's law: batch = rate x time
  each request decodes), and the search's first rate above the capacity says why that rate
  could not rise, from its longest trace (``inferlab.sim.steady_state``):

  - it fell behind (overloaded, or its longest window served less than was offered): the
    **device's time** ran out. Which phase took most of it depends on how a shared step's time
    is split (``inferlab.analysis.cost_split``: by tokens or by kernel time), so the verdict
    names neither; ``prefill_share`` keeps the token split's;
  - it kept up and its longest trace missed the target: the bound it missed (p95 beyond the
    bound) says **TTFT** or **TPOT**, unless a queue built up between its two longest traces
    (``Criterion.queue_growing``), which says the **device's time** ran out. A TPOT miss beside
    a rising wait for the first token is the bound's all the same when the same rate meets
    under a looser TPOT bound (``looser``: a rise of a few percent in a 40 ms wait is not a
    device out of time if loosening the bound alone lets the rate pass). The search
    may have counted such a rate "undecided" (met at the shorter trace, missed at the longer)
    and so as a miss; what held it is read all the same, from the evidence of the longest
    trace;
  - its longest trace still met the target (the search could not decide, and counted it as a
    miss): the search **cannot tell** what would have held the batch at the next rate.

The thresholds (90% of a cap, the p95) are OUR choice of what counts as
"at" a limit; ``BatchLimit`` keeps the numbers, so a reader can judge. ``slo_binds`` says
whether the SLO itself is what the search found, rather than the server's throughput or a cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.sim.steady_state import OVERLOADED, MISSES, UNDECIDED, SLOCapacity, Window

AT_CAP = 0.9           # a mean batch this close to a cap counts as held there
REASONS = ("max batch", "KV memory", "device time", "TTFT bound", "TPOT bound", "cannot tell")


@dataclass(frozen=True)
class BatchLimit:
    """What held the batch down, and the numbers the verdict was read from."""

    reason: str            # one of REASONS
    mean_batch: float      # at the capacity
    max_batch: int
    fits: int              # requests of the case's lengths the KV blocks hold
    prefill_share: float   # of the busy time at the capacity
    next_rate: float       # the lowest rate tried above the capacity (nan: none)
    next_status: str       # its steady state's status ("" when none)
    next_verdict: str = ""  # the search's verdict on it ("" when none)

    def __str__(self) -> str:
        return self.reason

    @property
    def slo_binds(self) -> bool:
        """The next rate kept up with its load and missed a latency bound: the SLO, not the
        server's throughput or a cap, is what the search found."""
        return self.reason in ("TTFT bound", "TPOT bound")


def prefill_share(w: Window) -> float:
    """Share of the busy time spent on prompts (whole prefills, or chunks' share of steps)."""
    busy = w.prefill_s + w.decode_s
    return w.prefill_s / busy if busy else float("nan")


def batch_limit(capacity: SLOCapacity, max_batch: int, fits: int, ttft_s: float,
                tpot_s: float, looser=()) -> BatchLimit:
    """Read what held the batch down from a search's own probes (``capacity_at_slo``), and from
    ``looser``: searches of the same server under looser TPOT bounds, if any were run."""
    w = capacity.window
    share = prefill_share(w)
    above = sorted((p for p in capacity.probes if p.rate > capacity.rate), key=lambda p: p.rate)
    nxt = above[0] if above else None
    said = capacity.verdict(nxt) if nxt else ""
    info = dict(mean_batch=w.mean_batch, max_batch=max_batch, fits=fits, prefill_share=share,
                next_rate=nxt.rate if nxt else float("nan"),
                next_status=nxt.status if nxt else "", next_verdict=said)
    if w.mean_batch >= AT_CAP * min(max_batch, fits):
        return BatchLimit("max batch" if max_batch <= fits else "KV memory", **info)
    if nxt is None:
        return BatchLimit("cannot tell", **info)
    if said not in (MISSES, UNDECIDED):
        raise ValueError(f"the search's next rate {nxt.rate} above its capacity {capacity.rate} "
                         f"was not a miss but {said!r}")
    missed, history = nxt.window, nxt.history
    if nxt.status == OVERLOADED or missed.saturated:
        return BatchLimit("device time", **info)
    ttft_over = missed.ttft.p95 / ttft_s
    tpot_over = missed.tpot.p95 / tpot_s
    queue = len(history) >= 2 and capacity.criterion.queue_growing(history[-2], history[-1])
    met_looser = any(c.rate >= nxt.rate for c in looser)   # that rate meets a looser bound
    missed_target = missed.slo_attainment < capacity.target
    if missed_target and tpot_over > 1 and tpot_over >= ttft_over and (met_looser or not queue):
        # it kept up and its steps were too slow for the bound, with no queue building, or
        # with the wait for the first token rising beside it while the same rate meets a
        # looser bound: the server was not out of time
        return BatchLimit("TPOT bound", **info)
    if queue:
        return BatchLimit("device time", **info)
    if said == UNDECIDED and not missed_target:
        return BatchLimit("cannot tell", **info)
    return BatchLimit("TTFT bound" if ttft_over >= tpot_over else "TPOT bound", **info)
