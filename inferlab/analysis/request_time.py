"""Lower bounds on one request's time from the roofline: its prefill, its decode, and what it
costs to bring back a preempted request's KV cache by recomputing it or by moving it over a link.

Each bound is the roofline's: a forward pass takes at least max(FLOPs / peak, bytes / bandwidth)
(Williams, Waterman and Patterson 2009), with the FLOPs and bytes of ``inferlab.analysis.formulas``.

- ``prefill_time``: one pass over a prompt of P tokens. FLOPs: every weight matmul for every
  token plus causal attention (``formulas.recompute_flops``); bytes: the weights once and the
  prompt's keys and values written. It is compute-bound once P is well past the ridge point.
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
from inferlab.data import read_table
from inferlab.validation import positive


def roofline_time(flops: float, nbytes: float, peak_flops: float, bandwidth: float) -> float:
    """Least time for ``flops`` FLOPs on ``nbytes`` bytes: max(FLOPs / peak, bytes / bandwidth)."""
    positive(peak_flops=peak_flops, bandwidth=bandwidth)
    return max(flops / peak_flops, nbytes / bandwidth)


def prefill_time(config, prompt: int, peak_flops: float, bandwidth: float,
                 dtype="bfloat16") -> float:
    """Least time of one prefill of ``prompt`` tokens (weights and cache in ``dtype``)."""
    flops = formulas.recompute_flops(config, prompt)
    nbytes = formulas.decode_bytes_per_step(config, dtype) + formulas.kv_bytes(config, prompt, dtype)
    return roofline_time(flops, nbytes, peak_flops, bandwidth)


def decode_step_time(config, context: int, peak_flops: float, bandwidth: float,
                     dtype="bfloat16", batch: int = 1) -> float:
    """Least time of one decode step: ``batch`` sequences, each reading ``context`` cached tokens."""
    flops = batch * formulas.flops_per_token(config, context)
    nbytes = formulas.decode_bytes_per_step(config, dtype) + formulas.kv_bytes(config, context,
                                                                               dtype, batch)
    return roofline_time(flops, nbytes, peak_flops, bandwidth)


def _decode_total(config, prompt: int, output: int, peak_flops: float, bandwidth: float,
                  dtype) -> float:
    """Sum of the N - 1 decode steps after the prefill, the k-th reading P + k - 1 cached tokens."""
    if output <= 1:
        return 0.0
    context = prompt + np.arange(output - 1)
    window = getattr(config, "sliding_window", None)
    held = context if window is None else np.minimum(context, window)
    per_token = formulas.flops_per_token(config, 0)
    attention = formulas.flops_per_token(config, 1) - per_token   # FLOPs per cached token read
    flops = per_token + attention * held
    nbytes = (formulas.decode_bytes_per_step(config, dtype)
              + held * formulas.kv_bytes_per_token(config, dtype))
    return float(np.maximum(flops / peak_flops, nbytes / bandwidth).sum())


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
