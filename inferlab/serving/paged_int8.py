"""The paged K/V pool in int8: a quarter of float32's bytes per cached number (half of bfloat16's).

Chapter 5's ``Int8KVCache`` (``inferlab.model.kv_cache``) stores each new K (and V) vector of
one head as int8 codes with one float32 scale, s = max|k| / 127; this pool stores them the same
way, by the same rule (``Int8KVCache.quantize``), in blocks: codes (L, blocks, K, D, S) and
(L, blocks, K, S, D) as the float pool lays them out, and scales (L, blocks, K, S) for each of
K and V. A token then takes D + 4 bytes per head and tensor instead of 4 D, so a pool of the
same bytes holds nearly four times the tokens of a float32 one (``block_bytes`` counts both).

Reading is the reference's, not a fast kernel's: at every layer the layer's pool is
dequantized to the compute dtype and attention runs as it does over the float pool; the new
tokens are attended as the cache will hand them back later, rounded. What it shows is the
quality and the capacity of an int8 cache behind the whole engine (``serve(...,
ServingConfig(kv_cache_dtype="int8"))``), not its speed: a fused kernel would read the codes
in place (vLLM's FP8 KV cache does the same trade, with its own kernels).
"""

from __future__ import annotations

import torch

from inferlab.model.kv_cache import Int8KVCache
from inferlab.serving.paged_cache import BlockManager, PagedKVCache, cache_dtype


class Int8PagedKVCache(PagedKVCache):
    """A ``PagedKVCache`` whose K and V are int8 codes with a float32 scale per token and head;
    attention computes in ``dtype``."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, memory: BlockManager,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 use_triton: bool | None = None, n_heads: int | None = None):
        super().__init__(n_layers, n_kv_heads, head_dim, memory, torch.int8, device,
                         use_triton=False, n_heads=n_heads)  # the fused kernel reads floats
        S = memory.block_size
        self.k_scale = torch.ones((n_layers, memory.num_blocks, n_kv_heads, S),
                                  dtype=torch.float32, device=device)
        self.v_scale = torch.ones_like(self.k_scale)
        self.pools = (self.k, self.v, self.k_scale, self.v_scale)  # copy-on-write copies all
        self.compute_dtype = dtype

    def write(self, layer, meta, k, v):
        """Quantize the new tokens' k, v (1, K, N, D), store codes and scales at their slots;
        return the new k, v rounded as stored and the layer's pools dequantized to the compute
        dtype."""
        if k.dtype != self.compute_dtype:
            raise ValueError(f"k is {k.dtype} but this pool computes in {self.compute_dtype}")
        blocks, offsets = meta.slot_blocks, meta.slot_offsets
        codes_k, scale_k = Int8KVCache.quantize(k[0].transpose(0, 1))  # (N, K, D), (N, K, 1)
        codes_v, scale_v = Int8KVCache.quantize(v[0].transpose(0, 1))
        self.k[layer][blocks, :, :, offsets] = codes_k
        self.v[layer][blocks, :, offsets] = codes_v
        self.k_scale[layer][blocks, :, offsets] = scale_k[..., 0]
        self.v_scale[layer][blocks, :, offsets] = scale_v[..., 0]
        cd = self.compute_dtype
        k = (codes_k.float() * scale_k).to(cd).transpose(0, 1)[None]  # (1, K, N, D)
        v = (codes_v.float() * scale_v).to(cd).transpose(0, 1)[None]
        k_pool = (self.k[layer].float() * self.k_scale[layer][:, :, None, :]).to(cd)
        v_pool = (self.v[layer].float() * self.v_scale[layer][..., None]).to(cd)
        return k, v, k_pool, v_pool  # pools: (blocks, K, D, S), (blocks, K, S, D)


def pool_for(model, config, **kwargs) -> PagedKVCache:
    """The pool ``config`` (a ``ServingConfig``) asks for, for ``model``: int8 codes with
    ``config.kv_cache_dtype="int8"``, K and V in the model's dtype otherwise (``kwargs`` go to
    ``PagedKVCache.for_model``). The engine, the online engine and the simulator build theirs
    here."""
    cls = Int8PagedKVCache if cache_dtype(model, config) == torch.int8 else PagedKVCache
    return cls.for_model(model, config, **kwargs)
