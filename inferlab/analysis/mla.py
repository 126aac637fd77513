"""Multi-head latent attention (MLA): the KV cache of DeepSeek-V2 and V3, and what it costs.

MLA (DeepSeek-AI 2024, arXiv:2405.04434, Sec. 2.1) caches, per token and layer, one compressed
latent c_KV of ``kv_lora_rank`` numbers from which every head's keys and values are projected
back up, plus one ``qk_rope_head_dim``-number key that carries the rotary position and is shared
by all heads ("decoupled RoPE"). The cache per token is therefore

    layers x (kv_lora_rank + qk_rope_head_dim) x bytes per element,

576 numbers a layer for DeepSeek-V2 and V3 (512 + 64), against 2 x H x D for multi-head
attention and 2 x K x D for grouped-query attention.

The price is arithmetic. At decode the up-projections can be folded ("absorbed") into the query
and the output projection, so attention runs directly over the latent: every head scores its
query against the 576-number cached vector and mixes the 512-number latent, which is then
projected up once per head. All H heads read the same cached numbers, like multi-query
attention with a wide head, so attention's intensity is about H x (2 (r + R) + 2 r) / ((r + R) b)
FLOP per byte (r the latent rank, R the RoPE width), near the ridge of current GPUs instead of
GQA's 2 G / b. ``MLAShape`` holds the sizes; the numbers come from ``data/moe_models.csv``.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.device import bytes_per_element
from inferlab.validation import positive_ints


@dataclass(frozen=True)
class MLAShape:
    """The attention sizes of an MLA model (Hugging Face names in the comments)."""

    n_layers: int            # num_hidden_layers
    d_model: int             # hidden_size
    n_heads: int             # num_attention_heads
    q_lora_rank: int         # q_lora_rank: queries are compressed too (0: a full projection)
    kv_lora_rank: int        # kv_lora_rank: the cached latent c_KV
    qk_nope_head_dim: int    # per-head key/query width without position
    qk_rope_head_dim: int    # the shared rotary key, cached beside the latent
    v_head_dim: int          # per-head value width

    def __post_init__(self) -> None:
        positive_ints("MLAShape.", n_layers=self.n_layers, d_model=self.d_model,
                      n_heads=self.n_heads, kv_lora_rank=self.kv_lora_rank,
                      qk_nope_head_dim=self.qk_nope_head_dim,
                      qk_rope_head_dim=self.qk_rope_head_dim, v_head_dim=self.v_head_dim)

    @property
    def cached_per_layer(self) -> int:
        """Numbers one token caches in one layer: the latent plus the shared rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def kv_bytes_per_token(shape: MLAShape, dtype="bfloat16") -> int:
    """KV-cache bytes per token: layers x (kv_lora_rank + qk_rope_head_dim) x bytes."""
    return shape.n_layers * shape.cached_per_layer * bytes_per_element(dtype)


def mha_kv_bytes_per_token(shape: MLAShape, dtype="bfloat16") -> int:
    """Bytes per token of multi-head attention with the same heads: 2 x layers x H x d_h x bytes.

    d_h is the per-head width without position (``qk_nope_head_dim``), as in the comparison of
    DeepSeek-V2's Table 1, where MLA caches (d_c + d_h^R) = 4.5 d_h numbers a layer against
    MHA's 2 n_h d_h.
    """
    return 2 * shape.n_layers * shape.n_heads * shape.qk_nope_head_dim * bytes_per_element(dtype)


def attention_params(shape: MLAShape) -> int:
    """Parameters of one MLA layer: query path, KV down- and up-projections, output, two norms."""
    d, h = shape.d_model, shape.n_heads
    qk_dim = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    if shape.q_lora_rank:
        query = d * shape.q_lora_rank + shape.q_lora_rank + shape.q_lora_rank * h * qk_dim
    else:
        query = d * h * qk_dim
    kv_down = d * shape.cached_per_layer + shape.kv_lora_rank      # W_DKV and W_KR, its norm
    kv_up = shape.kv_lora_rank * h * (shape.qk_nope_head_dim + shape.v_head_dim)
    out = h * shape.v_head_dim * d
    return query + kv_down + kv_up + out


def decode_attention_intensity(shape: MLAShape, dtype="bfloat16") -> float:
    """FLOP per byte of cache read by decode attention with the up-projections absorbed.

    Per cached token, layer and head: 2 (r + R) FLOPs to score it and 2 r to mix its latent;
    the step reads the token's r + R cached numbers once for all H heads.
    """
    r, rope = shape.kv_lora_rank, shape.qk_rope_head_dim
    flops = shape.n_heads * (2 * (r + rope) + 2 * r)
    return flops / (shape.cached_per_layer * bytes_per_element(dtype))


def attention_cost(shape: MLAShape, dtype="bfloat16"):
    """MLA's attention for the step-time model (``inferlab.analysis.step_time.Attention``):
    the latent cache's bytes per token, and per (query, key) pair and layer H x (2 (r + R) + 2 r)
    FLOPs with the up-projections absorbed (``decode_attention_intensity``). The cache is one
    latent per token and layer, shared by every head: tensor parallelism splits the heads'
    FLOPs but not the latent (``kv_heads=1``), so every device of the group reads all of it."""
    from inferlab.analysis.step_time import Attention

    r, rope = shape.kv_lora_rank, shape.qk_rope_head_dim
    return Attention(kv_bytes_per_token(shape, dtype),
                     shape.n_layers * shape.n_heads * (2 * (r + rope) + 2 * r), kv_heads=1)
