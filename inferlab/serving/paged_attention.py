"""Attention over a paged cache on any device: gather the blocks, then attend, and how it compares.

A paged cache scatters each sequence's K/V over fixed-size blocks of one pool (Kwon et al. 2023).
Attention needs them in position order, so the portable path gathers them into a contiguous
tensor and calls ``scaled_dot_product_attention`` (SDPA); the fused GPU kernel of
``inferlab.serving.paged_triton`` reads the blocks in place instead.

How the gather lands decides what it costs. The cache's pool is laid out (blocks, K, block_size,
D): one block of one KV head is a contiguous (block_size, D) tile. Seen as rows of a
(blocks x K, block_size, D) tensor, tile (block, head) is row ``block * K + head``, so one
``index_select`` over the rows ``table[b][j] * K + k``, taken in the order (b, k, j), writes
straight into a contiguous (B, K, N, D) tensor, the layout SDPA reads fastest (``gather_blocks``).
A pool laid out (slots, K, D), token-major, can only be gathered to (B, N, K, D) and then
transposed, which leaves SDPA a strided tensor (``gather_index`` and ``gather_kv``: the simplest
version, which Lab 3's exercise writes and its check uses as a reference).

``kernel_inputs`` and ``attention_paths`` set one batch of K/V up both ways (contiguous and paged)
and return the implementations as functions, for Lab 3 and ``python -m inferlab.benchmarks.paged``
to time side by side.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inferlab.serving import paged_triton
from inferlab.serving.block_manager import BlockAllocator, BlockTable


def gather_index(tables: list[BlockTable], lengths: list[int],
                 device: str | torch.device = "cpu") -> torch.Tensor:
    """Slots (B, N) of tokens 0..lengths[b]-1 of each table; N = max(lengths), padded with 0.

    Padding points at slot 0, which holds some other sequence's K/V: mask those keys out.
    """
    idx = torch.zeros(len(tables), max(lengths), dtype=torch.long, device=device)
    for b, (table, n) in enumerate(zip(tables, lengths)):
        idx[b, :n] = table.slot_mapping(torch.arange(n, device=device))
    return idx


def gather_kv(pool: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """K or V from a token-major pool (num_slots, K, D) at slots ``index`` (B, N): (B, K, N, D).

    The result is a transposed view: SDPA reads it with strides. The cache gathers with
    ``gather_blocks`` instead.
    """
    B, N = index.shape
    return pool[index.reshape(-1)].view(B, N, *pool.shape[1:]).transpose(1, 2)  # (B, K, N, D)


def block_gather_index(block_tables: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Rows (B x K x W,) of the (blocks x K, block_size, D) view to gather, in (b, k, j) order.

    ``block_tables`` (B, W) holds each row's physical blocks (padding: any valid block).
    """
    heads = torch.arange(n_kv_heads, device=block_tables.device)
    return (block_tables[:, None, :] * n_kv_heads + heads[None, :, None]).reshape(-1)


def gather_blocks(pool: torch.Tensor, index: torch.Tensor, batch: int,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """K or V of one layer's pool (blocks, K, block_size, D) at ``index``: (B, K, W*block_size, D).

    ``index`` comes from ``block_gather_index``. ``out`` (rows, block_size, D), rows >= the
    index's length, is a buffer to gather into: reusing one matters on a CPU, where a fresh
    buffer of tens of MB at every layer costs more in page faults than the copy itself.
    """
    num_blocks, K, S, D = pool.shape
    tiles = pool.view(num_blocks * K, S, D)
    if out is None:
        rows = tiles.index_select(0, index)
    else:
        rows = torch.index_select(tiles, 0, index, out=out[: index.numel()])
    return rows.view(batch, K, -1, D)  # contiguous: (B, K, W*S, D)


def kernel_inputs(batch: int, context: int, n_heads: int, n_kv_heads: int, head_dim: int,
                  block_size: int = 16, dtype=torch.float32, device="cpu", seed: int = 0) -> dict:
    """One decode step's K/V stored twice: contiguous (B, K, N, D), and paged in scattered blocks.

    The paged copy uses the cache's layout, (blocks, K, block_size, D) for K and for V.
    """
    g = torch.Generator().manual_seed(seed)
    blocks_each = -(-context // block_size)
    num_blocks = batch * blocks_each
    alloc = BlockAllocator(num_blocks)
    alloc._free = type(alloc._free)(torch.randperm(num_blocks, generator=g).tolist())  # scatter
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
    return dict(q=q, k=k, v=v, k_pool=pools[0], v_pool=pools[1], block_size=block_size,
                block_table=block_table, index=block_gather_index(block_table, n_kv_heads),
                context_lens=torch.full((batch,), context, dtype=torch.long, device=device))


def attention_paths(x: dict) -> dict:
    """The decode-attention implementations to compare, as functions of no arguments.

    ``contiguous``: SDPA over K/V stored contiguously (the floor). ``gather_then_attend``: the
    paged cache's portable path (``gather_blocks`` into reused buffers, then SDPA, masking
    keys past each row's context). ``triton_fused``: the fused kernel, where it can run.
    """
    q, k, v = x["q"], x["k"], x["v"]
    B, H, _, D = q.shape
    K, N = k.shape[1], k.shape[2]
    gqa = H != K
    width = x["block_table"].shape[1] * x["block_size"]
    mask = None
    if width != N:  # the last block is partly filled: hide its empty slots
        mask = (torch.arange(width, device=q.device) < N)[None, None, None]
    k_buf = torch.empty(x["index"].numel(), x["block_size"], D, dtype=q.dtype, device=q.device)
    v_buf = torch.empty_like(k_buf)  # as the cache reuses its own

    def gather_then_attend():
        k_all = gather_blocks(x["k_pool"], x["index"], B, k_buf)
        v_all = gather_blocks(x["v_pool"], x["index"], B, v_buf)
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=gqa)

    paths = {
        "contiguous": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa),
        "gather_then_attend": gather_then_attend,
    }
    if q.device.type == "cuda" and paged_triton.available(q.device):
        paths["triton_fused"] = lambda: paged_triton.paged_decode_attention(
            q, x["k_pool"], x["v_pool"], x["block_table"], x["context_lens"])
    return paths
