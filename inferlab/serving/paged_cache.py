"""The paged K/V pool: where each forward's new K/V go, and what each row attends over.

The pool holds every layer's K and V in fixed-size blocks: keys (L, blocks, K, D, block_size)
and values (L, blocks, K, block_size, D), so one block of one KV head is one contiguous tile,
keys transposed as vLLM stores them. Decode attention reads the tiles where they lie: on a CPU
with two ``embedding_bag`` sums (``inferlab.serving.paged_attention.paged_decode``), on a GPU
with the fused Triton kernel (``inferlab.serving.paged_triton``); a prefill over cached tokens
gathers them into the (B, K, N, D) layout SDPA reads. Which block belongs to which sequence is
the block manager's business (``inferlab.serving.block_manager``).

Once per forward, not once per layer, the model runner turns the rows' block tables into the
forward's metadata (``prepare``: ``inferlab.serving.ragged.RaggedMetadata``, nano-vllm's
``prepare_prefill`` / ``prepare_decode`` in one): the rows' new tokens packed end to end in one
row (1, N), where each one's K/V go (block and offset), and what each row attends over. It is
built from Python lists and reaches the device in ONE copy, so a step costs no host-device
round trip per sequence, and ``attend`` (called by the model at every layer) only writes and
reads.

``bind(tables, metadata)`` says which sequences the next forward runs (and runs the queued
copy-on-write copies first). Lab 3's hand-written loops bind the tables alone and run a padded
(B, T) batch, each row's T new tokens the last T of its table: the cache then prepares the same
metadata at the first layer, packs the batch into one row for attention and unpacks the
result, and forgets the metadata after the last layer.
"""

from __future__ import annotations

import torch

from inferlab.analysis import formulas
from inferlab.serving import ragged
from inferlab.serving.block_manager import BlockManager, BlockTable
from inferlab.validation import positive_ints


def cache_dtype(model, config=None) -> torch.dtype:
    """The dtype ``PagedKVCache.for_model`` stores K and V in: int8 when ``config`` (a
    ``ServingConfig``) asks for ``kv_cache_dtype="int8"``, else the model's compute dtype (its
    embedding table's), also when its linear layers hold int8 weights."""
    if config is not None and config.kv_cache_dtype == "int8":
        return torch.int8
    return model.dtype


def block_bytes(model, block_size: int, config=None) -> int:
    """Bytes one block of ``model``'s pool takes: K and V, every layer and KV head,
    ``block_size`` tokens of ``head_dim`` numbers in the dtype the cache stores
    (``cache_dtype``: ``config.kv_cache_dtype``, else the model's compute dtype; never a
    weight's: an int8-quantized model still computes, and caches K/V, in floats), int8 with a
    float32 scale per token and head (``inferlab.serving.paged_int8``)."""
    c, dtype = model.config, cache_dtype(model, config)
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
        self.pools = (self.k, self.v)  # every tensor that holds a block's contents
        self.compute_dtype = dtype  # the dtype attention reads K and V in
        self.group = n_heads // n_kv_heads
        self.memory = memory
        self.block_size = memory.block_size
        self.tables: list[BlockTable] = []
        self.metadata: ragged.RaggedMetadata | None = None
        self._padded: tuple[int, int] | None = None  # (B, T) of a padded batch bound alone
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
    def nbytes(self) -> int:
        """Bytes the pools occupy."""
        return sum(t.numel() * t.element_size() for t in self.pools)

    def new_table(self) -> BlockTable:
        """An empty block table drawing on this cache's allocator."""
        return BlockTable(self.allocator, self.block_size)

    def copy_pending(self) -> None:
        """Run the allocator's queued copy-on-write copies (all layers), oldest first."""
        for source, dest in self.allocator.take_copies():
            for t in self.pools:
                t[:, dest] = t[:, source]

    def prepare(self, tables: list[BlockTable], tokens: list[list[int]], starts: list[int]):
        """``ragged.prepare`` for this pool: input ids and positions (1, N) and the metadata of
        one forward whose row b runs ``tokens[b]`` from position ``starts[b]`` of ``tables[b]``."""
        return ragged.prepare(tables, tokens, starts, self.block_size, self.k.shape[2],
                              self.k.shape[3], self.k.device, self.use_triton, self.group)

    def bind(self, tables: list[BlockTable],
             metadata: ragged.RaggedMetadata | None = None) -> None:
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
        self.tables, self.metadata, self._padded = list(tables), metadata, None

    def _prepare_padded(self, q: torch.Tensor, positions: torch.Tensor) -> None:
        """Lab 3's padded batch (B, T): row b's T new tokens are the last T of table b."""
        B, T = q.shape[0], q.shape[2]
        if len(self.tables) != B:
            raise ValueError(f"the batch has {B} rows but {len(self.tables)} tables are bound; "
                             "call cache.bind(tables) before the forward")
        starts = [t.num_tokens - T for t in self.tables]
        if min(starts) < 0:
            raise ValueError(f"a row runs {T} new tokens but its table holds fewer; call "
                             "table.append first")
        _, pos, self.metadata = self.prepare(self.tables, [[0] * T] * B, starts)
        given = positions.expand(B, T) if positions.dim() == 1 else positions
        if given.device.type == "cpu" and not torch.equal(given.to(pos.device), pos.view(B, T)):
            raise ValueError("the positions passed to the model are not the last tokens of the "
                             "bound tables: append to each table first, then run its newest "
                             "tokens")
        self._padded = (B, T)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """Write k, v (1, K, N, D) into the pool; attend q (1, H, N, D) causally, row by row of
        the bound metadata. A padded batch (B, K, T, D), bound without metadata, is packed
        into one row here and unpacked after."""
        if self.metadata is None:  # Lab 3's padded batch: prepare at layer 0, for this forward
            self._prepare_padded(q, positions)
        meta, padded = self.metadata, self._padded
        if padded is not None:
            if layer == self.k.shape[0] - 1:
                self.metadata = self._padded = None
            q, k, v = (x.transpose(0, 1).reshape(1, x.shape[1], -1, x.shape[3])
                       for x in (q, k, v))  # (B, h, T, D) -> (1, h, B*T, D)
        H, N, D = q.shape[1:]
        K = self.k.shape[2]
        if k.shape != (1, K, N, D) or N != sum(meta.query_lens) or k.dtype != self.compute_dtype:
            raise ValueError(f"k is {tuple(k.shape)} {k.dtype}; a forward of these rows takes "
                             f"{(1, K, sum(meta.query_lens), D)} {self.compute_dtype}")
        rows_k = k[0].transpose(0, 1)  # (N, K, D), in slot order
        rows_v = v[0].transpose(0, 1)
        k, v, k_pool, v_pool = self._store(layer, meta, k, v, rows_k, rows_v)
        out = ragged.attend(meta, q, k, v, k_pool, v_pool, self._buffers)  # (1, H, N, D)
        if padded is not None:
            B, T = padded
            out = out[0].view(H, B, T, D).transpose(0, 1)  # (B, H, T, D)
        return out

    def _store(self, layer, meta, k, v, rows_k, rows_v):
        """Write the new tokens' K and V (``rows_*``: (rows, K, D)) at their slots; return what
        attention reads: the new k, v (B, K, T, D) and the layer's pools."""
        k_pool, v_pool = self.k[layer], self.v[layer]  # (blocks, K, D, S), (blocks, K, S, D)
        k_pool[meta.slot_blocks, :, :, meta.slot_offsets] = rows_k
        v_pool[meta.slot_blocks, :, meta.slot_offsets] = rows_v
        return k, v, k_pool, v_pool
