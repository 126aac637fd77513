"""A Llama-architecture decoder: RMSNorm, rotary position embeddings, SwiGLU, grouped-query attention.

The shapes follow Touvron et al. 2023 (Llama 2) and the parameter names follow the Hugging Face
``LlamaForCausalLM`` layout (``model.layers.0.self_attn.q_proj.weight``, ...), so a real
checkpoint's tensors load by name (``inferlab.model.weights``). Qwen2 models are the same architecture
with biases on the Q, K and V projections (``attention_bias``) and, for the small ones, an
output projection tied to the embedding table (``tie_embeddings``).

Letters used in shape comments: B batch, T tokens, H query heads, K KV heads, D head dim,
d model width, V vocabulary.

Attention goes through a cache object when one is given: ``cache.attend(layer, q, k, v,
positions)`` stores the new K/V and attends over everything stored. Without one, attention is
causal over the tokens passed in. The caches live in their own modules (``inferlab.model.kv_cache``,
``inferlab.serving.paged_cache``), so the model never owns serving state (only the engine changes it).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.model.config import ModelConfig


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 as the reference implementation does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """Rotary tables for ``positions`` (T,) or (B, T): cos and signed sin, each (..., T, D).

    Pair i of each head is rotated by angle position x theta^(-2i/D); the two halves of the
    head hold the pair's two coordinates (the Hugging Face "rotate_half" layout). The sine table
    carries the rotation's sign, -sin in the first half and +sin in the second, so that
    ``apply_rope`` needs no negation. The model computes the tables once per forward and every
    layer uses them.
    """
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=positions.device,
                                       dtype=torch.float32) / head_dim)  # (D/2,)
    angles = positions.float()[..., None] * inv_freq  # (..., T, D/2)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], dim=-1).to(dtype), torch.cat([-sin, sin], dim=-1).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (B, H, T, D) by the tables (T, D) or (B, T, D) of ``rope_cos_sin``."""
    if cos.dim() == 3:  # per-sequence positions: (B, T, D) -> (B, 1, T, D)
        cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)  # the pair's other coordinate
    return x * cos + swapped * sin


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of q (B, H, T, D) over k, v (B, K, T, D); K may divide H (GQA)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[-2] > 1,
                                          enable_gqa=q.shape[1] != k.shape[1])


class Attention(nn.Module):
    """Grouped-query attention with rotary embeddings (Ainslie et al. 2023)."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = (config.n_heads, config.n_kv_heads,
                                                        config.head_dim)
        self.rope_theta = config.rope_theta
        d, q_out, kv_out = config.d_model, config.n_heads * config.head_dim, \
            config.n_kv_heads * config.head_dim
        self.q_proj = nn.Linear(d, q_out, bias=config.attention_bias)
        self.k_proj = nn.Linear(d, kv_out, bias=config.attention_bias)
        self.v_proj = nn.Linear(d, kv_out, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_out, d, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``rope``: the tables of ``rope_cos_sin`` for ``positions`` (computed here if None)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)     # (B, H, T, D)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, K, T, D)
        if rope is None:
            rope = rope_cos_sin(positions, self.head_dim, self.rope_theta, q.dtype)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is None:
            out = causal_attention(q, k, v)
        else:
            out = cache.attend(self.layer_idx, q, k, v, positions)  # (B, H, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.down_proj = nn.Linear(config.ffn_dim, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)

    def forward(self, x, positions, cache=None, rope=None):
        x = x + self.self_attn(self.input_layernorm(x), positions, cache, rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """Embedding, decoder layers and final norm: the ``model.`` prefix of the HF names."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        # nn.Embedding's default init, except on the meta device (build_model), where there is
        # nothing to fill: there torch runs normal_ through a Python decomposition whose first
        # call imports torch._dynamo, 2.5 s of every process that builds a model
        weight = torch.empty(config.vocab_size, config.d_model)
        if weight.device.type != "meta":
            nn.init.normal_(weight)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)


class Llama(nn.Module):
    """The whole model: ``forward(tokens, positions=None, cache=None) -> logits``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                cache=None, last_only: bool = False,
                logits_at: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) for ``tokens`` (B, T) at ``positions`` ((T,) or (B, T); default 0..T-1).

        With ``last_only``, the logits of the last position only, (B, 1, V): all that sampling
        the next token needs, so a prefill skips the vocabulary projection of every other token.
        With ``logits_at`` (indices along T), the logits of those positions only, (B, n, V): in a
        packed batch, each sequence's last token.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (batch, time), got {tuple(tokens.shape)}")
        T = tokens.shape[1]
        if positions is None:
            positions = torch.arange(T, device=tokens.device)
        # These checks read values on the host: on a GPU that would stall every step, and
        # inside torch.compile it would break the graph, so they run in eager CPU code only.
        if tokens.device.type == "cpu" and not torch.compiler.is_compiling():
            if int(positions.max()) >= self.config.max_seq_len:
                raise ValueError(f"position {int(positions.max())} is beyond the model's context "
                                 f"of {self.config.max_seq_len} tokens")
            if int(tokens.max()) >= self.config.vocab_size or int(tokens.min()) < 0:
                raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}); got "
                                 f"[{int(tokens.min())}, {int(tokens.max())}]")
        x = self.model.embed_tokens(tokens)  # (B, T, d)
        c = self.config
        rope = rope_cos_sin(positions, c.head_dim, c.rope_theta, x.dtype)  # once, for every layer
        for layer in self.model.layers:
            x = layer(x, positions, cache, rope)
        if last_only:
            x = x[:, -1:]
        elif logits_at is not None:
            x = x[:, logits_at]
        return self.lm_head(self.model.norm(x))  # (B, T, V)

    # Read from the embedding table, which stays in the compute dtype when the linear layers
    # are quantized (``inferlab.model.quant``): a lookup reads one row, not the whole table.
    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype


def init_weights(model: Llama, seed: int = 0, std: float = 0.02) -> Llama:
    """Fill every weight deterministically: N(0, std) for matrices, zeros for biases, ones for norms.

    Output projections are scaled by 1/sqrt(2 L) as in GPT-2, so activations stay O(1) in a
    deep random model and its logits are not degenerate.
    """
    gen = torch.Generator(device=model.device).manual_seed(seed)
    scale_out = 1 / math.sqrt(2 * model.config.n_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():  # shared (tied) tensors appear once
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                s = std * scale_out if name.endswith(("o_proj.weight", "down_proj.weight", ".w2.weight")) else std
                p.normal_(0.0, s, generator=gen)
    return model


def build_model(config: ModelConfig | str, seed: int = 0, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32) -> Llama:
    """A model with random weights from ``seed``, built straight on ``device`` in ``dtype``.

    The module is first built on the meta device (no memory, no default init), so even a
    7B-shaped model is built in seconds on a GPU.
    """
    from inferlab.device import parse_dtype

    if isinstance(config, str):
        config = ModelConfig.from_name(config)
    dtype = parse_dtype(dtype)
    with torch.device("meta"):
        model = Llama(config)
    model = model.to_empty(device=device).to(dtype)
    if config.tie_embeddings:  # to_empty allocates tied tensors separately; tie them again
        model.lm_head.weight = model.model.embed_tokens.weight
    return init_weights(model, seed).eval()
