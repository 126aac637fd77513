"""An FP8 KV cache as engines ship it: E4M3 codes with one float32 scale per tensor or per head.

vLLM's ``--kv-cache-dtype fp8`` stores K and V in FP8 with a scale per layer for K and one for
V ("per-tensor"), or, with scales calibrated by llm-compressor, one per KV head; without
calibration every scale is 1.0, and ``calculate_kv_scales`` sets them once from the first batch
as amax / (FP8's largest value) (vLLM docs, "Quantized KV Cache"). ``Fp8KVCache`` does the same:
``scales="unit"`` keeps 1.0, ``"tensor"`` and ``"head"`` set each layer's K and V scales from the
first write to that layer (a prefill) and keep them for every later token, so a later token
larger than the calibration batch saturates at the largest FP8 value.

Compare ``inferlab.model.kv_cache.Int8KVCache``: int8 with a scale per token and head, computed
for every token as it is written; here a token costs D bytes per head and tensor, with no
per-token scale. Attention reads the codes back as floats (a reference for quality, not speed).
"""

from __future__ import annotations

import torch

from inferlab.model.formats import FP8, fp8_max, to_fp8
from inferlab.model.kv_cache import KVCache


class Fp8KVCache(KVCache):
    """K and V stored as FP8 (``fmt``) with static scales: per tensor, per KV head, or 1.0."""

    fmt: str = "e4m3"
    scales: str = "tensor"  # "tensor", "head" or "unit"

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        super().__init__(n_layers, batch, n_kv_heads, max_len, head_dim, FP8[self.fmt], device)
        self.compute_dtype = dtype
        shape = (n_layers, 1, n_kv_heads, 1, 1)
        self.k_scale = torch.ones(shape, device=device)
        self.v_scale = torch.ones(shape, device=device)
        self.calibrated = [self.scales == "unit"] * n_layers

    @classmethod
    def variant(cls, scales: str, fmt: str = "e4m3") -> type:
        """A subclass with these settings, to hand to code that builds caches by class."""
        if scales not in ("tensor", "head", "unit") or fmt not in FP8:
            raise ValueError(f"scales must be tensor, head or unit and fmt one of {list(FP8)}")
        return type(f"Fp8KVCache_{fmt}_{scales}", (cls,), {"scales": scales, "fmt": fmt})

    @property
    def dtype(self) -> torch.dtype:
        return self.compute_dtype

    def _scale_of(self, x: torch.Tensor) -> torch.Tensor:
        dims = (0, 1, 2, 3) if self.scales == "tensor" else (0, 2, 3)  # x: (B, K, T, D)
        amax = x.float().abs().amax(dim=dims, keepdim=True)
        amax = amax if self.scales == "head" else amax.expand(1, x.shape[1], 1, 1)
        return torch.where(amax > 0, amax / fp8_max(self.fmt), torch.ones_like(amax))[:1]

    def update(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        start, end = self._validate(layer, positions, k, v)
        if not self.calibrated[layer]:
            self.k_scale[layer] = self._scale_of(k)[0]
            self.v_scale[layer] = self._scale_of(v)[0]
            self.calibrated[layer] = True
        self.k[layer, :, :, start:end] = to_fp8(k / self.k_scale[layer], self.fmt)
        self.v[layer, :, :, start:end] = to_fp8(v / self.v_scale[layer], self.fmt)
        if layer == self.n_layers - 1:
            self.length = max(self.length, end)
        k_all = self.k[layer, :, :, :end].float() * self.k_scale[layer]
        v_all = self.v[layer, :, :, :end].float() * self.v_scale[layer]
        return k_all.to(self.compute_dtype), v_all.to(self.compute_dtype)  # (B, K, end, D)
