"""The paged K/V pool: every layer's K and V in fixed-size blocks, and where new K/V go.

The pool holds keys (L, blocks, K, D, block_size) and values (L, blocks, K, block_size, D), so
one block of one KV head is one contiguous tile, keys transposed as vLLM stores them. Which
block belongs to which sequence is the block manager's business
(``inferlab.serving.block_manager``); how a forward attends over the blocks is
``inferlab.serving.paged_attention``'s. The engine's runner builds each forward's metadata
over this pool there (``paged_attention.prepare``), and the metadata writes each layer's new
K/V here (``write``) before it attends.

Lab 3 and Chapter 6 drive the pool by hand instead, with a padded (B, T) batch: ``bind(tables)``
says which sequence each row of the batch is (and runs the copies that copy-on-write queued,
since those callers fork tables), and the model is then called with the pool itself as its
cache. Each row's T new tokens are the last T of its table; at the first layer the pool builds
the forward's metadata itself, packs the batch into one row for attention, unpacks the
result, and forgets the metadata after the last layer. The engine never forks, binds or pads.

``block_bytes`` says what one block costs in memory, and ``pool_blocks_for`` how many blocks
the engine gives a pool: the one sizing rule of the offline engine and the server.
"""

from __future__ import annotations

import torch

from inferlab.device import free_memory_bytes
from inferlab.model.config import kv_bytes_per_token
from inferlab.serving import paged_attention
from inferlab.serving.block_manager import BlockManager, BlockTable, blocks_for
from inferlab.validation import positive_ints

# Share of the device's free memory that the engine may give the KV pool when it sizes it.
POOL_MEMORY_FRACTION = 0.8


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
    per_token = kv_bytes_per_token(c, dtype.itemsize)
    if dtype == torch.int8:     # K's and V's float32 scale, per layer and KV head
        per_token += 2 * c.n_layers * c.n_kv_heads * 4
    return block_size * per_token


def pool_blocks_for(model, longest: int, config,
                    memory_fraction: float = POOL_MEMORY_FRACTION) -> int:
    """The engine's one sizing rule: ``config.max_batch`` sequences of ``longest`` tokens, at
    most what ``memory_fraction`` of the device's free memory holds. A server that cannot know
    its requests passes the model's context length."""
    wanted = config.max_batch * blocks_for(longest, config.block_size)
    affordable = int(free_memory_bytes(model.device) * memory_fraction) // \
        block_bytes(model, config.block_size, config)
    return max(1, min(wanted, affordable))


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
        self.block_size = S
        self.buffers: dict[str, torch.Tensor] = {}  # reused gather buffers (prefill with context)
        self.tables: list[BlockTable] = []  # a padded batch's rows (``bind``)
        self._padded: paged_attention.RaggedMetadata | None = None  # its metadata, per forward
        if use_triton is None:  # the fused kernel on a GPU that can run it, the gather elsewhere
            from inferlab.serving import paged_triton
            use_triton = self.k.device.type == "cuda" and paged_triton.available(self.k.device)
        self.use_triton = use_triton
        # decode rows sharing leading blocks attend to them once (ServingConfig's
        # shared_prefix_attention); how many decode rows and prefix tokens went that way
        self.shared_prefix = False
        self.shared_prefix_rows = self.shared_prefix_tokens = 0

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
        pool = cls(c.n_layers, c.n_kv_heads, c.head_dim, memory, model.dtype, model.device,
                   use_triton, c.n_heads)
        pool.shared_prefix = config.shared_prefix_attention
        return pool

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

    def write(self, layer: int, meta, k: torch.Tensor, v: torch.Tensor):
        """Store the new tokens' k, v (1, K, N, D) at their slots (``meta``, a
        ``RaggedMetadata``); return what attention reads: k, v as stored and the layer's pools."""
        if k.dtype != self.compute_dtype:
            raise ValueError(f"k is {k.dtype} but this pool computes in {self.compute_dtype}")
        k_pool, v_pool = self.k[layer], self.v[layer]  # (blocks, K, D, S), (blocks, K, S, D)
        k_pool[meta.slot_blocks, :, :, meta.slot_offsets] = k[0].transpose(0, 1)  # (N, K, D)
        v_pool[meta.slot_blocks, :, meta.slot_offsets] = v[0].transpose(0, 1)
        return k, v, k_pool, v_pool

    # -- a padded batch driven by hand (Lab 3, Chapter 6), not the engine --------------------
    def copy_pending(self) -> None:
        """Run the allocator's queued copy-on-write copies (all layers), oldest first."""
        for source, dest in self.allocator.take_copies():
            for t in self.pools:
                t[:, dest] = t[:, source]

    def bind(self, tables: list[BlockTable]) -> None:
        """Say which sequences the next padded forward runs: row b of the batch is
        ``tables[b]``, each with room for its new tokens already (``table.append``). Queued
        copy-on-write copies are done here, before any layer writes."""
        for table in tables:
            if table.allocator is not self.allocator:
                raise ValueError("a table from another allocator was bound to this cache")
        self.copy_pending()
        self.tables, self._padded = list(tables), None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """The model's call for a padded batch q (B, H, T, D), k, v (B, K, T, D) over the bound
        tables: row b's T new tokens are the last T of table b. Packed into one row, written,
        attended (``paged_attention``) and unpacked: (B, H, T, D)."""
        B, H, T, D = q.shape
        if layer == 0 or self._padded is None:  # a new forward: its metadata, once
            if len(self.tables) != B:
                raise ValueError(f"the batch has {B} rows but {len(self.tables)} tables are "
                                 "bound; call cache.bind(tables) before the forward")
            starts = [t.num_tokens - T for t in self.tables]
            if min(starts) < 0:
                raise ValueError(f"a row runs {T} new tokens but its table holds fewer; call "
                                 "table.append first")
            _, pos, self._padded = paged_attention.prepare(self.tables, [[0] * T] * B, starts,
                                                           self)
            given = positions.expand(B, T) if positions.dim() == 1 else positions
            if given.device.type == "cpu" and not torch.equal(given.to(pos.device),
                                                              pos.view(B, T)):
                raise ValueError("the positions passed to the model are not the last tokens of "
                                 "the bound tables: append to each table first, then run its "
                                 "newest tokens")
        meta = self._padded
        if layer == self.k.shape[0] - 1:
            self._padded = None
        packed = [x.transpose(0, 1).reshape(1, x.shape[1], -1, D) for x in (q, k, v)]
        out = meta.attend(layer, *packed)  # (B, h, T, D) -> (1, h, B*T, D) and back
        return out[0].view(H, B, T, D).transpose(0, 1)
