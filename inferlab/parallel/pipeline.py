"""Pipeline parallelism: P stages of consecutive layers, and how busy they are in two regimes.

Formulas only (no processes): a stage's compute time comes from the step-time model
(``inferlab.analysis.step_time``), the transfer between stages from ``collectives.send``.

**A flushed batch** (GPipe: Huang et al. 2019, training; also one long prefill cut into
micro-batches): m micro-batches enter an empty pipeline and the pipeline drains before the next
batch. The last micro-batch leaves after m + P - 1 stage-times, of which each stage worked m:
utilisation m / (m + P - 1), the bubble (P - 1) / (m + P - 1).

**Continuous decoding** never flushes: m independent batches circulate, each running one decode
step through all P stages and coming back for the next. In steady state a batch's round trip is
the sum of the stages' times plus P hops, R = sum(t_i) + P tau (tau one hop's transfer, which the
batch waits for), and the slowest stage serves one batch every t_max, so the slowest stage is busy

    min(1, m t_max / R)

of the time (with P equal stages t: min(1, m t / (P (t + tau)))). m = P batches fill a pipeline
of equal stages when transfers are free; hops need more. With unequal stages (the last one also
runs the LM head) the full pipeline serves one batch every t_max, not every mean stage time, and
the other stages idle the difference. There is no fill-and-drain term, however long it runs;
what the pipeline costs instead is latency: every token of a sequence waits for the whole round
trip, the one-device step plus P transfers, so pipeline parallelism never shortens a token's
time and lengthens it by the hops. A stage's time may be one number (P equal stages) or one per stage.
"""

from __future__ import annotations

import numpy as np

from inferlab.validation import positive, positive_ints


def gpipe_utilisation(micro_batches: int, stages: int) -> float:
    """Busy fraction of a flushed pipeline: m / (m + P - 1) (GPipe's regime, not decode's)."""
    positive_ints(micro_batches=micro_batches, stages=stages)
    return micro_batches / (micro_batches + stages - 1)


def _stages(stages: int, stage_s) -> list[float]:
    """One time per stage: ``stage_s`` for every stage, or the P times given."""
    positive_ints(stages=stages)
    times = [float(stage_s)] * stages if np.ndim(stage_s) == 0 else [float(t) for t in stage_s]
    if len(times) != stages:
        raise ValueError(f"{len(times)} stage times for {stages} stages")
    positive(stage_s=min(times))
    return times


def decode_round_trip_s(stages: int, stage_s, transfer_s: float = 0.0) -> float:
    """Seconds between two tokens of one sequence in a decoding pipeline: sum(t_i) + P tau."""
    times = _stages(stages, stage_s)
    if transfer_s < 0:
        raise ValueError(f"transfer_s must be >= 0, got {transfer_s}")
    return sum(times) + stages * transfer_s


def decode_utilisation(batches_in_flight: int, stages: int, stage_s,
                       transfer_s: float = 0.0) -> float:
    """Steady-state busy fraction of the slowest stage of a continuously decoding pipeline with
    ``batches_in_flight`` batches circulating: min(1, m t_max / (sum(t_i) + P tau))."""
    positive_ints(batches_in_flight=batches_in_flight)
    round_trip = decode_round_trip_s(stages, stage_s, transfer_s)
    return min(1.0, batches_in_flight * max(_stages(stages, stage_s)) / round_trip)


def stage_utilisations(batches_in_flight: int, stages: int, stage_s,
                       transfer_s: float = 0.0) -> list[float]:
    """Steady-state busy fraction of every stage: the pipeline passes min(m / R, 1 / t_max)
    batches a second, and stage i works t_i on each, so only the slowest stage can reach 1; a
    faster stage idles 1 - t_i / t_max of the time even when the slowest one is full."""
    times = _stages(stages, stage_s)
    slowest = decode_utilisation(batches_in_flight, stages, stage_s, transfer_s)
    return [slowest * t / max(times) for t in times]


def batches_to_fill(stages: int, stage_s, transfer_s: float = 0.0) -> int:
    """The fewest batches in flight that keep the slowest stage busy: ceil(R / t_max)."""
    round_trip = decode_round_trip_s(stages, stage_s, transfer_s)
    slowest = max(_stages(stages, stage_s))
    m = 1
    while m * slowest < round_trip * (1 - 1e-12):
        m += 1
    return m


def decode_stage_s(model, shape, stages: int) -> list[float]:
    """Each stage's compute for one decode step of ``shape`` on ``model`` (a one-device
    ``step_time.StepModel``) cut into ``stages`` runs of consecutive layers: 1/P of the linear
    and attention kernels each, and the LM head on the last stage (the input embedding, a
    lookup, is not priced)."""
    positive_ints(stages=stages)
    seconds = {k.name: k.seconds for k in model.kernels(shape)}
    body = (seconds["linear"] + seconds["attention"]) / stages
    return [body] * (stages - 1) + [body + seconds["lm_head"]]


def hop_bytes(tokens: int, d_model: int, bytes_per_element: int = 2) -> int:
    """Bytes one hop carries: vLLM (0.33.0) passes two d_model vectors per token between stages,
    the hidden states and the residual (``IntermediateTensors``; row
    vllm-pp-intermediate-tensors of data/engine_facts.csv)."""
    return 2 * tokens * d_model * bytes_per_element
