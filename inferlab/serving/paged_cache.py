"""The paged K/V pool: where each forward's new K/V go, and what each row attends over.

The pool holds every layer's K and V in fixed-size blocks: keys (L, blocks, K, D, block_size)
and values (L, blocks, K, block_size, D), so one block of one KV head is one contiguous tile,
keys transposed as vLLM stores them. Decode attention reads the tiles where they lie: on a CPU
with two ``embedding_bag`` sums (``inferlab.serving.paged_attention.paged_decode``), on a GPU
with the fused Triton kernel (``inferlab.serving.paged_triton``); a prefill over cached tokens
gathers them into the (B, K, N, D) layout SDPA reads. Which block belongs to which sequence is
the block manager's business (``inferlab.serving.block_manager``).

Once per forward, not once per layer, the model runner turns the batch's block tables into an
``AttentionMetadata`` (nano-vllm's ``prepare_prefill`` / ``prepare_decode``): where each new
token's K/V go (block and offset), each row's context length and block table, and the rows the
attention reads and the mask. They are built from Python lists and reach the
device in ONE copy (``prepare``), so a step costs no host-device round trip per sequence, and
``attend`` (called by the model at every layer) only writes and reads. Row b's T new tokens are
always the last T tokens of its table; rows may differ in context length (ragged decode).
Rows that differ in their number of new tokens (batched and chunked prefill) are packed into
one row instead (``prepare_ragged``, ``inferlab.serving.ragged``).

``bind(tables, metadata)`` says which sequences the next forward runs (and runs the queued
copy-on-write copies first). Given only the tables, ``bind`` prepares the metadata at the first
layer from the number of new tokens, which is what hand-written loops in the labs do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inferlab.analysis import formulas
from inferlab.serving import ragged
from inferlab.serving.block_manager import BlockManager, BlockTable
from inferlab.serving.paged_attention import (block_gather_index, decode_index, gather_blocks,
    paged_decode, to_device)
from inferlab.validation import positive_ints


@dataclass(frozen=True)
class AttentionMetadata:
    """Everything one forward's attention needs, shared by every layer.

    Host-side (plain Python): ``query_lens`` (new tokens of each row) and ``context_lens`` (keys
    each row attends over: the tokens its table holds). Device-side: the physical block and
    offset of each new token (rows one after another), the block tables (B, W) padded with block
    0, and the context lengths. A decode adds the rows ``paged_decode`` reads, a prefill over
    cached tokens the tiles to gather; both add the mask. A forward whose rows hold nothing but
    their new tokens attends those directly (``from_scratch``).
    """

    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    slot_blocks: torch.Tensor       # (sum of query_lens,)
    slot_offsets: torch.Tensor      # (sum of query_lens,)
    block_tables: torch.Tensor      # (B, W)
    context: torch.Tensor           # (B,)
    fused: bool                     # decode through the Triton kernel
    from_scratch: bool              # every row's context is its new tokens: nothing to read
    key_rows: torch.Tensor | None = None    # (B*H*W, D): decode, see paged_decode
    value_rows: torch.Tensor | None = None  # (B*H, W*S)
    gather: torch.Tensor | None = None  # (B*K*W,) tiles to gather (prefill over cached tokens)
    mask: torch.Tensor | None = None    # (B, 1, T, W*block_size) keys each query sees; None: all

    @property
    def batch(self) -> int:
        return len(self.query_lens)


def prepare(tables: list[BlockTable], tokens: list[list[int]], block_size: int, n_kv_heads: int,
            head_dim: int, device: torch.device, fused: bool = False, group: int = 1):
    """Input ids (B, T), positions (B, T) and the ``AttentionMetadata`` of one forward.

    ``tokens[b]`` are row b's new tokens: the last ``len(tokens[b])`` of its table (every row the
    same length for now). ``group`` query heads share a KV head of ``head_dim``. Everything is
    computed from Python lists and moved in one copy.
    """
    T = len(tokens[0])
    if any(len(t) != T for t in tokens):
        raise ValueError("every row of a forward must bring the same number of new tokens")
    ctx = [t.num_tokens for t in tables]
    for b, n in enumerate(ctx):
        if n < T:
            raise ValueError(f"row {b} runs {T} new tokens but its table holds {n}; call "
                             "table.append first")
    positions = [range(n - T, n) for n in ctx]
    width = max(len(t.blocks) for t in tables)
    ids, pos, blocks, offsets, table_rows, context = to_device([
        [x for row in tokens for x in row],
        [p for ps in positions for p in ps],
        [t.blocks[p // block_size] for t, ps in zip(tables, positions) for p in ps],
        [p % block_size for ps in positions for p in ps],
        [b for t in tables for b in t.blocks + [0] * (width - len(t.blocks))],
        ctx], device)
    B = len(tables)
    block_tables = table_rows.view(B, width)
    from_scratch = all(n == T for n in ctx)
    fused = fused and T == 1 and not from_scratch
    key_rows = value_rows = gather = mask = None
    if not (from_scratch or fused):
        if T == 1:
            key_rows, value_rows = decode_index(block_tables, n_kv_heads, group, head_dim,
                                                block_size)
        else:
            gather = block_gather_index(block_tables, n_kv_heads)
        keys = width * block_size
        if T > 1 or any(n != keys for n in ctx):  # padded keys, or causal within the new tokens
            key_pos = torch.arange(keys, device=device)
            mask = (key_pos <= pos.view(B, T, 1))[:, None]  # (B, 1, T, keys)
    meta = AttentionMetadata(tuple([T] * B), tuple(ctx), blocks, offsets, block_tables,
                             context, fused, from_scratch, key_rows, value_rows, gather, mask)
    return ids.view(B, T), pos.view(B, T), meta


def cache_dtype(model, config=None) -> torch.dtype:
    """The dtype ``PagedKVCache.for_model`` stores K and V in: int8 when ``config`` (a
    ``ServingConfig``) asks for ``kv_cache_dtype="int8"``, else the model's compute dtype (its
    embedding table's), also when its linear layers hold int8 weights."""
    if config is not None and config.kv_cache_dtype == "int8":
        return torch.int8
    return model.dtype


def block_bytes(model_config, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block of the pool takes: K and V, every layer and KV head, ``block_size``
    tokens of ``head_dim`` numbers in ``dtype`` (int8: plus a float32 scale per token and head,
    ``inferlab.serving.paged_int8``): what the cache stores, whatever the weights' format."""
    c = model_config
    per_token = formulas.kv_bytes_per_token(c, dtype.itemsize)
    if dtype == torch.int8:     # K's and V's float32 scale, per layer and KV head
        per_token += 2 * c.n_layers * c.n_kv_heads * 4
    return block_size * per_token


class PagedKVCache:
    """The paged K/V pool of every layer: keys (L, blocks, K, D, block_size), values
    (L, blocks, K, block_size, D); ``n_heads`` query heads share the ``n_kv_heads``."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, memory: BlockManager,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 use_triton: bool | None = None, n_heads: int | None = None):
        n_heads = n_kv_heads if n_heads is None else n_heads
        positive_ints("PagedKVCache ", n_layers=n_layers, n_kv_heads=n_kv_heads,
                      head_dim=head_dim, n_heads=n_heads)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
        S = memory.block_size
        self.k = torch.zeros((n_layers, memory.num_blocks, n_kv_heads, head_dim, S), dtype=dtype,
                             device=device)
        self.v = torch.zeros((n_layers, memory.num_blocks, n_kv_heads, S, head_dim), dtype=dtype,
                             device=device)
        self.group = n_heads // n_kv_heads
        self.memory = memory
        self.block_size = memory.block_size
        self.tables: list[BlockTable] = []
        self.metadata: AttentionMetadata | None = None
        self._lazy = False  # the metadata was prepared at layer 0 and lasts one forward
        self._buffers: dict[str, torch.Tensor] = {}  # reused gather buffers (prefill with context)
        if use_triton is None:  # the fused kernel on a GPU that can run it, the gather elsewhere
            from inferlab.serving import paged_triton
            use_triton = self.k.device.type == "cuda" and paged_triton.available(self.k.device)
        self.use_triton = use_triton

    @classmethod
    def for_model(cls, model, config, use_triton: bool | None = None,
                  memory_class=BlockManager) -> "PagedKVCache":
        """A pool of this class shaped for ``model`` (an ``inferlab.model.llama.Llama``) with the
        blocks of ``config`` (a ``ServingConfig``), computing in the model's dtype on its device,
        managed by a ``memory_class`` (a ``BlockManager``, or the prefix-caching one).
        ``inferlab.serving.paged_int8.pool_for`` picks the class the config asks for."""
        if config.num_blocks is None:
            raise ValueError("PagedKVCache.for_model needs config.num_blocks")
        c = model.config
        memory = memory_class(config.num_blocks, config.block_size, config.watermark)
        return cls(c.n_layers, c.n_kv_heads, c.head_dim, memory, model.dtype, model.device,
                   use_triton, c.n_heads)

    @property
    def allocator(self):
        return self.memory.allocator

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    @property
    def n_kv_heads(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes the K and V pools occupy."""
        return 2 * self.k.numel() * self.k.element_size()

    def new_table(self) -> BlockTable:
        """An empty block table drawing on this cache's allocator."""
        return BlockTable(self.allocator, self.block_size)

    def copy_pending(self) -> None:
        """Run the allocator's queued copy-on-write copies (all layers), oldest first."""
        for source, dest in self.allocator.take_copies():
            self.k[:, dest] = self.k[:, source]
            self.v[:, dest] = self.v[:, source]

    def prepare(self, tables: list[BlockTable], tokens: list[list[int]]):
        """``prepare`` for this pool: input ids, positions and metadata of one forward."""
        return prepare(tables, tokens, self.block_size, self.n_kv_heads, self.k.shape[3],
                       self.k.device, self.use_triton, self.group)

    def prepare_ragged(self, tables: list[BlockTable], tokens: list[list[int]],
                       starts: list[int]):
        """``ragged.prepare`` for this pool: rows of any length packed into one (1, N) row."""
        return ragged.prepare(tables, tokens, starts, self.block_size, self.n_kv_heads,
                              self.k.shape[3], self.k.device, self.use_triton, self.group)

    def bind(self, tables: list[BlockTable], metadata: AttentionMetadata | None = None) -> None:
        """Say which sequences the next forward runs: row b of the batch is ``tables[b]``.

        Each table must already have room for the new tokens (``table.append``). Queued
        copy-on-write copies are done here, before any layer writes.
        """
        for table in tables:
            if table.allocator is not self.allocator:
                raise ValueError("a table from another allocator was bound to this cache")
        if metadata is not None and metadata.batch != len(tables):
            raise ValueError(f"metadata for {metadata.batch} rows, {len(tables)} tables bound")
        self.copy_pending()
        self.tables, self.metadata, self._lazy = list(tables), metadata, False

    def _prepare_at_first_layer(self, q: torch.Tensor, positions: torch.Tensor) -> None:
        B, T = q.shape[0], q.shape[2]
        if len(self.tables) != B:
            raise ValueError(f"the batch has {B} rows but {len(self.tables)} tables are bound; "
                             "call cache.bind(tables) before the forward")
        _, pos, self.metadata = self.prepare(self.tables, [[0] * T] * B)
        given = positions.expand(B, T) if positions.dim() == 1 else positions
        if given.device.type == "cpu" and not torch.equal(given.to(pos.device), pos):
            raise ValueError("the positions passed to the model are not the last tokens of the "
                             "bound tables: append to each table first, then run its newest "
                             "tokens")

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype attention reads K and V in (the pool's, here)."""
        return self.k.dtype

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """Write k, v (B, K, T, D) into the pool; attend q (B, H, T, D) causally over each row."""
        if self.metadata is None:  # bound without metadata: prepare it once, at layer 0
            self._prepare_at_first_layer(q, positions)
            self._lazy = True
        meta = self.metadata
        if self._lazy and layer == self.k.shape[0] - 1:  # prepared for this forward only
            self.metadata, self._lazy = None, False
        B, H, T, D = q.shape
        K = self.k.shape[2]
        if isinstance(meta, ragged.RaggedMetadata):  # rows of any length, packed: (1, N)
            if B != 1 or k.shape != (1, K, T, D) or T != sum(meta.query_lens):
                raise ValueError(f"a packed forward takes (1, {sum(meta.query_lens)}) tokens, "
                                 f"got q {tuple(q.shape)}, k {tuple(k.shape)}")
        elif B != meta.batch or k.shape != (B, K, T, D) or k.dtype != self.compute_dtype:
            raise ValueError(f"k is {tuple(k.shape)} {k.dtype}; expected {(B, K, T, D)} "
                             f"{self.compute_dtype} for the {meta.batch} bound rows")
        rows_k = k.transpose(1, 2).reshape(B * T, K, D)  # (rows, K, D), rows in slot order
        rows_v = v.transpose(1, 2).reshape(B * T, K, D)
        k, v, k_pool, v_pool = self._store(layer, meta, k, v, rows_k, rows_v)
        if isinstance(meta, ragged.RaggedMetadata):
            return ragged.attend(meta, q, k, v, k_pool, v_pool, self._buffers)
        if meta.from_scratch:  # nothing cached before these tokens: attend them directly
            return F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=H != K)
        if meta.fused:
            from inferlab.serving.paged_triton import paged_decode_attention
            return paged_decode_attention(q, k_pool, v_pool, meta.block_tables, meta.context)
        if meta.key_rows is not None:  # decode: read the blocks in place
            mask = None if meta.mask is None else meta.mask[:, :, 0]  # (B, 1, keys)
            return paged_decode(q, k_pool, v_pool, meta.key_rows, meta.value_rows, mask)
        k_all, v_all = gather_blocks(k_pool, v_pool, meta.gather, B, self._buffers)  # (B, K, N, D)
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=meta.mask,
                                              enable_gqa=H != K)

    def _store(self, layer, meta, k, v, rows_k, rows_v):
        """Write the new tokens' K and V (``rows_*``: (rows, K, D)) at their slots; return what
        attention reads: the new k, v (B, K, T, D) and the layer's pools."""
        k_pool, v_pool = self.k[layer], self.v[layer]  # (blocks, K, D, S), (blocks, K, S, D)
        k_pool[meta.slot_blocks, :, :, meta.slot_offsets] = rows_k
        v_pool[meta.slot_blocks, :, meta.slot_offsets] = rows_v
        return k, v, k_pool, v_pool
