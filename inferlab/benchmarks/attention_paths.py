"""Decode attention over one batch of K/V stored two ways, and each implementation to time.

``kernel_inputs`` stores one decode step's K/V contiguously, (B, K, N, D), and again in a paged
pool whose blocks are scattered the way a running engine leaves them (the cache's layout: keys
(blocks, K, D, block_size), values (blocks, K, block_size, D)). ``attention_paths`` returns the
implementations of ``inferlab.serving.paged_attention`` (and, on a CUDA GPU with Triton,
``inferlab.serving.paged_triton``'s fused kernel) as functions of no arguments, so that Lab 3,
Chapter 3 and ``python -m inferlab.benchmarks.paged`` time them side by side. The engine itself
never calls this module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inferlab.serving import paged_triton
from inferlab.serving.paged_cache import BlockAllocator, BlockTable, blocks_for
from inferlab.serving.paged_attention import (block_gather_index, decode_index, gather_blocks,
                                              paged_decode)


def kernel_inputs(batch: int, context: int, n_heads: int, n_kv_heads: int, head_dim: int,
                  block_size: int = 16, dtype=torch.float32, device="cpu", seed: int = 0) -> dict:
    """One decode step's K/V stored twice: contiguous (B, K, N, D), and paged in scattered blocks.

    The paged copy uses the cache's layout: keys (blocks, K, D, block_size), values
    (blocks, K, block_size, D).
    """
    g = torch.Generator().manual_seed(seed)
    blocks_each = blocks_for(context, block_size)
    num_blocks = batch * blocks_each
    alloc = BlockAllocator(num_blocks, torch.randperm(num_blocks, generator=g).tolist())  # scatter
    tables = []
    for _ in range(batch):
        t = BlockTable(alloc, block_size)
        t.append(context)
        tables.append(t)
    q = torch.randn(batch, n_heads, 1, head_dim, generator=g).to(device, dtype)
    k = torch.randn(batch, n_kv_heads, context, head_dim, generator=g).to(device, dtype)
    v = torch.randn(batch, n_kv_heads, context, head_dim, generator=g).to(device, dtype)
    block_table = torch.tensor([t.blocks for t in tables], dtype=torch.long, device=device)
    pools = []
    for x in (k, v):
        pool = torch.zeros(num_blocks, n_kv_heads, block_size, head_dim, dtype=dtype, device=device)
        padded = torch.zeros(batch, n_kv_heads, blocks_each * block_size, head_dim, dtype=dtype,
                             device=device)
        padded[:, :, :context] = x
        tiles = padded.view(batch, n_kv_heads, blocks_each, block_size, head_dim)
        pool[block_table] = tiles.transpose(1, 2)  # (B, W, K, S, D) into the scattered blocks
        pools.append(pool)
    k_pool = pools[0].transpose(-1, -2).contiguous()  # keys stored transposed: (blocks, K, D, S)
    key_rows, value_rows = decode_index(block_table, n_kv_heads, n_heads // n_kv_heads,
                                        head_dim, block_size)
    mask = None
    if blocks_each * block_size != context:  # the last block is partly filled
        mask = (torch.arange(blocks_each * block_size, device=device) < context)[None, None]
    return dict(q=q, k=k, v=v, k_pool=k_pool, v_pool=pools[1], block_size=block_size,
                block_table=block_table, tiles=block_gather_index(block_table, n_kv_heads),
                key_rows=key_rows, value_rows=value_rows, mask=mask,
                context_lens=torch.full((batch,), context, dtype=torch.long, device=device))


def attention_paths(x: dict) -> dict:
    """The decode-attention implementations to compare, as functions of no arguments.

    ``contiguous``: SDPA over K/V stored contiguously (the floor). ``in_place``: the paged
    cache's portable decode path (``paged_decode``: two ``embedding_bag`` sums that read each
    block where it lies). ``gather_then_attend``: gather the blocks into contiguous K/V, then
    SDPA. ``triton_fused``: the fused GPU kernel, where it can run.
    """
    q, k, v = x["q"], x["k"], x["v"]
    B, H = q.shape[:2]
    gqa = H != k.shape[1]
    attn_mask = None if x["mask"] is None else x["mask"][:, None]  # (1, 1, 1, N)

    buffers = {}  # reused between calls, as the cache would

    def gather_then_attend():
        k_all, v_all = gather_blocks(x["k_pool"], x["v_pool"], x["tiles"], B, buffers)
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=attn_mask,
                                              enable_gqa=gqa)

    paths = {
        "contiguous": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa),
        "in_place": lambda: paged_decode(q, x["k_pool"], x["v_pool"], x["key_rows"],
                                         x["value_rows"], x["mask"]),
        "gather_then_attend": gather_then_attend,
    }
    if q.device.type == "cuda" and paged_triton.available(q.device):
        paths["triton_fused"] = lambda: paged_triton.paged_decode_attention(
            q, x["k_pool"], x["v_pool"], x["block_table"], x["context_lens"])
    return paths
