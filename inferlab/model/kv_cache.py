"""The reference KV cache: preallocated K and V buffers per layer, filled as tokens arrive.

Without a cache, every new token recomputes K and V for the whole prefix: generating n tokens
costs O(n^2) projections. With one, each token's K and V are computed once and stored, and a
decode step only projects the newest token, at the price of 2 x layers x KV heads x head_dim
numbers of memory per token (``inferlab.model.config.kv_bytes_per_token``).

The buffers are allocated once, at full size, as gpt-fast does, so decoding never reallocates
and the memory a request will need is known up front. Every sequence in the batch sits at the
same position (one prompt length per batch); ragged batches are the paged cache's job
(``inferlab.serving.paged_cache``). Mistakes raise: writing past the capacity, or K/V of the
wrong shape, dtype or device, is an error, never a silent truncation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inferlab.model.config import kv_bytes_per_token
from inferlab.validation import positive_ints


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q (B, H, T, D) over k, v (B, K, S, D), where K divides H; mask (T, S) or None.

    For one new token (T = 1) the g = H / K query heads that share a KV head are stacked as g
    queries against that head: (B, K, g, D) over (B, K, S, D). Each KV head is then read once
    for its whole group, which is what makes GQA and MQA decode read fewer bytes; the generic
    ``enable_gqa`` path may expand K and V to H heads first on some backends.
    """
    B, H, T, D = q.shape
    K = k.shape[1]
    if T == 1 and H != K:
        out = F.scaled_dot_product_attention(q.reshape(B, K, H // K, D), k, v, attn_mask=mask)
        return out.reshape(B, H, 1, D)  # query head h used KV head h // (H / K), as enable_gqa does
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=H != K)


class CacheFullError(RuntimeError):
    """Raised when a write would go past the cache's capacity."""


class KVCache:
    """K and V for ``n_layers`` layers: buffers of shape (L, B, K, T_max, D)."""

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        positive_ints("KVCache ", n_layers=n_layers, batch=batch, n_kv_heads=n_kv_heads,
                      max_len=max_len, head_dim=head_dim)
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0  # tokens stored so far, the same for every sequence in the batch

    @classmethod
    def for_model(cls, model, batch: int, max_len: int | None = None) -> "KVCache":
        """A cache shaped for ``model`` (an ``inferlab.model.llama.Llama``), in its dtype and device."""
        c = model.config
        max_len = c.max_seq_len if max_len is None else max_len
        if max_len > c.max_seq_len:
            raise ValueError(f"max_len={max_len} exceeds the model's context of {c.max_seq_len}")
        return cls(c.n_layers, batch, c.n_kv_heads, max_len, c.head_dim, model.dtype, model.device)

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def n_kv_heads(self) -> int:
        return self.k.shape[2]

    @property
    def head_dim(self) -> int:
        return self.k.shape[4]

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token of one sequence occupies (``kv_bytes_per_token``)."""
        return kv_bytes_per_token(self, self.k.element_size())

    @property
    def nbytes(self) -> int:
        """Bytes the buffers occupy (allocated, whether filled or not)."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def bytes_used(self) -> int:
        """Bytes that hold real tokens: the filled part of the buffers."""
        return self.nbytes * self.length // self.max_len

    def reset(self) -> None:
        """Forget every stored token (the buffers are reused, not freed)."""
        self.length = 0

    def _validate(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range: the cache has {self.n_layers} layers")
        expected = (self.batch, self.k.shape[2], positions.shape[-1], self.k.shape[4])
        for name, t in (("k", k), ("v", v)):
            if tuple(t.shape) != expected:
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {expected} "
                                 "(batch, KV heads, new tokens, head_dim)")
            if t.dtype != self.dtype:
                raise TypeError(f"{name} is {t.dtype} but the cache holds {self.dtype}; "
                                f"cast with .to({self.dtype}) or build the cache in {t.dtype}")
            if t.device != self.k.device:
                raise ValueError(f"{name} is on {t.device} but the cache is on {self.k.device}")
        if positions.dim() != 1:
            raise ValueError("KVCache takes positions of shape (T,), shared by the batch; "
                             "ragged batches need the paged cache")
        if positions.numel() == 0:
            raise ValueError("positions is empty: there is nothing to store")
        if positions.dtype.is_floating_point or positions.dtype == torch.bool:
            raise TypeError(f"positions must be integer token indices, got {positions.dtype}")
        if positions.device != self.k.device:
            raise ValueError(f"positions are on {positions.device} but the cache is on "
                             f"{self.k.device}")
        start, end = int(positions[0]), int(positions[-1]) + 1
        if start < 0:
            raise ValueError(f"positions must be >= 0, got {start}")
        if end - start != positions.numel() or (positions.numel() > 1 and
                                                bool((positions.diff() != 1).any())):
            raise ValueError("positions must be consecutive, e.g. torch.arange(start, end)")
        if start > self.length:
            raise ValueError(f"positions start at {start} but only {self.length} tokens are "
                             "stored: a gap would leave garbage in the cache")
        if end > self.max_len:
            raise CacheFullError(f"writing positions {start}..{end - 1} needs {end} slots but the "
                                 f"cache holds {self.max_len}; build a larger cache "
                                 f"(KVCache.for_model(model, batch, max_len={end}))")
        return start, end

    def update(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, K, T, D) at ``positions`` (T,) and return all K, V stored for ``layer``.

        Returns views (B, K, end, D), where end is one past the last position written.
        """
        start, end = self._validate(layer, positions, k, v)
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        if layer == self.n_layers - 1:  # every layer has now stored these positions
            self.length = max(self.length, end)
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """Store the new k, v, then attend q (B, H, T, D) over every stored token (causally)."""
        k_all, v_all = self.update(layer, positions, k, v)  # (B, K, end, D)
        T, end = q.shape[-2], k_all.shape[-2]
        if T == end:  # a prefill into an empty cache: plain causal attention, no mask to build
            return F.scaled_dot_product_attention(q, k_all, v_all, is_causal=T > 1,
                                                  enable_gqa=q.shape[1] != k_all.shape[1])
        mask = None
        if T > 1:  # query at position p sees keys 0..p
            mask = torch.arange(end, device=q.device) <= positions[:, None]  # (T, end)
        return grouped_attention(q, k_all, v_all, mask)


class StaticKVCache(KVCache):
    """A KVCache whose attention always spans the whole buffer, so no shape depends on the length.

    ``KVCache.attend`` slices the buffers to the tokens stored so far, which changes a tensor's
    shape at every step and reads ``positions`` on the host: fine in eager mode, but under
    ``torch.compile`` each new length is a new graph, and CUDA graphs need fixed shapes. This
    variant writes with ``index_copy_`` at ``positions`` (a device tensor) and masks out the
    unfilled slots instead, as gpt-fast's cache does. The answers are the same; each step reads
    the whole buffer, so size it to the context you need.

    In eager mode it validates and keeps ``length`` like KVCache. Inside a compiled function, or
    with ``checks = False``, it does neither (both read device values on the host, which makes
    a GPU wait): the caller then owns ``length``.
    """

    checks: bool = True

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        eager = self.checks and not torch.compiler.is_compiling()
        if eager:
            self._validate(layer, positions, k, v)
        k_all, v_all = self.k[layer], self.v[layer]  # (B, K, T_max, D)
        k_all.index_copy_(2, positions, k)
        v_all.index_copy_(2, positions, v)
        mask = torch.arange(self.max_len, device=q.device) <= positions[:, None]  # (T, T_max)
        out = grouped_attention(q, k_all, v_all, mask)
        if eager and layer == self.n_layers - 1:
            self.length = max(self.length, int(positions[-1]) + 1)
        return out


class Int8KVCache(KVCache):
    """A KVCache that stores K and V as int8, one float32 scale per token and KV head.

    Each new K (and V) vector of one head, (D,), is quantized symmetrically: s = max|k| / 127,
    codes round(k / s) (``inferlab.model.quant``'s rule with one group per vector). A token
    then occupies D + 4 bytes per head and tensor instead of 2 D (bfloat16) or 4 D (float32):
    the cache holds about twice (four times) as many tokens in the same memory. Attention
    dequantizes the stored prefix to the compute dtype before it reads it: this reference
    shows the quality cost, not the speed; a fused kernel would read the codes directly.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        super().__init__(n_layers, batch, n_kv_heads, max_len, head_dim, torch.int8, device)
        scale_shape = (n_layers, batch, n_kv_heads, max_len, 1)
        self.k_scale = torch.ones(scale_shape, dtype=torch.float32, device=device)
        self.v_scale = torch.ones(scale_shape, dtype=torch.float32, device=device)
        self.compute_dtype = dtype

    @property
    def dtype(self) -> torch.dtype:
        return self.compute_dtype

    @property
    def bytes_per_token(self) -> int:
        """int8 numbers (``kv_bytes_per_token`` at 1 byte) plus one scale per head."""
        scales = 2 * self.n_layers * self.n_kv_heads * self.k_scale.element_size()
        return kv_bytes_per_token(self, 1) + scales

    @property
    def nbytes(self) -> int:
        return self.bytes_per_token * self.batch * self.max_len

    @staticmethod
    def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes (..., D) int8 and scales (..., 1) float32 of vectors x (..., D), one scale each
        (the paged int8 pool, ``inferlab.serving.paged_int8``, stores by the same rule)."""
        scale = x.float().abs().amax(-1, keepdim=True) / 127  # (B, K, T, 1)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale

    def update(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Quantize and store k, v (B, K, T, D); return every stored K, V dequantized."""
        start, end = self._validate(layer, positions, k, v)
        for codes, scales, new in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            q, s = self.quantize(new)
            codes[layer, :, :, start:end] = q
            scales[layer, :, :, start:end] = s
        if layer == self.n_layers - 1:
            self.length = max(self.length, end)
        k_all = (self.k[layer, :, :, :end].float() * self.k_scale[layer, :, :, :end])
        v_all = (self.v[layer, :, :, :end].float() * self.v_scale[layer, :, :, :end])
        return k_all.to(self.compute_dtype), v_all.to(self.compute_dtype)  # (B, K, end, D)
