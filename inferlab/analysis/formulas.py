"""The formulas the book quotes, in one place.

Every number in the chapters that is not measured comes from here, so prose and code cannot
drift apart. Units are SI throughout: bytes, FLOPs, seconds. Conventions:

- A matmul of an (m x k) by a (k x n) matrix does 2 m n k FLOPs: one multiply and one add per
  term of each dot product.
- A transformer forward pass does about 2 FLOPs per parameter per token (Kaplan et al. 2020),
  plus attention's own work, which grows with the context.
- One forward pass at batch size 1 must read every weight once, so its time is at least
  weight bytes / bandwidth, whatever the FLOP/s (the decode floor). That bounds a token per
  forward pass; speculative decoding (Leviathan et al. 2023) gets several tokens from one pass.
- Static batching holds every slot of a batch until its longest output is done
  (``static_slot_utilisation``), which bounds what continuous batching can gain (Chapter 4).
- A model trained with a sliding window of W tokens (Mistral-7B-v0.1: 4,096) attends to, and
  caches, at most the last W tokens: ``kv_tokens_held`` applies the cap everywhere below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Two formulas live below the model and the engine, which use them too; they are the book's
# formulas all the same, and keep their names here.
from inferlab.device import element_bytes
from inferlab.model.config import kv_bytes_per_token  # noqa: F401
from inferlab.validation import positive

if TYPE_CHECKING:  # pragma: no cover
    from inferlab.model.config import ModelConfig


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
    """Bytes the weights occupy in ``dtype`` (a dtype name or bytes per weight): the input
    embedding included, since it sits in memory. What a step reads is
    ``decode_bytes_per_step`` (and, per kernel, ``inferlab.analysis.step_time``)."""
    return param_count(config, include_embeddings) * element_bytes(dtype)


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
    return params * element_bytes(dtype)


def quantized_bytes_per_weight(bits: int, group_size: int, scale_bytes: float = 2.0,
                               zero_point: bool = False) -> float:
    """Bytes a kernel reads per weight for ``bits``-bit codes in groups of ``group_size``.

    Each group stores one scale of ``scale_bytes`` (and, with ``zero_point``, an offset of the
    same size), so the metadata costs 8 x scale_bytes x (1 + zero_point) / group_size bits per
    weight: with 16-bit scales 16 / G bits, which doubles with every halving of G (0.125 bits at
    128, 0.25 at 64, 0.5 at 32). gpt-fast's int4 (groups of 32, a bf16 scale and a bf16 zero
    point per group) is 4 + 1 = 5 bits per weight, an ideal 16 / 5 = 3.2x over bf16, not 4x.
    """
    positive(bits=bits, group_size=group_size, scale_bytes=scale_bytes)
    return bits / 8 + scale_bytes * (2 if zero_point else 1) / group_size


def quantized_step_bytes(config: "ModelConfig", context: int, bytes_per_weight: float,
                         kv_bytes_per_element: float, batch: int = 1) -> float:
    """Bytes one decode step reads with weights of ``bytes_per_weight`` (scales included) and a
    KV cache of ``kv_bytes_per_element``: every weight but the input embedding table
    (``decode_bytes_per_step``), then K and V of ``context`` tokens for each of ``batch``
    sequences. Quantization changes the two prices; the counts stay."""
    weights = decode_bytes_per_step(config, "float32") // 4  # numbers read, one per weight
    kv = 2 * config.n_layers * config.n_kv_heads * config.head_dim * kv_tokens_held(config, context)
    return weights * bytes_per_weight + batch * kv * kv_bytes_per_element


def kv_tokens_held(config: "ModelConfig", context: int) -> int:
    """Tokens whose K and V a sequence of ``context`` tokens keeps: all of them, or the window.

    A sliding-window model (``config.sliding_window``) attends to the last W tokens only, so
    its cache is a ring buffer of W slots (Jiang et al. 2023, Sec. 2, "rolling buffer cache").
    """
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    window = getattr(config, "sliding_window", None)
    return context if window is None else min(context, window)


def flops_per_token(config: "ModelConfig", context: int = 0) -> int:
    """Forward FLOPs for one token: 2 per weight it multiplies, plus attention over ``context``.

    The input embedding is a lookup (no FLOPs). Attention does QK^T and PV: 2 x 2 x H x D FLOPs
    per layer per past token it attends to (at most the sliding window, where the model has one).
    """
    matmul_params = param_count(config, include_embeddings=False) + config.vocab_size * config.d_model
    attended = kv_tokens_held(config, context)
    attention = 4 * config.n_layers * config.n_heads * config.head_dim * attended
    return 2 * matmul_params + attention


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) product: 2 m n k."""
    positive(m=m, n=n, k=k)
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, bytes_per_element: float) -> float:
    """Bytes an (m x k) @ (k x n) product must move at least: read A and B, write C once."""
    positive(m=m, n=n, k=k, bytes_per_element=bytes_per_element)
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
    positive(batch=batch, bytes_per_weight=bytes_per_weight)
    return 2 * batch / bytes_per_weight


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where a roofline's slope meets its flat roof: peak / bandwidth."""
    positive(peak_flops=peak_flops, bandwidth=bandwidth)
    return peak_flops / bandwidth


def critical_batch_size(peak_flops: float, bandwidth: float, bytes_per_weight: float = 2.0) -> float:
    """Batch size at which decode's weight matmuls reach the ridge point and turn compute-bound.

    Solves decode_intensity(B) = ridge_point: B = ridge x bytes_per_weight / 2.
    """
    return ridge_point(peak_flops, bandwidth) * bytes_per_weight / 2


def decode_step_intensity(config: "ModelConfig", batch: int, context: int,
                          dtype="bfloat16") -> float:
    """Intensity (FLOP/byte) of a whole decode step: ``batch`` sequences with ``context`` cached
    tokens each, counting the weights (read once for the batch) and every sequence's own cache.

    FLOPs: ``batch`` x ``flops_per_token(config, context)``. Bytes: the weights of
    ``decode_bytes_per_step`` plus ``batch`` x the cache held x its bytes per token. As the
    batch grows the weights' share vanishes and the intensity tends to
    ``flops_per_token / (held x s_kv)`` = 2N / (n s_kv) + 2G / b: the batch cannot raise it
    past that, however large (``compute_bound_context``).
    """
    positive(batch=batch)
    held = kv_tokens_held(config, context)
    flops = batch * flops_per_token(config, context)
    nbytes = decode_bytes_per_step(config, dtype) + batch * held * kv_bytes_per_token(config, dtype)
    return flops / nbytes


def compute_bound_context(config: "ModelConfig", ridge: float, dtype="bfloat16") -> float:
    """The longest context (tokens per sequence) at which some batch can bring a decode step to
    the ridge point ``ridge``; past it the step stays memory-bound at any batch size.

    Per sequence a step does 2N + a n FLOPs (N the matmul parameters, a the attention FLOPs
    per cached token) and reads n s_kv bytes of its own cache, so the step's intensity tends
    to 2N / (n s_kv) + a / s_kv as the batch grows; a / s_kv = 2G/b is attention's own
    intensity. Setting that limit equal to the ridge gives n = 2N / ((ridge - a / s_kv) s_kv).
    Returns infinity when attention alone reaches the ridge. Ignores a sliding window.
    """
    positive(ridge=ridge)
    s_kv = kv_bytes_per_token(config, dtype)
    per_cached = 4 * config.n_layers * config.n_heads * config.head_dim  # a: QK^T and PV
    dense = flops_per_token(config, 0)                                   # 2N
    gap = ridge - per_cached / s_kv
    return float("inf") if gap <= 0 else dense / (gap * s_kv)


def decode_time_floor(bytes_per_token: float, bandwidth: float) -> float:
    """Least time to produce one token when each token must read ``bytes_per_token``: bytes / bandwidth."""
    positive(bytes_per_token=bytes_per_token, bandwidth=bandwidth)
    return bytes_per_token / bandwidth


def bandwidth_utilisation(bytes_per_token: float, seconds_per_token: float, bandwidth: float) -> float:
    """Model bandwidth utilisation (MBU): bytes a decode step must read / (its time x bandwidth).

    The course's one definition (Databricks' "LLM inference performance engineering", 2023):
    ``bytes_per_token`` counts everything the step must read, the weights plus the KV cache of
    the sequence it decodes; for a batch, pass the step's bytes and its time. At batch 1 with a
    short context the cache is negligible and this is the weights-only figure gpt-fast reports.
    It equals the decode floor divided by the measured time.
    """
    positive(bytes_per_token=bytes_per_token, seconds_per_token=seconds_per_token,
              bandwidth=bandwidth)
    return bytes_per_token / seconds_per_token / bandwidth


# --- The KV cache and capacity planning (Chapter 2) ---------------------------------------
# Kwon et al. 2023 (PagedAttention), Sec. 3 and Table 1: OPT-13B, 800 KB of KV per token, 12 GB
# left for the cache on one A100-40GB, hence about 15.7K token slots.


def kv_bytes(config: "ModelConfig", tokens: int, dtype="bfloat16", batch: int = 1) -> int:
    """Bytes the KV cache holds for ``batch`` sequences of ``tokens`` tokens each.

    A sliding-window model holds at most its window per sequence (``kv_tokens_held``).
    """
    if tokens < 0 or batch < 0:
        raise ValueError(f"tokens and batch must be >= 0, got tokens={tokens}, batch={batch}")
    return batch * kv_tokens_held(config, tokens) * kv_bytes_per_token(config, dtype)


def kv_token_slots(config: "ModelConfig", kv_memory: float, dtype="bfloat16") -> int:
    """How many tokens' K and V fit in ``kv_memory`` bytes: the cache's token slots."""
    if kv_memory < 0:
        raise ValueError(f"kv_memory must be >= 0 bytes, got {kv_memory!r}")
    return int(kv_memory // kv_bytes_per_token(config, dtype))


def kv_memory_budget(config: "ModelConfig", device_memory: float, weight_dtype="bfloat16",
                     activation_reserve: float = 0.0, weights: float | None = None) -> float:
    """Bytes left for the KV cache: device memory minus the weights and an activation reserve.

    ``weights`` overrides the weight bytes computed from ``config`` and ``weight_dtype`` (to
    reproduce a paper's rounded figure, or for weights stored in fewer bits). Negative when the
    weights alone do not fit; callers decide what that means.
    """
    positive(device_memory=device_memory)
    if activation_reserve < 0:
        raise ValueError(f"activation_reserve must be >= 0 bytes, got {activation_reserve!r}")
    w = weight_bytes(config, weight_dtype) if weights is None else weights
    return device_memory - w - activation_reserve


def max_concurrent_requests(config: "ModelConfig", device_memory: float, context: int,
                            dtype="bfloat16", activation_reserve: float = 0.0,
                            weight_dtype=None, weights: float | None = None) -> int:
    """Requests of ``context`` tokens each whose KV cache fits beside the weights, all at once.

    (device memory - weights - activation reserve) / (KV bytes per token x context), rounded
    down; 0 when not even one fits. ``dtype`` is the cache's dtype; ``weight_dtype`` defaults to
    it. This is the count when every request reserves its whole context up front, as systems
    before PagedAttention did; a sliding-window model reserves at most its window.
    """
    positive(context=context)
    budget = kv_memory_budget(config, device_memory, dtype if weight_dtype is None else weight_dtype,
                              activation_reserve, weights)
    held = kv_tokens_held(config, context)
    return max(0, kv_token_slots(config, max(budget, 0.0), dtype) // held)


def attention_decode_intensity(bytes_per_element: float = 2.0, group_size: int = 1) -> float:
    """FLOPs per byte of KV read by one decode step's attention, at any batch size.

    Each query head does 2 D FLOPs against a key (QK^T) and 2 D against a value (PV) per past
    token, and the step reads those 2 D numbers once per KV head. A KV head serves
    ``group_size`` query heads (1 for MHA), so the intensity is 2 x group_size / bytes: about 1
    FLOP/byte for MHA in 16-bit. Batching adds requests but each has its own cache, so unlike
    the weight matmuls the intensity does not grow with the batch.
    """
    positive(bytes_per_element=bytes_per_element, group_size=group_size)
    return 2 * group_size / bytes_per_element


def recompute_flops(config: "ModelConfig", context: int) -> int:
    """FLOPs to get the next token without a cache: a forward pass over all ``context`` tokens.

    Every token goes through every weight matmul (including the output projection, since the
    model computes logits for each position), and causal attention does 4 x H x D FLOPs per
    (query, earlier-or-same key) pair: context x (context + 1) / 2 pairs per layer, fewer under
    a sliding window. This is also the FLOP count of a prefill of ``context`` tokens. Compare
    ``flops_per_token(config, context - 1)``, the cost with a cache: about ``context`` times less.
    """
    positive(context=context)
    matmul_params = param_count(config, include_embeddings=False) + config.vocab_size * config.d_model
    pairs = causal_pairs(context, getattr(config, "sliding_window", None))
    return 2 * matmul_params * context + 4 * config.n_layers * config.n_heads * config.head_dim * pairs


def causal_pairs(tokens: int, window: int | None = None) -> int:
    """(query, key) pairs causal attention scores over ``tokens`` tokens: T (T + 1) / 2.

    With a sliding window of W, query t sees min(t + 1, W) keys.
    """
    if window is None or tokens <= window:
        return tokens * (tokens + 1) // 2
    return window * (window + 1) // 2 + (tokens - window) * window


def static_slot_utilisation(output_lens: list[int], batch_size: int) -> float:
    """Useful share of decode slots when requests run in static batches of ``batch_size``.

    Consecutive groups of ``batch_size`` requests each hold every one of their slots until the
    group's longest output is done: useful tokens / (group size x longest output), summed over
    groups. If a decode step costs the same at any batch size (memory-bound), continuous
    batching's throughput gain over static batching is about 1 / this.
    """
    if batch_size <= 0 or not output_lens:
        raise ValueError("need a positive batch size and at least one output length")
    useful = reserved = 0
    for i in range(0, len(output_lens), batch_size):
        group = output_lens[i:i + batch_size]
        useful += sum(group)
        reserved += len(group) * max(group)
    return useful / reserved


def overlapped_step_s(host_s: float, device_s: float) -> tuple[float, float]:
    """Seconds per engine step (without, with) one step of lookahead (overlap scheduling).

    Without it the host's work (scheduling, building the forward's metadata, recording the
    tokens) runs before the device's (the forward and the sampling), so a step takes their sum;
    with it the host prepares the next step while the device runs this one, and a step takes
    the longer of the two (``inferlab.serving.overlap``).
    """
    if host_s < 0 or device_s < 0:
        raise ValueError("host and device seconds must be non-negative")
    return host_s + device_s, max(host_s, device_s)
