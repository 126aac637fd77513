"""A ragged batch in one forward pass: decode rows and prefill chunks packed end to end.

Chunked prefill (Sarathi-Serve, Agrawal et al. 2024) runs sequences of very different lengths
in one forward pass: decode rows bring one new token each, prefill rows tens or hundreds, and a
prefill chunk may continue a prompt whose first tokens are already in the cache. Padding every
row to the longest would multiply the work of the one-token rows, so the rows are *packed*:
their new tokens are laid end to end in one row of N = (sum of new tokens) tokens, each at its
own position (the "varlen" layout of vLLM and FlashAttention). The weight matmuls do not care
which sequence a token belongs to; only attention does, so it runs by segment:

- the leading one-token rows (the decodes) together, read in place from the blocks
  (``inferlab.serving.paged_attention.paged_decode``, or the fused Triton kernel on a GPU);
- a row whose new tokens start its sequence, causally over those tokens alone (SDPA);
- a row that continues a cached prompt, over the cached tokens and its own, with the causal
  mask shifted by what is cached; its blocks are gathered first, as the cache does for any
  prefill over cached tokens.

Every forward of the engine is such a batch (a decode batch is d one-token rows, a whole
prompt one segment), and Lab 3's padded (B, T) batches are packed into one at the cache.
``prepare`` builds all of it once per forward pass, from Python lists, in one host-to-device
copy; ``attend`` is what the cache (``inferlab.serving.paged_cache``) calls at every layer.
``RaggedMetadata.last_index`` says where each row's last token sits, the only positions whose
logits the model needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inferlab.serving.block_manager import BlockTable, blocks_for
from inferlab.serving.paged_attention import (block_gather_index, decode_index, gather_blocks,
    paged_decode, to_device)


@dataclass(frozen=True)
class Segment:
    """A row of more than one new token (or a one-token row after the decodes): where its
    tokens sit in the packed row, and what it attends over beyond them."""

    offset: int                          # its first token's index in the packed row
    length: int                          # T, its new tokens
    tiles: torch.Tensor | None = None    # (K*W,) blocks to gather; None: nothing cached before
    mask: torch.Tensor | None = None     # (1, 1, T, W*block_size): keys each query sees


@dataclass(frozen=True)
class RaggedMetadata:
    """Everything one packed forward's attention needs, shared by every layer."""

    query_lens: tuple[int, ...]          # new tokens of each row
    slot_blocks: torch.Tensor            # (N,) where each new token's K/V go
    slot_offsets: torch.Tensor           # (N,)
    last_index: torch.Tensor             # (R,) each row's last token in the packed row
    decode_rows: int                     # the leading one-token rows, attended together
    decode_tables: torch.Tensor | None   # (d, W) their block tables
    decode_context: torch.Tensor | None  # (d,) keys each of them attends over
    key_rows: torch.Tensor | None        # paged_decode's indices (CPU path)
    value_rows: torch.Tensor | None
    decode_mask: torch.Tensor | None     # (d, 1, W*block_size); None: every key
    segments: tuple[Segment, ...]
    fused: bool                          # decodes through the Triton kernel

    @property
    def batch(self) -> int:
        return len(self.query_lens)


def prepare(tables: list[BlockTable], tokens: list[list[int]], starts: list[int],
            block_size: int, n_kv_heads: int, head_dim: int, device: torch.device,
            fused: bool = False, group: int = 1):
    """Input ids (1, N), positions (1, N) and the ``RaggedMetadata`` of one packed forward.

    Row b brings ``tokens[b]``, the tokens at positions ``starts[b]`` onwards of the sequence
    whose table is ``tables[b]``; the table must have slots for them. Put the one-token rows
    first: they are attended together. ``group`` query heads share a KV head.
    """
    lens = [len(t) for t in tokens]
    if not lens or min(lens) < 1 or len(tables) != len(lens) or len(starts) != len(lens):
        raise ValueError("need one table, one start and at least one new token for every row")
    for b, (table, start, n) in enumerate(zip(tables, starts, lens)):
        if start < 0 or start + n > table.num_tokens:
            raise ValueError(f"row {b} runs positions {start}..{start + n - 1} but its table "
                             f"holds {table.num_tokens} slots; append to the table first")
    d = next((b for b, n in enumerate(lens) if n != 1), len(lens))  # leading one-token rows
    positions = [range(s, s + n) for s, n in zip(starts, lens)]
    width = [blocks_for(s + n, block_size) for s, n in zip(starts, lens)]  # blocks each reads
    wd = max(width[:d], default=0)
    cached = [b for b in range(d, len(lens)) if starts[b] > 0]
    ends = [sum(lens[:b + 1]) - 1 for b in range(len(lens))]
    ids, pos, blocks, offsets, last, dec_tables, dec_context, *seg_tables = to_device([
        [x for row in tokens for x in row],
        [p for ps in positions for p in ps],
        [t.blocks[p // block_size] for t, ps in zip(tables, positions) for p in ps],
        [p % block_size for ps in positions for p in ps],
        ends,
        [x for b in range(d) for x in tables[b].blocks[:width[b]] + [0] * (wd - width[b])],
        [starts[b] + 1 for b in range(d)],
        *[tables[b].blocks[:width[b]] for b in cached]], device)
    decode_tables = dec_tables.view(d, wd) if d else None
    key_rows = value_rows = decode_mask = None
    fused = fused and d > 0
    if d and not fused:
        key_rows, value_rows = decode_index(decode_tables, n_kv_heads, group, head_dim,
                                            block_size)
        if any(starts[b] + 1 != wd * block_size for b in range(d)):  # some keys are padding
            key_pos = torch.arange(wd * block_size, device=device)
            decode_mask = (key_pos < dec_context.view(d, 1))[:, None]  # (d, 1, keys)
    segments, tables_of = [], dict(zip(cached, seg_tables))
    for b in range(d, len(lens)):
        tiles = mask = None
        if b in tables_of:
            tiles = block_gather_index(tables_of[b].view(1, -1), n_kv_heads)
            key_pos = torch.arange(width[b] * block_size, device=device)
            query_pos = pos[ends[b] - lens[b] + 1:ends[b] + 1]
            mask = (key_pos <= query_pos.view(-1, 1))[None, None]  # (1, 1, T, keys)
        segments.append(Segment(ends[b] - lens[b] + 1, lens[b], tiles, mask))
    meta = RaggedMetadata(tuple(lens), blocks, offsets, last, d, decode_tables,
                          dec_context if d else None, key_rows, value_rows, decode_mask,
                          tuple(segments), fused)
    return ids.view(1, -1), pos.view(1, -1), meta


def attend(meta: RaggedMetadata, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           k_pool: torch.Tensor, v_pool: torch.Tensor, buffers: dict) -> torch.Tensor:
    """Attention of the packed row's queries q (1, H, N, D): (1, H, N, D).

    ``k`` and ``v`` (1, K, N, D) are the new tokens' (already written to the pools); ``k_pool``
    (blocks, K, D, S) and ``v_pool`` (blocks, K, S, D) are one layer's.
    """
    H, K = q.shape[1], k.shape[1]
    out = torch.empty_like(q)
    d = meta.decode_rows
    if d:
        qd = q[0, :, :d].transpose(0, 1).unsqueeze(2)  # (d, H, 1, D)
        if meta.fused:
            from inferlab.serving.paged_triton import paged_decode_attention
            od = paged_decode_attention(qd.contiguous(), k_pool, v_pool, meta.decode_tables,
                                        meta.decode_context)
        else:
            od = paged_decode(qd, k_pool, v_pool, meta.key_rows, meta.value_rows,
                              meta.decode_mask)
        out[0, :, :d] = od[:, :, 0].transpose(0, 1)
    for seg in meta.segments:
        rows = slice(seg.offset, seg.offset + seg.length)
        if seg.tiles is None:  # the sequence starts here: attend its own new tokens
            out[:, :, rows] = F.scaled_dot_product_attention(
                q[:, :, rows], k[:, :, rows], v[:, :, rows], is_causal=seg.length > 1,
                enable_gqa=H != K)
        else:  # continue a cached prompt: its blocks, the causal mask shifted by the cache
            k_all, v_all = gather_blocks(k_pool, v_pool, seg.tiles, 1, buffers)
            out[:, :, rows] = F.scaled_dot_product_attention(
                q[:, :, rows], k_all, v_all, attn_mask=seg.mask, enable_gqa=H != K)
    return out
