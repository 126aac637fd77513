"""Pipeline parallelism: P stages of consecutive layers, and how busy they are in two regimes.

Formulas only (no processes): a stage's compute time comes from the step-time model
(``inferlab.analysis.step_time``), the transfer between stages from ``collectives.send``.

**A flushed batch** (GPipe: Huang et al. 2019, training; also one long prefill cut into
micro-batches): m micro-batches enter an empty pipeline and the pipeline drains before the next
batch. The last micro-batch leaves after m + P - 1 stage-times, of which each stage worked m:
utilisation m / (m + P - 1), the bubble (P - 1) / (m + P - 1).

**Continuous decoding** never flushes: m independent batches circulate, each running one decode
step through all P stages and coming back for the next. In steady state a batch's round trip is
P x (t + tau) (t a stage's compute, tau one hop's transfer, which the batch waits for), and a
stage serves one batch every t, so a stage is busy

    min(1, m t / (P (t + tau)))

of the time: m = P batches fill the pipeline when transfers are free, and m >= P (1 + tau / t)
when they are not. There is no fill-and-drain term, however long it runs; what the pipeline
costs instead is latency: every token of a sequence waits for the whole round trip,
P (t + tau), the one-device step plus P transfers, so pipeline parallelism never shortens a
token's time and lengthens it by the hops.
"""

from __future__ import annotations

from inferlab.validation import positive, positive_ints


def gpipe_utilisation(micro_batches: int, stages: int) -> float:
    """Busy fraction of a flushed pipeline: m / (m + P - 1) (GPipe's regime, not decode's)."""
    positive_ints(micro_batches=micro_batches, stages=stages)
    return micro_batches / (micro_batches + stages - 1)


def decode_round_trip_s(stages: int, stage_s: float, transfer_s: float = 0.0) -> float:
    """Seconds between two tokens of one sequence in a decoding pipeline: P (t + tau)."""
    positive_ints(stages=stages)
    positive(stage_s=stage_s)
    if transfer_s < 0:
        raise ValueError(f"transfer_s must be >= 0, got {transfer_s}")
    return stages * (stage_s + transfer_s)


def decode_utilisation(batches_in_flight: int, stages: int, stage_s: float,
                       transfer_s: float = 0.0) -> float:
    """Steady-state busy fraction of each stage of a continuously decoding pipeline with
    ``batches_in_flight`` batches circulating: min(1, m t / (P (t + tau)))."""
    positive_ints(batches_in_flight=batches_in_flight)
    round_trip = decode_round_trip_s(stages, stage_s, transfer_s)
    return min(1.0, batches_in_flight * stage_s / round_trip)


def batches_to_fill(stages: int, stage_s: float, transfer_s: float = 0.0) -> int:
    """The fewest batches in flight that keep every stage busy: ceil(P (1 + tau / t))."""
    round_trip = decode_round_trip_s(stages, stage_s, transfer_s)
    m = 1
    while m * stage_s < round_trip * (1 - 1e-12):
        m += 1
    return m
