"""Attention over a paged cache on any device, reading each block where it lies, and what it costs.

A paged cache scatters each sequence's K/V over fixed-size blocks of one pool (Kwon et al. 2023).
The obvious portable way to attend over them is to gather the blocks into a contiguous tensor
and call ``scaled_dot_product_attention`` (SDPA): every K/V byte is then read, written and read
again, which costs about three times the contiguous attention on a CPU. The fused GPU kernel
of ``inferlab.serving.paged_triton`` instead reads each block in place through the block table.

A CPU can do the same with one PyTorch operation, ``embedding_bag``, which sums rows of a table
picked by an index, each row scaled by a weight, without copying them anywhere first. Decode
attention is two such sums (``paged_decode``):

- scores: the pool stores keys transposed, one (D, block_size) tile per block and KV head, so
  row (tile, d) holds dimension d of the tile's keys; the score of every key in the tile is the
  sum over d of q[d] times that row (rows picked through the block table, weights from q);
- output: the sum over the row's tokens of softmax(scores)[n] times value row n (values are
  stored one (block_size, D) tile per block and KV head).

The indices (``decode_index``) depend only on the block tables, so they are built once per
forward and shared by every layer. ``gather_blocks`` is the gathering path, kept for prefills
that attend over cached tokens (several queries per row), and ``gather_index`` / ``gather_kv``
the simplest version of it for a token-major pool, which Lab 3's exercise writes and its check
uses as a reference.

``inferlab.benchmarks.attention_paths`` sets one batch of K/V up both ways (contiguous and paged)
and returns these implementations as functions, for Lab 3 and ``python -m
inferlab.benchmarks.paged`` to time side by side.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from inferlab.serving.block_manager import BlockTable


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


def to_device(lists: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """int64 tensors of several host lists, moved to ``device`` in one copy (pinned on a GPU):
    a step's attention metadata crosses to the device once, not once a list."""
    sizes = [len(x) for x in lists]
    host = torch.tensor(list(itertools.chain.from_iterable(lists)), dtype=torch.long)
    if device.type == "cuda":
        host = host.pin_memory().to(device, non_blocking=True)
    elif host.device != device:
        host = host.to(device)
    return list(host.split(sizes))


def block_gather_index(block_tables: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Tiles (B x K x W,) of a (blocks x K, ...) view of the pool, in (b, k, j) order.

    ``block_tables`` (B, W) holds each row's physical blocks (padding: any valid block).
    """
    heads = torch.arange(n_kv_heads, device=block_tables.device)
    return (block_tables[:, None, :] * n_kv_heads + heads[None, :, None]).reshape(-1)


def decode_index(block_tables: torch.Tensor, n_kv_heads: int, group: int, head_dim: int,
                 block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``paged_decode`` sums, from the block tables (B, W); built once per forward.

    Key rows (B*H*W, D): bag (b, h, j) sums rows tile*D + d, d = 0..D-1, of the keys viewed as
    (blocks*K*D, block_size), where tile = table[b][j] * K + h // group. Value rows (B*H, W*S):
    bag (b, h) sums rows tile*S + s of the values viewed as (blocks*K*S, D), in position order.
    """
    B, W = block_tables.shape
    tiles = block_gather_index(block_tables, n_kv_heads).view(B, n_kv_heads, 1, W)
    tiles = tiles.expand(B, n_kv_heads, group, W)                       # (B, K, G, W): h = k*G + g
    dims = torch.arange(head_dim, device=tiles.device)
    slots = torch.arange(block_size, device=tiles.device)
    key_rows = (tiles[..., None] * head_dim + dims).reshape(-1, head_dim)      # (B*H*W, D)
    value_rows = (tiles[..., None] * block_size + slots).reshape(B * n_kv_heads * group, -1)
    return key_rows, value_rows                                                # (B*H, W*S)


def paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 key_rows: torch.Tensor, value_rows: torch.Tensor,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention of q (B, H, 1, D) over one layer's pool, read in place: (B, H, 1, D).

    ``k_pool`` (blocks, K, D, S) and ``v_pool`` (blocks, K, S, D); ``key_rows`` and
    ``value_rows`` from ``decode_index``; ``mask`` (B, 1, W*S) says which keys each row sees
    (None: all of them). Equal to SDPA over the gathered K/V.
    """
    B, H, _, D = q.shape
    S = v_pool.shape[2]
    W = key_rows.shape[0] // (B * H)
    weights = (q * (1 / math.sqrt(D))).view(B, H, 1, D).expand(B, H, W, D)
    scores = F.embedding_bag(key_rows, k_pool.view(-1, S), mode="sum",
                             per_sample_weights=weights.reshape(key_rows.shape))  # (B*H*W, S)
    scores = scores.view(B, H, W * S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)                                          # (B, H, N)
    out = F.embedding_bag(value_rows, v_pool.view(-1, D), mode="sum",
                          per_sample_weights=probs.view(value_rows.shape))        # (B*H, D)
    return out.view(B, H, 1, D)


def gather_blocks(k_pool: torch.Tensor, v_pool: torch.Tensor, tiles: torch.Tensor, batch: int,
                  buffers: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one layer's pool at ``tiles`` (``block_gather_index``): each (B, K, N, D).

    N = W * block_size, contiguous, as SDPA reads fastest; the keys' tiles are transposed back,
    a second copy. ``buffers`` (a dict, filled on first use) keeps the copies' memory between
    calls: on a CPU a fresh buffer of tens of MB costs more in page faults than the copy.
    """
    num_blocks, K, D, S = k_pool.shape
    n = tiles.numel()
    buffers = {} if buffers is None else buffers
    if "v" not in buffers or buffers["v"].shape[0] < n:
        for name, shape in (("k_tiles", (n, D, S)), ("k", (n, S, D)), ("v", (n, S, D))):
            buffers[name] = torch.empty(shape, dtype=k_pool.dtype, device=k_pool.device)
    k_tiles = torch.index_select(k_pool.view(num_blocks * K, D, S), 0, tiles,
                                 out=buffers["k_tiles"][:n])               # (B*K*W, D, S)
    k = buffers["k"][:n]
    k.copy_(k_tiles.transpose(1, 2))                                       # (B*K*W, S, D)
    v = torch.index_select(v_pool.view(num_blocks * K, S, D), 0, tiles, out=buffers["v"][:n])
    return k.view(batch, K, -1, D), v.view(batch, K, -1, D)
