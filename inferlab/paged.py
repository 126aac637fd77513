"""PagedAttention's memory manager and cache: fixed-size blocks, block tables, copy-on-write.

Kwon et al. (SOSP 2023) store the KV cache the way an operating system stores a process's
memory: in fixed-size blocks (pages) of ``block_size`` tokens that need not be contiguous. Each
sequence has a block table (its page table) mapping its logical block i, tokens
i*block_size .. (i+1)*block_size - 1, to a physical block anywhere in one shared pool. A sequence
takes a new block only when it crosses a block boundary, so at most block_size - 1 slots of its
memory are empty, and it reserves nothing for tokens it has not produced yet.

Read in this order:

- ``BlockAllocator``: the free list and the reference counts. It alone decides which block is
  free; everything else asks it.
- ``BlockTable``: one sequence's list of blocks. ``append`` grows it (allocating only at block
  boundaries), ``slot_mapping`` turns token positions into physical slots, ``fork`` shares every
  block with a child (parallel sampling, beam search) and copy-on-write separates them again.
- ``PagedKVCache``: the K/V pool itself, shaped (L, blocks, block_size, K, D). ``bind`` says which
  sequences the next forward runs; ``attend`` (called by ``inferlab.model`` once per layer) writes
  the new K/V through the slot mapping and attends each row over its own blocks.

Copy-on-write: a forked table shares its parent's blocks. Full blocks never change again, so
sharing them is free. A partly filled last block would be written by both, so a table that
appends into a shared partly filled block takes a fresh block, drops its reference to the shared
one (the last sharer then writes in place) and queues a copy (source, destination) on the
allocator. ``PagedKVCache.bind`` runs every queued copy, in order, before the next forward
writes anything, so a source is always copied before any write could reuse it (vLLM's
``blocks_to_copy``). On a GPU, decode attention reads
K/V straight through the block table with a Triton kernel (``inferlab.paged_triton``); elsewhere
``attend`` gathers the blocks into a contiguous tensor and calls
``scaled_dot_product_attention``.

Only the scheduler (through ``BlockTable``) changes which blocks a sequence owns; the cache and
the model only read the tables.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.nn.functional as F

from inferlab.validation import positive_ints


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

    def __init__(self, num_blocks: int):
        positive_ints(num_blocks=num_blocks)
        self._refcounts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))  # FIFO: reuse the longest-freed block
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

    def _check_owned(self, block: int, action: str) -> None:
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise BlockStateError(f"cannot {action} block {block!r}: blocks are numbered "
                                  f"0..{self.num_blocks - 1}")
        if self._refcounts[block] == 0:
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

    def refcount(self, block: int) -> int:
        """How many owners ``block`` has (0: free)."""
        if not 0 <= block < self.num_blocks:
            raise BlockStateError(f"block {block} does not exist (0..{self.num_blocks - 1})")
        return self._refcounts[block]

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

    def blocks_needed(self, n_new: int) -> int:
        """Blocks ``append(n_new)`` would allocate, counting a copy-on-write copy."""
        if n_new < 0:
            raise ValueError(f"n_new must be >= 0, got {n_new}")
        total = -(-(self.num_tokens + n_new) // self.block_size)  # ceil division
        return total - len(self.blocks) + int(self._needs_copy(n_new))

    def can_append(self, n_new: int) -> bool:
        return self.allocator.can_allocate(self.blocks_needed(n_new))

    def append(self, n_new: int) -> None:
        """Make room for ``n_new`` more tokens; raises OutOfBlocksError with nothing changed."""
        needed = self.blocks_needed(n_new)
        if not self.allocator.can_allocate(needed):
            raise OutOfBlocksError(f"appending {n_new} tokens needs {needed} free blocks but "
                                   f"only {self.allocator.num_free} are free")
        if self._needs_copy(n_new):  # copy-on-write: take a private copy of the shared block
            source, copy = self.blocks[-1], self.allocator.allocate()
            self.allocator.pending_copies.append((source, copy))
            self.allocator.free(source)  # still owned by the others, so it is not reused yet
            self.blocks[-1] = copy
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


def gather_index(tables: list[BlockTable], lengths: list[int],
                 device: str | torch.device = "cpu") -> torch.Tensor:
    """Slots (B, N) of tokens 0..lengths[b]-1 of each table; N = max(lengths), padded with 0.

    Padding points at slot 0, which holds some other sequence's K/V: mask those keys out.
    """
    idx = torch.zeros(len(tables), max(lengths), dtype=torch.long, device=device)
    for b, (table, n) in enumerate(zip(tables, lengths)):
        idx[b, :n] = table.slot_mapping(torch.arange(n, device=device))
    return idx


def gather_kv(pool: torch.Tensor, index: torch.Tensor,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """K or V from one layer's pool (num_slots, K, D) at slots ``index`` (B, N): (B, K, N, D).

    ``out`` (rows, K, D) with rows >= B * N is a buffer to gather into. Reusing one matters on a
    CPU: a fresh buffer of tens of MB at every layer costs more in page faults than the copy.
    """
    B, N = index.shape
    flat = index.reshape(-1)
    if out is None:
        rows = pool.index_select(0, flat)
    else:
        rows = torch.index_select(pool, 0, flat, out=out[: flat.numel()])
    return rows.view(B, N, *pool.shape[1:]).transpose(1, 2)  # (B, K, N, D)


class PagedKVCache:
    """The paged K/V pool for every layer: (L, num_blocks, block_size, K, D) for K and for V."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int = 16, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", use_triton: bool | None = None):
        positive_ints("PagedKVCache ", n_layers=n_layers, n_kv_heads=n_kv_heads,
                      head_dim=head_dim, num_blocks=num_blocks, block_size=block_size)
        shape = (n_layers, num_blocks, block_size, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks)
        self.tables: list[BlockTable] = []
        self._plan = None  # per-forward index tensors, shared by every layer
        self._gathered: dict[str, torch.Tensor] = {}  # reused gather buffers, grown on demand
        if use_triton is None:  # the fused kernel where it can run, the gather path elsewhere
            from inferlab import paged_triton
            use_triton = paged_triton.available(self.k.device)
        self.use_triton = use_triton

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int = 16, **kw) -> "PagedKVCache":
        """A pool shaped for ``model`` (an ``inferlab.model.Llama``), in its dtype and device."""
        c = model.config
        return cls(c.n_layers, c.n_kv_heads, c.head_dim, num_blocks, block_size,
                   model.dtype, model.device, **kw)

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

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

    def bind(self, tables: list[BlockTable]) -> None:
        """Say which sequences the next forward runs: row b of the batch is ``tables[b]``.

        Each table must already have room for the new tokens (``table.append``). Queued
        copy-on-write copies are done here, before any layer writes.
        """
        for table in tables:
            if table.allocator is not self.allocator:
                raise ValueError("a table from another allocator was bound to this cache")
        self.copy_pending()
        self.tables = list(tables)
        self._plan = None

    def _make_plan(self, positions: torch.Tensor, T: int):
        B = len(self.tables)
        if positions.dim() == 1:
            positions = positions.expand(B, T)
        if tuple(positions.shape) != (B, T):
            raise ValueError(f"positions have shape {tuple(positions.shape)}, expected {(B, T)} "
                             f"(the batch has {B} bound tables)")
        lengths = [int(p) + 1 for p in positions[:, -1].tolist()]  # causal: keys 0..last
        for b, (table, n) in enumerate(zip(self.tables, lengths)):
            if n > table.num_tokens:
                raise ValueError(f"row {b} writes position {n - 1} but its table holds "
                                 f"{table.num_tokens} tokens; call table.append first")
        slots = torch.stack([t.slot_mapping(p) for t, p in zip(self.tables, positions)])  # (B, T)
        plan = dict(lengths=lengths, slots=slots.reshape(-1))
        if not (self.use_triton and T == 1):  # the gather path: slot index and causal mask
            mask = torch.arange(max(lengths), device=positions.device) <= positions[:, :, None]
            plan.update(mask=mask[:, None],  # (B, 1, T, N)
                        gather=gather_index(self.tables, lengths, self.k.device))
        else:
            width = max(len(t.blocks) for t in self.tables)
            table = torch.zeros(B, width, dtype=torch.int32)
            for b, t in enumerate(self.tables):
                table[b, :len(t.blocks)] = torch.tensor(t.blocks, dtype=torch.int32)
            plan["block_table"] = table.to(self.k.device)
            plan["context_lens"] = torch.tensor(lengths, dtype=torch.int32, device=self.k.device)
        return plan

    def _buffer(self, name: str, rows: int) -> torch.Tensor:
        """A (>= rows, K, D) buffer for gathered K or V, kept between layers and steps."""
        buf = self._gathered.get(name)
        if buf is None or buf.shape[0] < rows:
            buf = torch.empty(rows, *self.k.shape[3:], dtype=self.k.dtype, device=self.k.device)
            self._gathered[name] = buf
        return buf

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """Write k, v (B, K, T, D) at ``positions`` (B, T); attend q (B, H, T, D) causally."""
        B, H, T, D = q.shape
        if len(self.tables) != B:
            raise ValueError(f"the batch has {B} rows but {len(self.tables)} tables are bound; "
                             "call cache.bind(tables) before the forward")
        K = self.k.shape[3]
        if tuple(k.shape) != (B, K, T, D) or tuple(v.shape) != (B, K, T, D):
            raise ValueError(f"k, v have shapes {tuple(k.shape)}, {tuple(v.shape)}; expected "
                             f"{(B, K, T, D)} (batch, KV heads, new tokens, head_dim)")
        if k.dtype != self.k.dtype:
            raise TypeError(f"k is {k.dtype} but the cache holds {self.k.dtype}")
        if self._plan is None or self._plan["source"] is not positions:
            self._plan = self._make_plan(positions, T)
            self._plan["source"] = positions
        plan = self._plan
        k_pool = self.k[layer].view(-1, K, D)  # (num_slots, K, D)
        v_pool = self.v[layer].view(-1, K, D)
        k_pool[plan["slots"]] = k.transpose(1, 2).reshape(B * T, K, D)
        v_pool[plan["slots"]] = v.transpose(1, 2).reshape(B * T, K, D)
        if "block_table" in plan:
            from inferlab.paged_triton import paged_decode_attention
            return paged_decode_attention(q, self.k[layer], self.v[layer], plan["block_table"],
                                          plan["context_lens"])
        k_all = gather_kv(k_pool, plan["gather"], self._buffer("k", plan["gather"].numel()))
        v_all = gather_kv(v_pool, plan["gather"], self._buffer("v", plan["gather"].numel()))
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=plan["mask"],
                                              enable_gqa=H != K)
