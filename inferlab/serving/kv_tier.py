"""A second KV tier: prefix blocks evicted from the pool wait in a larger, slower store.

A prefix cache (``inferlab.serving.prefix_cache``) keeps full blocks after their request ends,
and frees the least recently used ones when the pool runs short. Freed, a block's K/V are lost:
the next request with that prefix computes them again. Engines now keep them one level down
instead: vLLM's CPU offloading and LMCache, SGLang's HiCache, Dynamo's KV block manager copy an
evicted block to host memory (or further, to disk or remote storage), and copy it back on a hit,
which is worth it whenever moving a block's bytes is cheaper than recomputing its tokens
(Chapter 3's reload-or-recompute arithmetic).

``KVTier`` is that level for the course engine. It holds up to ``capacity`` blocks, named by the
prefix cache's chained hashes, and forgets the least recently used first. Where a block's
contents live is the tier's backend:

- ``HostTier``: tensors in host memory (pinned when the pool is on a GPU, so the copies are
  DMA transfers over the host link);
- ``FileTier``: one preallocated file (a memory map of ``capacity`` slots), for a pool that is
  itself in host memory (a CPU run), so that the tier is genuinely slower and larger than the
  pool: its reads and writes go through the page cache and the disk.

Every copy is counted: ``hits`` and ``misses`` (blocks looked up below the pool),
``bytes_stored``/``bytes_loaded`` and the seconds spent copying each way, so a run reports what
the tier moved and at what rate (the engine's ``/metrics`` exports them).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import OrderedDict

import numpy as np
import torch


class KVTier:
    """A store of block contents by hash, ``capacity`` blocks, least recently used out first.
    A block's contents are the pool's tensors at that block (``pool.pools``: keys and values,
    and an int8 pool's scales), all layers."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"a KV tier holds at least one block, got capacity={capacity}")
        self.capacity = capacity
        self._slots: OrderedDict[int, int] = OrderedDict()  # hash -> slot, least recent first
        self._free = list(range(capacity - 1, -1, -1))
        self.hits = self.misses = self.stored = self.dropped = 0
        self.bytes_stored = self.bytes_loaded = 0
        self.store_s = self.load_s = 0.0

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, h: int) -> bool:
        return h in self._slots

    def store(self, h: int, pool, block: int) -> None:
        """Copy ``block`` of ``pool`` into the tier under hash ``h`` (a block the pool is about
        to free), making room by forgetting the least recently used block."""
        if h in self._slots:
            self._slots.move_to_end(h)
            return
        if not self._free:
            _, slot = self._slots.popitem(last=False)
            self._free.append(slot)
            self.dropped += 1
        slot = self._free.pop()
        start = time.perf_counter()
        self.bytes_stored += self._write(slot, [t[:, block] for t in pool.pools])
        self.store_s += time.perf_counter() - start
        self._slots[h] = slot
        self.stored += 1

    def load(self, h: int, pool, block: int) -> bool:
        """Copy the contents stored under ``h`` into ``block`` of ``pool``; False (a miss) if
        the tier does not hold it."""
        slot = self._slots.get(h)
        if slot is None:
            self.misses += 1
            return False
        self._slots.move_to_end(h)
        start = time.perf_counter()
        self.bytes_loaded += self._read(slot, [t[:, block] for t in pool.pools])
        self.load_s += time.perf_counter() - start
        self.hits += 1
        return True

    def stats(self) -> dict:
        return {"blocks": len(self), "capacity": self.capacity, "hits": self.hits,
                "misses": self.misses, "stored": self.stored, "dropped": self.dropped,
                "bytes_stored": self.bytes_stored, "bytes_loaded": self.bytes_loaded,
                "store_s": self.store_s, "load_s": self.load_s}

    # what a backend provides: copy one block's tensors into or out of a slot; bytes moved
    def _write(self, slot: int, parts: list[torch.Tensor]) -> int:
        raise NotImplementedError

    def _read(self, slot: int, parts: list[torch.Tensor]) -> int:
        raise NotImplementedError


class HostTier(KVTier):
    """Block contents in host memory, one preallocated tensor per pool tensor (pinned when the
    pool is on a GPU)."""

    def __init__(self, capacity: int, pool):
        super().__init__(capacity)
        pin = pool.pools[0].device.type == "cuda"
        self._store = [torch.empty((capacity, *t[:, 0].shape), dtype=t.dtype, pin_memory=pin)
                       for t in pool.pools]

    def _write(self, slot, parts):
        for dst, src in zip(self._store, parts):
            dst[slot].copy_(src, non_blocking=False)
        return sum(p.numel() * p.element_size() for p in parts)

    def _read(self, slot, parts):
        for src, dst in zip(self._store, parts):
            dst.copy_(src[slot], non_blocking=False)
        return sum(p.numel() * p.element_size() for p in parts)


class FileTier(KVTier):
    """Block contents in one file of ``capacity`` slots, memory-mapped; the file is made in
    ``directory`` (default: the system's temporary directory) and removed with the tier."""

    def __init__(self, capacity: int, pool, directory: str | None = None):
        super().__init__(capacity)
        self._shapes = [(tuple(t[:, 0].shape), t.dtype) for t in pool.pools]
        self._sizes = [t[:, 0].numel() * t.element_size() for t in pool.pools]
        self.slot_bytes = sum(self._sizes)
        fd, self.path = tempfile.mkstemp(prefix="inferlab-kv-tier-", suffix=".bin", dir=directory)
        os.close(fd)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="w+",
                              shape=(capacity, self.slot_bytes))

    def _views(self, slot: int) -> list[torch.Tensor]:
        out, offset = [], 0
        for (shape, dtype), size in zip(self._shapes, self._sizes):
            raw = torch.from_numpy(self._map[slot, offset:offset + size])
            out.append(raw.view(dtype).view(shape))
            offset += size
        return out

    def _write(self, slot, parts):
        for dst, src in zip(self._views(slot), parts):
            dst.copy_(src.cpu())
        return self.slot_bytes

    def _read(self, slot, parts):
        for src, dst in zip(self._views(slot), parts):
            dst.copy_(src)
        return self.slot_bytes

    def close(self) -> None:
        if getattr(self, "_map", None) is not None:
            self._map._mmap.close()
            self._map = None
            os.unlink(self.path)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def tier_for(pool, capacity: int, directory: str | None = None) -> KVTier:
    """The tier below ``pool``: host memory under a GPU pool, a file under a host (CPU) one."""
    if pool.pools[0].device.type == "cuda":
        return HostTier(capacity, pool)
    return FileTier(capacity, pool, directory)
