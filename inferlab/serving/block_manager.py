"""PagedAttention's memory manager: fixed-size blocks, block tables, copy-on-write.

Kwon et al. (SOSP 2023) store the KV cache the way an operating system stores a process's
memory: in fixed-size blocks (pages) of ``block_size`` tokens that need not be contiguous. Each
sequence has a block table (its page table) mapping its logical block i, tokens
i*block_size .. (i+1)*block_size - 1, to a physical block anywhere in one shared pool. A sequence
takes a new block only when it crosses a block boundary, so at most block_size - 1 slots of its
memory are empty, and it reserves nothing for tokens it has not produced yet.

Read in this order:

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
  with the same interface.

Copy-on-write: a forked table shares its parent's blocks. Full blocks never change again, so
sharing them is free. A partly filled last block would be written by both, so a table that
appends into a shared partly filled block takes a fresh block, drops its reference to the shared
one (the last sharer then writes in place) and queues a copy (source, destination) on the
allocator; the cache (``inferlab.serving.paged_cache``) runs the queued copies before the next
forward writes anything (vLLM's ``blocks_to_copy``).

Only the scheduler (through ``BlockManager`` and ``BlockTable``) changes which blocks a sequence
owns; the cache and the model only read the tables. The K/V tensors themselves live in
``inferlab.serving.paged_cache``.
"""

from __future__ import annotations

from collections import deque

import torch

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
