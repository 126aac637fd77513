"""The formulas the book quotes, in one place.

Every number in the chapters that is not measured comes from here, so prose and code cannot
drift apart. Units are SI throughout: bytes, FLOPs, seconds. Conventions:

- A matmul of an (m x k) by a (k x n) matrix does 2 m n k FLOPs: one multiply and one add per
  term of each dot product.
- A transformer forward pass does about 2 FLOPs per parameter per token (Kaplan et al. 2020),
  plus attention's own work, which grows with the context.
- Decoding one token at batch size 1 must read every weight once, so its time is at least
  weight bytes / bandwidth, whatever the FLOP/s (the decode floor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferlab.device import bytes_per_element

if TYPE_CHECKING:  # pragma: no cover
    from inferlab.model import ModelConfig


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


def param_count(config: "ModelConfig", include_embeddings: bool = True) -> int:
    """Parameters of a Llama-architecture model with ``config``'s shape.

    Per layer: Q and O projections (d x H*D), K and V (d x Hkv*D), three FFN matrices
    (d x ffn), two RMSNorm vectors, and Q/K/V biases where the model has them (Qwen2).
    """
    d, hd = config.d_model, config.head_dim
    q_out, kv_out = config.n_heads * hd, config.n_kv_heads * hd
    attn = d * q_out + 2 * d * kv_out + q_out * d
    if config.attention_bias:
        attn += q_out + 2 * kv_out
    layer = attn + 3 * d * config.ffn_dim + 2 * d
    total = config.n_layers * layer + d  # final norm
    if include_embeddings:
        embed = config.vocab_size * d
        total += embed if config.tie_embeddings else 2 * embed
    return total


def weight_bytes(config: "ModelConfig", dtype="bfloat16", include_embeddings: bool = True) -> int:
    """Bytes the weights occupy in ``dtype``."""
    return param_count(config, include_embeddings) * bytes_per_element(dtype)


def decode_bytes_per_step(config: "ModelConfig", dtype="bfloat16") -> int:
    """Weight bytes one decode step reads: every weight but the input embedding table.

    The embedding lookup touches one row per token, not the whole table; the output
    projection (lm_head) is a full matmul and is read in full. With tied embeddings the shared
    table is read once, as the output projection.
    """
    embed = config.vocab_size * config.d_model
    params = param_count(config, include_embeddings=True)
    if not config.tie_embeddings:
        params -= embed
    return params * bytes_per_element(dtype)


def flops_per_token(config: "ModelConfig", context: int = 0) -> int:
    """Forward FLOPs for one token: 2 per weight it multiplies, plus attention over ``context``.

    The input embedding is a lookup (no FLOPs). Attention does QK^T and PV: 2 x 2 x H x D FLOPs
    per layer per past token.
    """
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    matmul_params = param_count(config, include_embeddings=False) + config.vocab_size * config.d_model
    attention = 4 * config.n_layers * config.n_heads * config.head_dim * context
    return 2 * matmul_params + attention


def kv_bytes_per_token(config: "ModelConfig", dtype="bfloat16") -> int:
    """KV-cache bytes one token occupies: 2 (K and V) x layers x KV heads x head_dim x bytes."""
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_element(dtype)


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) product: 2 m n k."""
    _positive(m=m, n=n, k=k)
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, bytes_per_element: float) -> float:
    """Bytes an (m x k) @ (k x n) product must move at least: read A and B, write C once."""
    _positive(m=m, n=n, k=k, bytes_per_element=bytes_per_element)
    return (m * k + k * n + m * n) * bytes_per_element


def matmul_intensity(m: int, n: int, k: int, bytes_per_element: float) -> float:
    """Arithmetic intensity of a matmul in FLOP/byte: FLOPs over the minimum bytes moved."""
    return matmul_flops(m, n, k) / matmul_bytes(m, n, k, bytes_per_element)


def decode_intensity(batch: int, bytes_per_weight: float = 2.0) -> float:
    """Intensity of the weight matmuls in a decode step at batch size ``batch``, in FLOP/byte.

    Each weight is read once (``bytes_per_weight``) and used by every request in the batch
    (2 FLOPs each), so the intensity is 2 x batch / bytes_per_weight: about ``batch`` in 16-bit.
    Activations are ignored; they are tiny next to the weights while batch << d_model.
    """
    _positive(batch=batch, bytes_per_weight=bytes_per_weight)
    return 2 * batch / bytes_per_weight


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where a roofline's slope meets its flat roof: peak / bandwidth."""
    _positive(peak_flops=peak_flops, bandwidth=bandwidth)
    return peak_flops / bandwidth


def critical_batch_size(peak_flops: float, bandwidth: float, bytes_per_weight: float = 2.0) -> float:
    """Batch size at which decode's weight matmuls reach the ridge point and turn compute-bound.

    Solves decode_intensity(B) = ridge_point: B = ridge x bytes_per_weight / 2.
    """
    return ridge_point(peak_flops, bandwidth) * bytes_per_weight / 2


def decode_time_floor(bytes_per_token: float, bandwidth: float) -> float:
    """Least time to produce one token when each token must read ``bytes_per_token``: bytes / bandwidth."""
    _positive(bytes_per_token=bytes_per_token, bandwidth=bandwidth)
    return bytes_per_token / bandwidth


def bandwidth_utilisation(bytes_per_token: float, seconds_per_token: float, bandwidth: float) -> float:
    """Fraction of peak bandwidth a decoder achieves: bytes per token x tokens/s / bandwidth.

    gpt-fast calls this model-bandwidth utilisation; it equals floor time / measured time.
    """
    _positive(bytes_per_token=bytes_per_token, seconds_per_token=seconds_per_token,
              bandwidth=bandwidth)
    return bytes_per_token / seconds_per_token / bandwidth
