"""What speculative decoding gains: expected tokens per verification, speed-up, best k, and
where batching takes the gain away.

Leviathan, Kalman and Matias (2023, Sec. 3) model each drafted token as accepted independently
with probability a (the acceptance rate). A verification of k drafted tokens then emits the
accepted prefix plus one token of the target's own, on average

    E(a, k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)

tokens. If a draft step costs c target steps and verifying k + 1 tokens costs one target step
(true while the pass is memory-bound), the wall-clock speed-up over plain decoding is
E(a, k) / (k c + 1) (their Theorem 3.8). Chen et al. (2023) derive the same accounting.

The last functions drop the "verification costs one step" assumption and time each pass with
the course's step-time model (``inferlab.analysis.step_time``: each kernel on its own roofline,
summed). At batch 1 verifying k + 1 tokens is nearly free; as the batch grows the linear layers
turn compute-bound and their k + 1 tokens cost k + 1 times as much, while attention still reads
each sequence's cache once per pass, whatever the batch: at short contexts speculation stops
paying near the critical batch size, at long ones the cache reads keep it paying much further
(Sadhukhan et al. 2024, MagicDec).
"""

from __future__ import annotations

import math

from dataclasses import replace

from inferlab.analysis.step_time import Shape, StepModel


def _check(a: float, k: int) -> None:
    if not 0 <= a <= 1:
        raise ValueError(f"the acceptance rate a must lie in [0, 1], got {a!r}")
    if k < 0 or int(k) != k:
        raise ValueError(f"k (drafted tokens per verification) must be an integer >= 0, got {k!r}")


def expected_tokens(a: float, k: int) -> float:
    """Expected tokens emitted per verification: (1 - a^(k+1)) / (1 - a), k + 1 at a = 1."""
    _check(a, k)
    return k + 1.0 if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def speedup(a: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Wall-clock speed-up over plain decoding: E(a, k) / (k c + verify_cost).

    ``c``: the cost of one draft step over one target step. ``verify_cost``: the cost of the
    target's pass over k + 1 tokens over one target step (1 while memory-bound; measure it).
    """
    _check(a, k)
    if c < 0 or verify_cost <= 0:
        raise ValueError(f"need c >= 0 and verify_cost > 0, got c={c!r}, verify_cost={verify_cost!r}")
    return expected_tokens(a, k) / (k * c + verify_cost)


def best_k(a: float, c: float, k_max: int = 32) -> int:
    """The k in 0..k_max with the largest ``speedup(a, k, c)`` (0: do not speculate)."""
    return max(range(k_max + 1), key=lambda k: speedup(a, k, c))


def acceptance_needed(target_speedup: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """The least acceptance rate at which ``speedup(a, k, c)`` reaches ``target_speedup``
    (by bisection: E grows with a); inf when even a = 1 falls short."""
    if speedup(1.0, k, c, verify_cost) < target_speedup:
        return math.inf
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid, k, c, verify_cost) < target_speedup else (lo, mid)
    return hi


def pass_seconds(model: StepModel, tokens: int, context: int = 0, batch: int = 1) -> float:
    """One forward pass of ``model`` (``inferlab.analysis.step_time``) over ``batch`` sequences
    that each verify or decode ``tokens`` new tokens after ``context`` cached ones, with logits
    at every new position (a verification needs them all)."""
    row = Shape.of_rows([(tokens, context)], model.attention.window)
    return model.seconds(replace(row, rows=tokens).times(batch))


def batched_speedup(target: StepModel, batch: int, a: float, k: int, c: float,
                    context: int = 0) -> float:
    """Speculation's speed-up at ``batch`` sequences of ``context`` cached tokens each, for a
    ``target`` step-time model and a draft ``c`` times its size in every weight and cache.

    Plain decoding: one target pass of one token per sequence. Speculating: k draft passes of
    one token per sequence, then one target pass of k + 1 tokens per sequence, emitting
    batch x E(a, k) tokens. Each pass reads each sequence's cache once: the k + 1 verified
    tokens share their sequence's cache read, but no two sequences share one, so at a long
    context the cache reads, which batching does not amortise, keep a large batch memory-bound
    and leave speculation its gain.
    """
    _check(a, k)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    plain = pass_seconds(target, 1, context, batch) / batch
    draft = k * pass_seconds(target.scaled(c), 1, context, batch)
    spec = (draft + pass_seconds(target, k + 1, context, batch)) / (batch * expected_tokens(a, k))
    return plain / spec


def crossover_batch(target: StepModel, a: float, k: int, c: float, context: int = 0,
                    max_batch: int = 1 << 16) -> int | None:
    """The smallest batch at which speculating with k tokens no longer pays (speed-up <= 1),
    or None if it still pays at ``max_batch`` (say, the most sequences that fit in memory)."""
    lo, hi = 1, max_batch
    if batched_speedup(target, lo, a, k, c, context) <= 1:
        return lo
    if batched_speedup(target, hi, a, k, c, context) > 1:
        return None
    while hi - lo > 1:  # the speed-up falls as the batch grows
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if batched_speedup(target, mid, a, k, c, context) > 1 else (lo, mid)
    return hi
