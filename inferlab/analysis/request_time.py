"""Lower bounds on one request's time from the roofline: its prefill, its decode, and what it
costs to bring back a preempted request's KV cache by recomputing it or by moving it over a link.

Each bound is the course's step-time model (``inferlab.analysis.step_time``): every kernel of a
forward pass on its own roofline (Williams, Waterman and Patterson 2009), summed.

- ``prefill_time``: one pass over a prompt of P tokens: every weight matmul for every token
  plus causal attention, the weights read once and the prompt's keys and values written. It is
  compute-bound once P is well past the ridge point.
- ``decode_step_time``: one token for each of B sequences holding C tokens of cache each.
- ``request_phases``: a request served alone, prompt P and answer N: the first token comes out
  of the prefill, the other N - 1 out of decode steps whose cache grows by one token each.
  ``decode_share`` and ``crossover_output_tokens`` say which phase dominates, and from which
  answer length on decode does.
- ``swap_time`` and ``recompute_time``: a preempted request of n tokens brought back by copying
  its cache over a host link (``data/links.csv``) or by one prefill over its n tokens (Kwon et
  al. 2023, Sec. 4.5; they measure the two end to end in Sec. 7.3).
"""

from __future__ import annotations

import numpy as np

from inferlab.analysis import formulas
from inferlab.analysis.step_time import Shape, StepModel
from inferlab.data import read_table
from inferlab.validation import positive


def _model(config, peak_flops: float, bandwidth: float, dtype) -> StepModel:
    positive(peak_flops=peak_flops, bandwidth=bandwidth)
    return StepModel.for_roof(config, peak_flops, bandwidth, dtype)


def prefill_time(config, prompt: int, peak_flops: float, bandwidth: float,
                 dtype="bfloat16") -> float:
    """Least time of one prefill of ``prompt`` tokens (weights and cache in ``dtype``)."""
    return _model(config, peak_flops, bandwidth, dtype).prefill_s(prompt)


def decode_step_time(config, context: int, peak_flops: float, bandwidth: float,
                     dtype="bfloat16", batch: int = 1) -> float:
    """Least time of one decode step: ``batch`` sequences, each with ``context`` cached tokens
    (its new token's K/V is written and read besides)."""
    return _model(config, peak_flops, bandwidth, dtype).rows_s([(1, context)] * batch)


def _decode_total(config, prompt: int, output: int, peak_flops: float, bandwidth: float,
                  dtype) -> float:
    """Sum of the N - 1 decode steps after the prefill, the k-th with P + k - 1 cached tokens
    (priced all at once: one decode row per step)."""
    if output <= 1:
        return 0.0
    model = _model(config, peak_flops, bandwidth, dtype)
    cached = prompt + np.arange(output - 1)
    return float(np.sum(model.seconds(Shape.decode_rows(cached, model.attention.window))))


def request_phases(config, prompt: int, output: int, peak_flops: float, bandwidth: float,
                   dtype="bfloat16") -> tuple[float, float]:
    """(prefill seconds, decode seconds) of one request served alone, at the roofline.

    The prefill's bound is the TTFT's (no queueing); the decode part is (N - 1) TPOTs.
    """
    if prompt < 1 or output < 1:
        raise ValueError(f"prompt and output must be >= 1 token, got {prompt} and {output}")
    positive(peak_flops=peak_flops, bandwidth=bandwidth)
    return (prefill_time(config, prompt, peak_flops, bandwidth, dtype),
            _decode_total(config, prompt, output, peak_flops, bandwidth, dtype))


def decode_share(config, prompt: int, output: int, peak_flops: float, bandwidth: float,
                 dtype="bfloat16") -> float:
    """Fraction of the request's least time spent in decode steps."""
    pre, dec = request_phases(config, prompt, output, peak_flops, bandwidth, dtype)
    return dec / (pre + dec)


def crossover_output_tokens(config, prompt: int, peak_flops: float, bandwidth: float,
                            dtype="bfloat16") -> int:
    """The shortest answer (in tokens) whose decode steps take at least as long as the prefill.

    Decode time grows with every token, so a bisection finds it. For a short prompt it is a
    handful of tokens; for a long one, prefill's quadratic attention pushes it to hundreds.
    """
    pre = prefill_time(config, prompt, peak_flops, bandwidth, dtype)
    lo, hi = 1, 2
    while _decode_total(config, prompt, hi, peak_flops, bandwidth, dtype) < pre:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _decode_total(config, prompt, mid, peak_flops, bandwidth, dtype) >= pre:
            hi = mid
        else:
            lo = mid
    return hi


# --- Preemption: rebuild the cache or move it ---------------------------------------------


def link_bandwidths() -> dict[str, float]:
    """Host and GPU links of ``data/links.csv``: name -> bytes/s in one direction."""
    return {row["name"]: float(row["bandwidth_gbs_per_direction"]) * 1e9
            for row in read_table("links.csv")}


def swap_time(config, tokens: int, link_bandwidth: float, dtype="bfloat16") -> float:
    """Least time to copy one request's cache of ``tokens`` tokens over a link, one way."""
    positive(link_bandwidth=link_bandwidth)
    return formulas.kv_bytes(config, tokens, dtype) / link_bandwidth


def recompute_time(config, tokens: int, peak_flops: float, bandwidth: float,
                   dtype="bfloat16") -> float:
    """Least time to rebuild the same cache: one prefill over the request's ``tokens`` tokens."""
    return prefill_time(config, tokens, peak_flops, bandwidth, dtype)
