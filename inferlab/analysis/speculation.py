"""What speculative decoding gains: expected tokens per verification, speed-up, best k, and
where batching takes the gain away.

Leviathan, Kalman and Matias (2023, Sec. 3) model each drafted token as accepted independently
with probability a (the acceptance rate). A verification of k drafted tokens then emits the
accepted prefix plus one token of the target's own, on average

    E(a, k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)

tokens. If a draft step costs c target steps and verifying k + 1 tokens costs one target step
(true while the pass is memory-bound), the wall-clock speed-up over plain decoding is
E(a, k) / (k c + 1) (their Theorem 3.8). Chen et al. (2023) derive the same accounting.

The last functions drop the "verification costs one step" assumption and time each pass on a
roofline (``inferlab.analysis.roofline``): a pass over n tokens of a model with P parameters
takes max(weight bytes / bandwidth, 2 P n / peak). At batch 1 verifying k + 1 tokens is nearly
free; as the batch approaches the critical batch size (``formulas.critical_batch_size``) the
target's pass turns compute-bound, its k + 1 tokens cost k + 1 times as much, and speculation
stops paying.
"""

from __future__ import annotations

import math

from inferlab.analysis import formulas
from inferlab.analysis.roofline import Roof


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


def pass_seconds(params: float, weight_bytes: float, tokens: int, roof: Roof) -> float:
    """A forward pass over ``tokens`` tokens on ``roof``: max(bytes / bandwidth, 2 P tokens / peak).

    Weights only: attention's reads of the KV cache are left out (short contexts).
    """
    return max(weight_bytes / roof.bandwidth, 2 * params * tokens / roof.peak_flops)


def batched_speedup(config, roof: Roof, batch: int, a: float, k: int, c: float,
                    dtype="bfloat16") -> float:
    """Speculation's speed-up at ``batch`` sequences on a roofline, for a target shaped
    ``config`` and a draft with ``c`` times its parameters (and bytes).

    Plain decoding: ``batch`` tokens per target pass over ``batch`` tokens. Speculating: k draft
    passes over ``batch`` tokens, then one target pass over batch x (k + 1), emitting
    batch x E(a, k) tokens.
    """
    _check(a, k)
    P = formulas.param_count(config)
    W = formulas.weight_bytes(config, dtype)
    plain = pass_seconds(P, W, batch, roof) / batch
    draft = k * pass_seconds(c * P, c * W, batch, roof)
    spec = (draft + pass_seconds(P, W, batch * (k + 1), roof)) / (batch * expected_tokens(a, k))
    return plain / spec


def crossover_batch(config, roof: Roof, a: float, k: int, c: float, dtype="bfloat16",
                    max_batch: int = 1 << 16) -> int | None:
    """The smallest batch at which speculating with k tokens no longer pays (speed-up <= 1),
    or None if it still pays at ``max_batch``."""
    lo, hi = 1, max_batch
    if batched_speedup(config, roof, lo, a, k, c, dtype) <= 1:
        return lo
    if batched_speedup(config, roof, hi, a, k, c, dtype) > 1:
        return None
    while hi - lo > 1:  # the speed-up falls as the batch grows
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if batched_speedup(config, roof, mid, a, k, c, dtype) > 1 else (lo, mid)
    return hi
