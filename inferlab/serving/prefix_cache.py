"""Prefix caching: requests that start with the same tokens share the KV blocks of that start.

Many requests begin with the same system prompt or few-shot examples. Their K/V for those
tokens are identical, so a server can compute them once and let every later request's block
table point at the same physical blocks (Kwon et al. 2023, Sec. 4.4, "shared prefix"; vLLM's
automatic prefix caching and nano-vllm do it by hashing).

Only FULL blocks are cached: a full block never changes, and its contents are named by a hash
of its tokens chained with the hash of the block before it, so block i of two prompts matches
only if tokens 0 .. (i+1) * block_size - 1 are all equal (the K/V of a token depend on every
token before it). The cache holds one reference to each block it remembers, so the block
survives its request; when the pool runs low, ``evict`` frees the least recently used blocks
that nobody else holds. With a second tier (``inferlab.serving.kv_tier``) an evicted block is
first copied down to it, and a prompt whose chain leaves the pool continues in the tier: each
block found there is copied back into the pool instead of being computed again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from inferlab.serving.paged_cache import BlockAllocator, BlockManager, BlockTable


def block_hashes(tokens, block_size: int, salt: str | None = None) -> list[int]:
    """Chained hashes of the full blocks of ``tokens``: hash i covers tokens 0..(i+1)*size-1.

    A ``salt`` starts the chain from a value of its own, so that the same tokens under two
    salts never match (vLLM's ``cache_salt``: one namespace per tenant).
    """
    hashes, parent = [], None if salt is None else hash(("salt", salt))
    for i in range(len(tokens) // block_size):
        parent = hash((parent, tuple(tokens[i * block_size:(i + 1) * block_size])))
        hashes.append(parent)
    return hashes


class PrefixCache:
    """A map from chained block hash to physical block, over one allocator."""

    def __init__(self, allocator: BlockAllocator, block_size: int = 16,
                 hash_fn: Callable[..., list] | None = None):
        self.allocator = allocator
        self.block_size = block_size
        self.hash_fn = hash_fn or block_hashes  # hash_fn(tokens, block_size) -> one per full block
        self._blocks: OrderedDict[int, int] = OrderedDict()  # hash -> block, least recent first
        self.lookups = self.hits = 0  # full blocks looked up, and found
        # a second tier (``inferlab.serving.kv_tier``) and the pool whose blocks it copies:
        # evicted blocks go down to it, and a prompt's chain continues there after a pool miss
        self.tier, self.pool = None, None

    def __len__(self) -> int:
        return len(self._blocks)

    def _hashes(self, tokens, salt):
        if salt is None:
            return self.hash_fn(tokens, self.block_size)
        return self.hash_fn(tokens, self.block_size, salt)

    def allocate_prompt(self, tokens, salt: str | None = None) -> tuple[BlockTable, int]:
        """A block table for the prompt ``tokens``, reusing cached blocks of its prefix.

        Returns the table (room for every prompt token) and how many leading tokens are already
        cached, i.e. need no prefill. The last prompt token is always computed (its logits give
        the first output token), so a fully cached prompt still prefills one token.
        """
        table = BlockTable(self.allocator, self.block_size)
        hashes = self._hashes(tokens[:len(tokens) - 1], salt)
        self.lookups += len(hashes)  # every full block counts; those after a miss miss too
        for h in hashes:
            block = self._blocks.get(h)
            if block is None:  # not in the pool: in the tier below it, or nowhere
                if self.tier is None or not self._reload(table, h):
                    break  # the chain is broken: no later block can match either
                continue
            self.hits += 1
            self._blocks.move_to_end(h)
            table.blocks.append(self.allocator.fork(block))
            table.num_tokens += self.block_size
        cached = table.num_tokens
        rest = len(tokens) - cached
        if not table.can_append(rest):
            self.evict(table.blocks_needed(rest) - self.allocator.num_free)
        try:
            table.append(rest)
        except Exception:  # OutOfBlocksError: give the forked prefix blocks back first
            table.free()
            raise
        return table, cached

    def _reload(self, table: BlockTable, h: int) -> bool:
        """Continue ``table``'s cached chain with block ``h`` from the tier: copied into a fresh
        block of the pool and cached again. False if the tier does not hold it (a miss) or the
        pool has no room for it (the rest is then computed)."""
        if h not in self.tier:
            self.tier.misses += 1
            return False
        if not table.can_append(self.block_size) and not self.evict(1):
            return False
        table.append(self.block_size)
        self.tier.load(h, self.pool, table.blocks[-1])
        self._blocks[h] = self.allocator.fork(table.blocks[-1])
        return True

    def insert(self, table: BlockTable, tokens, salt: str | None = None) -> None:
        """Remember the full blocks of ``table`` (holding ``tokens``) once their K/V are written."""
        for h, block in zip(self._hashes(tokens, salt), table.blocks):
            if h not in self._blocks:
                self._blocks[h] = self.allocator.fork(block)  # the cache's own reference

    def evict(self, n: int) -> int:
        """Free up to ``n`` cached blocks no request holds, least recently used first."""
        freed = 0
        for h in list(self._blocks):
            if freed >= n:
                break
            if self.allocator.refcount(self._blocks[h]) == 1:  # only the cache holds it
                block = self._blocks.pop(h)
                if self.tier is not None:  # down a tier rather than lost
                    self.tier.store(h, self.pool, block)
                self.allocator.free(block)
                freed += 1
        return freed

    @property
    def num_evictable(self) -> int:
        """Cached blocks that only the cache holds: free for the taking."""
        return sum(self.allocator.refcount(b) == 1 for b in self._blocks.values())

    @property
    def hit_rate(self) -> float:
        """Full prompt blocks found in the cache over all full prompt blocks asked for."""
        return self.hits / self.lookups if self.lookups else 0.0


class PrefixCachingBlockManager(BlockManager):
    """A ``BlockManager`` whose admissions reuse cached prefix blocks (the engine's memory when
    prefix caching is on; it needs chunked prefill, which can start a prompt mid-way).

    The scheduler admits a sequence with ``allocate_sequence`` (its table, and how many leading
    tokens are cached already: the sequence's ``num_computed`` starts there), calls
    ``remember`` once a prefill has written its blocks, and ``make_room`` before it would
    preempt for want of a block: blocks only the cache holds count as free.
    """

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        super().__init__(num_blocks, block_size, watermark)
        self.cache = PrefixCache(self.allocator, block_size)

    @property
    def num_cached_only(self) -> int:
        return self.cache.num_evictable

    def allocate_sequence(self, seq) -> tuple[BlockTable, int]:
        return self.cache.allocate_prompt(seq.tokens, seq.request.cache_salt)

    def remember(self, seq) -> None:
        self.cache.insert(seq.table, seq.tokens[:seq.num_computed], seq.request.cache_salt)

    def make_room(self, n_blocks: int) -> bool:
        """Evict cached blocks until ``n_blocks`` are free, if that many can be."""
        short = n_blocks - self.allocator.num_free
        if short > 0:
            self.cache.evict(short)
        return self.allocator.num_free >= n_blocks
