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
that nobody else holds.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from inferlab.serving.block_manager import BlockAllocator, BlockTable


def block_hashes(tokens, block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``tokens``: hash i covers tokens 0..(i+1)*size-1."""
    hashes, parent = [], None
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

    def __len__(self) -> int:
        return len(self._blocks)

    def allocate_prompt(self, tokens) -> tuple[BlockTable, int]:
        """A block table for the prompt ``tokens``, reusing cached blocks of its prefix.

        Returns the table (room for every prompt token) and how many leading tokens are already
        cached, i.e. need no prefill. The last prompt token is always computed (its logits give
        the first output token), so a fully cached prompt still prefills one token.
        """
        table = BlockTable(self.allocator, self.block_size)
        hashes = self.hash_fn(tokens[:len(tokens) - 1], self.block_size)
        self.lookups += len(hashes)  # every full block counts; those after a miss miss too
        for h in hashes:
            block = self._blocks.get(h)
            if block is None:
                break  # the chain is broken: no later block can match either
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

    def insert(self, table: BlockTable, tokens) -> None:
        """Remember the full blocks of ``table`` (holding ``tokens``) once their K/V are written."""
        for h, block in zip(self.hash_fn(tokens, self.block_size), table.blocks):
            if h not in self._blocks:
                self._blocks[h] = self.allocator.fork(block)  # the cache's own reference

    def evict(self, n: int) -> int:
        """Free up to ``n`` cached blocks no request holds, least recently used first."""
        freed = 0
        for h in list(self._blocks):
            if freed >= n:
                break
            if self.allocator.refcount(self._blocks[h]) == 1:  # only the cache holds it
                self.allocator.free(self._blocks.pop(h))
                freed += 1
        return freed

    @property
    def hit_rate(self) -> float:
        """Full prompt blocks found in the cache over all full prompt blocks asked for."""
        return self.hits / self.lookups if self.lookups else 0.0


def prefix_sharing_experiment(prompt_lens, system_len: int, n_system_prompts: int = 1,
                              num_blocks: int = 4096, block_size: int = 16, seed: int = 0,
                              vocab: int = 32000, hash_fn=None) -> dict:
    """Serve prompts that each start with one of ``n_system_prompts`` shared system prompts.

    Each request's prompt is a system prompt of ``system_len`` tokens followed by its own
    ``prompt_len`` random tokens. Requests run one after another and free their tables; the
    prefix cache keeps the full blocks. Returns the block hit rate and the share of prompt
    tokens that needed no prefill.
    """
    import random

    rng = random.Random(seed)
    systems = [[rng.randrange(vocab) for _ in range(system_len)] for _ in range(n_system_prompts)]
    alloc = BlockAllocator(num_blocks)
    cache = PrefixCache(alloc, block_size, hash_fn)
    total = saved = 0
    for n in prompt_lens:
        tokens = rng.choice(systems) + [rng.randrange(vocab) for _ in range(n)]
        table, cached = cache.allocate_prompt(tokens)
        cache.insert(table, tokens)  # after the prefill has written the new blocks' K/V
        total, saved = total + len(tokens), saved + cached
        table.free()
    return dict(hit_rate=cache.hit_rate, prefill_saved=saved / total, requests=len(prompt_lens),
                cached_blocks=len(cache))
