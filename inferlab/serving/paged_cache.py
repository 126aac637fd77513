"""The paged KV cache: fixed-size blocks, block tables, the block manager, and the pool they index.

Kwon et al. (SOSP 2023) store the KV cache the way an operating system stores a process's
memory: in fixed-size blocks (pages) of ``block_size`` tokens that need not be contiguous. Each
sequence has a block table (its page table) mapping its logical block i, tokens
i*block_size .. (i+1)*block_size - 1, to a physical block anywhere in one shared pool. A sequence
takes a new block only when it crosses a block boundary, so at most block_size - 1 slots of its
memory are empty, and it reserves nothing for tokens it has not produced yet.

Read in this order. Where things go (no tensors yet):

- ``blocks_for``: how many blocks hold a number of tokens (ceil division), the one count of it.
- ``BlockAllocator``: the free list and the reference counts. It alone decides which block is
  free; everything else asks it.
- ``BlockTable``: one sequence's list of blocks. ``append`` grows it (allocating only at block
  boundaries), ``slot_mapping`` turns token positions into physical slots, ``fork`` shares every
  block with a child (parallel sampling, beam search) and copy-on-write separates them again;
  ``truncate`` gives back the slots of tokens a speculative step wrote and the target rejected.
- ``BlockManager``: what the scheduler admits through: one allocator, one block size, and the
  admission rule (enough free blocks for a sequence's tokens, leaving a ``watermark`` free).
  ``inferlab.serving.reservation`` has the contiguous managers of the systems before paging,
  with the same interface, and ``inferlab.serving.prefix_cache`` the prefix-caching one.

What holds them: ``PagedKVCache``, every layer's K and V in those blocks, keys
(L, blocks, K, D, block_size) and values (L, blocks, K, block_size, D), so that one block of
one KV head is one contiguous tile, keys transposed as vLLM stores them. How a forward attends
over the blocks is ``inferlab.serving.paged_attention``'s: the engine's runner builds each
forward's metadata over this pool there (``paged_attention.prepare``), and the metadata writes
each layer's new K/V here (``write``) before it attends. ``block_bytes`` says what one block
costs in memory, and ``pool_blocks_for`` how many blocks the engine gives a pool: the one
sizing rule of the offline engine and the server.

Copy-on-write: a forked table shares its parent's blocks. Full blocks never change again, so
sharing them is free. A partly filled last block would be written by both, so a table that
appends into a shared partly filled block takes a fresh block, drops its reference to the shared
one (the last sharer then writes in place) and queues a copy (source, destination) on the
allocator; the pool runs the queued copies before the next forward writes anything (vLLM's
``blocks_to_copy``). Only Lab 3 and Chapter 6 fork, and they drive the pool by hand, with a
padded (B, T) batch: ``bind(tables)`` says which sequence each row of the batch is (and runs the
queued copies), and the model is then called with the pool itself as its cache. Each row's T
new tokens are the last T of its table; at the first layer the pool builds the forward's
metadata itself, packs the batch into one row for attention, unpacks the result, and forgets
the metadata after the last layer. The engine never forks, binds or pads.

Only the scheduler (through ``BlockManager`` and ``BlockTable``) changes which blocks a sequence
owns; the pool and the model only read the tables.
"""

from __future__ import annotations

from collections import deque

import torch

from inferlab.device import free_memory_bytes
from inferlab.model.config import kv_bytes_per_token
from inferlab.serving import paged_attention
from inferlab.serving.interfaces import MemoryManager
from inferlab.validation import positive_ints


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens: ceil(tokens / block_size)."""
    return -(-tokens // block_size)


class OutOfBlocksError(RuntimeError):
    """No free block is left. A scheduler catches this and waits, or preempts a sequence."""


class BlockStateError(ValueError):
    """A block was used in a state that forbids it: freeing or forking a free or unknown block."""


class BlockAllocator:
    """A pool of ``num_blocks`` physical blocks: a free list and a reference count per block.

    A block is free when its count is 0. ``allocate`` hands out a free block with count 1,
    ``fork`` adds an owner, and ``free`` removes one; the block returns to the free list when
    its last owner frees it.
    """

    def __init__(self, num_blocks: int, order: list[int] | None = None):
        """``order``: the free list's first order (default 0, 1, ...): a benchmark passes a
        shuffled one to scatter its sequences' blocks."""
        positive_ints(num_blocks=num_blocks)
        order = list(range(num_blocks)) if order is None else list(order)
        if sorted(order) != list(range(num_blocks)):
            raise ValueError(f"order must list each of the {num_blocks} blocks once")
        self._refcounts = [0] * num_blocks
        self._free: deque[int] = deque(order)  # FIFO: reuse the longest-freed block
        # Copy-on-write copies (source, destination) not yet done; PagedKVCache.bind runs them.
        self.pending_copies: list[tuple[int, int]] = []

    @property
    def num_blocks(self) -> int:
        return len(self._refcounts)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int = 1) -> bool:
        """Whether ``n`` blocks can be allocated now."""
        return n <= len(self._free)

    def allocate(self) -> int:
        """A free block, now owned once (reference count 1)."""
        if not self._free:
            raise OutOfBlocksError(f"all {self.num_blocks} KV blocks are in use; free a "
                                   "sequence (or preempt one) before allocating more")
        block = self._free.popleft()
        self._refcounts[block] = 1
        return block

    def refcount(self, block: int) -> int:
        """How many owners ``block`` has (0: free)."""
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise BlockStateError(f"block {block!r} does not exist: blocks are numbered "
                                  f"0..{self.num_blocks - 1}")
        return self._refcounts[block]

    def _check_owned(self, block: int, action: str) -> None:
        if self.refcount(block) == 0:
            raise BlockStateError(f"cannot {action} block {block}: it is free (a double free, "
                                  "or a block used after its last owner freed it)")

    def fork(self, block: int) -> int:
        """Add an owner to ``block`` (reference count + 1) and return the same block id."""
        self._check_owned(block, "fork")
        self._refcounts[block] += 1
        return block

    def free(self, block: int) -> None:
        """Remove one owner; the block returns to the free list when no owner is left."""
        self._check_owned(block, "free")
        self._refcounts[block] -= 1
        if self._refcounts[block] == 0:
            self._free.append(block)

    def take_copies(self) -> list[tuple[int, int]]:
        """The queued copy-on-write copies, oldest first; the queue is empty afterwards."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def __repr__(self) -> str:
        return f"BlockAllocator({self.num_free}/{self.num_blocks} free)"


class BlockTable:
    """One sequence's block table: physical block ids in logical order, and its token count."""

    def __init__(self, allocator: BlockAllocator, block_size: int = 16):
        positive_ints(block_size=block_size)
        self.allocator = allocator
        self.block_size = block_size
        self.blocks: list[int] = []
        self.num_tokens = 0

    def _needs_copy(self, n_new: int) -> bool:
        """Whether appending would write into a shared, partly filled last block."""
        return (n_new > 0 and self.num_tokens % self.block_size != 0
                and self.allocator.refcount(self.blocks[-1]) > 1)

    def _copy_on_write(self) -> None:
        """Take a private copy of the shared last block (the copy itself is queued on the
        allocator, ``pending_copies``, for whoever owns the pool's tensors to make)."""
        source, copy = self.blocks[-1], self.allocator.allocate()
        self.allocator.pending_copies.append((source, copy))
        self.allocator.free(source)  # still owned by the others, so it is not reused yet
        self.blocks[-1] = copy

    def _fits_in_place(self, n_new: int) -> bool:
        """The common case, decided cheaply: the new tokens fit the last block, owned alone."""
        return (self.num_tokens % self.block_size != 0
                and self.num_tokens + n_new <= len(self.blocks) * self.block_size
                and self.allocator._refcounts[self.blocks[-1]] == 1)  # (a block it holds)

    def blocks_needed(self, n_new: int) -> int:
        """Blocks ``append(n_new)`` would allocate, counting a copy-on-write copy."""
        if n_new < 0:
            raise ValueError(f"n_new must be >= 0, got {n_new}")
        total = blocks_for(self.num_tokens + n_new, self.block_size)
        return total - len(self.blocks) + int(self._needs_copy(n_new))

    def can_append(self, n_new: int) -> bool:
        return self._fits_in_place(n_new) or self.allocator.can_allocate(self.blocks_needed(n_new))

    def append(self, n_new: int) -> None:
        """Make room for ``n_new`` more tokens; raises OutOfBlocksError with nothing changed."""
        if n_new >= 0 and self._fits_in_place(n_new):  # a decode step, most of the time
            self.num_tokens += n_new
            return
        needed = self.blocks_needed(n_new)
        if not self.allocator.can_allocate(needed):
            raise OutOfBlocksError(f"appending {n_new} tokens needs {needed} free blocks but "
                                   f"only {self.allocator.num_free} are free")
        if self._needs_copy(n_new):  # only after a fork: the last block is shared
            self._copy_on_write()
        while len(self.blocks) * self.block_size < self.num_tokens + n_new:
            self.blocks.append(self.allocator.allocate())
        self.num_tokens += n_new

    def slot_mapping(self, positions: torch.Tensor) -> torch.Tensor:
        """Physical slots (block * block_size + offset) of token ``positions`` (any shape)."""
        positions = torch.as_tensor(positions)
        if positions.numel() and (int(positions.min()) < 0 or
                                  int(positions.max()) >= len(self.blocks) * self.block_size):
            raise IndexError(f"positions {int(positions.min())}..{int(positions.max())} are "
                             f"outside the table's {len(self.blocks)} blocks; append first")
        blocks = torch.tensor(self.blocks, dtype=torch.long, device=positions.device)
        return blocks[positions // self.block_size] * self.block_size + positions % self.block_size

    @property
    def slots_held(self) -> int:
        """Token slots this table holds: whole blocks, filled or not."""
        return len(self.blocks) * self.block_size

    def truncate(self, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` tokens; free every block that held only later ones.

        Speculative decoding appends k + 1 slots for a verification and keeps 1..k + 1 of them:
        the rejected tokens' K/V stay in the kept last block, where the next write overwrites
        them, and wholly rejected blocks return to the allocator (one owner fewer, if shared).
        """
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(f"cannot truncate to {num_tokens} tokens: the table holds "
                             f"{self.num_tokens}")
        keep = blocks_for(num_tokens, self.block_size)
        for block in reversed(self.blocks[keep:]):
            self.allocator.free(block)
        del self.blocks[keep:]
        self.num_tokens = num_tokens

    def fork(self) -> "BlockTable":
        """A child table sharing every block (reference counts + 1); writes copy on demand."""
        child = BlockTable(self.allocator, self.block_size)
        child.blocks = [self.allocator.fork(b) for b in self.blocks]
        child.num_tokens = self.num_tokens
        return child

    def free(self) -> None:
        """Release every block this table owns; the table is empty (and reusable) afterwards."""
        for block in reversed(self.blocks):
            self.allocator.free(block)
        self.blocks, self.num_tokens = [], 0

    def __repr__(self) -> str:
        return f"BlockTable(tokens={self.num_tokens}, blocks={self.blocks})"


class BlockManager(MemoryManager):
    """Paged KV memory as the scheduler sees it: ``num_blocks`` blocks of ``block_size`` tokens.

    A sequence is admitted when the blocks for the tokens it brings are free and, after taking
    them, ``watermark`` of the pool still is (vLLM keeps 1% back, so that running sequences have
    blocks to grow into and preemption stays rare). It then grows one block at a time; nothing
    is reserved for tokens it has not produced.
    """

    reserves_ahead = False  # holds only the blocks of the tokens stored so far
    num_cached_only = 0     # no prefix cache here (``PrefixCachingBlockManager`` has one)

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        positive_ints(num_blocks=num_blocks, block_size=block_size)
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark must lie in [0, 1), got {watermark!r}")
        self.allocator = BlockAllocator(num_blocks)
        self.block_size = block_size
        self.watermark_blocks = int(watermark * num_blocks)

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def blocks_for(self, tokens: int) -> int:
        return blocks_for(tokens, self.block_size)

    def can_hold(self, longest: int) -> bool:
        """Whether one sequence of ``longest`` stored tokens fits the pool at all."""
        return self.blocks_for(longest) <= self.num_blocks

    def can_allocate(self, tokens: int, longest: int) -> bool:
        """Whether a sequence bringing ``tokens`` tokens may be admitted now (blocks that only a
        prefix cache holds count as free: it evicts them to make the room)."""
        free = self.num_free + self.num_cached_only
        return free >= self.blocks_for(tokens) + self.watermark_blocks

    def allocate(self, tokens: int, longest: int) -> BlockTable:
        """A new table holding ``tokens`` tokens; OutOfBlocksError, changing nothing, if no room."""
        table = BlockTable(self.allocator, self.block_size)
        table.append(tokens)
        return table

    def allocate_sequence(self, seq) -> tuple[BlockTable, int]:
        """A table for every token of ``seq`` (a ``Sequence``), none of them cached."""
        return self.allocate(seq.num_tokens, seq.max_tokens), 0

    def remember(self, seq) -> None:
        """Nothing to remember without a prefix cache."""

    def make_room(self, n_blocks: int) -> bool:
        """Without a prefix cache nothing can be evicted to make room."""
        return False

    def __repr__(self) -> str:
        return (f"BlockManager({self.num_free}/{self.num_blocks} blocks of {self.block_size} "
                "free)")


# -- the pool: every layer's K and V in those blocks ----------------------------------------------
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
