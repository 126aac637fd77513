"""Contiguous KV reservations: how serving systems managed the cache before PagedAttention.

Orca and FasterTransformer (as Kwon et al. 2023, Sec. 3 and Fig. 2, describe them) give each
request one contiguous region of the KV pool when it is admitted, sized for the longest it might
become, and keep it until the request finishes. How big that region is depends on what the
system knows in advance:

- ``max_length``: the longest sequence the model allows, for every request (Orca-Max);
- ``power_of_two``: the request's longest length rounded up to a power of two, as if the system
  knew it to within a factor of two (Orca-Pow2);
- ``exact``: exactly its longest length, which needs an oracle (Orca-Oracle).

Paging (``inferlab.serving.paged_cache``) holds whole blocks of the tokens stored so far.
``slots_held`` says how many token slots a request holds under each of the four; it is also
Lab 3's exercise. Regions are placed first fit, so a freed region leaves a hole that a later,
larger request may not fit into (external fragmentation).

``ContiguousManager`` offers the scheduler the interface of ``BlockManager`` (``can_hold``,
``can_allocate``, ``allocate``, ``num_free``), so the engine's one scheduler and loop serve a
trace under any of the schemes (``inferlab.sim.memory_sim``). Its tables are ``Region``s: a
region never grows, because its room was reserved ahead.
"""

from __future__ import annotations

from typing import Callable

from inferlab.serving.paged_cache import OutOfBlocksError, blocks_for
from inferlab.serving.interfaces import MemoryManager
from inferlab.validation import positive_ints

RESERVATIONS = ("max_length", "power_of_two", "exact", "paged")


def slots_held(reservation: str, longest: int, tokens_so_far: int, max_len: int = 2048,
               block_size: int = 16) -> int:
    """KV slots a request holds under ``reservation`` with ``tokens_so_far`` tokens stored.

    ``longest`` is the most tokens the request will store (``request.longest_tokens``), and
    ``1 <= tokens_so_far <= longest <= max_len``. The contiguous schemes reserve at admission;
    paging holds the whole blocks of the tokens stored so far.
    """
    if not 0 < tokens_so_far <= longest <= max_len:
        raise ValueError(f"need 0 < tokens_so_far <= longest <= max_len; got {tokens_so_far}, "
                         f"{longest}, {max_len}")
    if reservation == "max_length":
        return max_len
    if reservation == "power_of_two":
        return min(max_len, 1 << (longest - 1).bit_length())
    if reservation == "exact":
        return longest
    if reservation == "paged":
        return blocks_for(tokens_so_far, block_size) * block_size
    raise ValueError(f"unknown reservation {reservation!r}; choose one of {RESERVATIONS}")


class FirstFit:
    """Contiguous space [0, capacity): sorted free holes, first fit, holes merged on free."""

    def __init__(self, capacity: int):
        positive_ints(capacity=capacity)
        self.capacity = capacity
        self.holes = [(0, capacity)]  # (start, length), sorted by start

    @property
    def num_free(self) -> int:
        return sum(length for _, length in self.holes)

    def can_allocate(self, n: int) -> bool:
        return any(length >= n for _, length in self.holes)

    def allocate(self, n: int) -> int | None:
        """The start of a region of ``n`` slots, or None if no hole is big enough."""
        for i, (start, length) in enumerate(self.holes):
            if length >= n:
                self.holes[i:i + 1] = [(start + n, length - n)] if length > n else []
                return start
        return None

    def free(self, start: int, n: int) -> None:
        self.holes.append((start, n))
        self.holes.sort()
        merged = [self.holes[0]]
        for s, m in self.holes[1:]:
            ps, pm = merged[-1]
            merged[-1:] = [(ps, pm + m)] if ps + pm == s else [(ps, pm), (s, m)]
        self.holes = merged


class Region:
    """One request's contiguous reservation: ``size`` slots from ``start``, ``num_tokens`` used."""

    def __init__(self, space: FirstFit, start: int, size: int):
        self.space, self.start, self.size = space, start, size
        self.num_tokens = 0

    @property
    def slots_held(self) -> int:
        return self.size

    def can_append(self, n_new: int) -> bool:
        return self.num_tokens + n_new <= self.size

    def append(self, n_new: int) -> None:
        if not self.can_append(n_new):
            raise OutOfBlocksError(f"a region of {self.size} slots cannot hold "
                                   f"{self.num_tokens + n_new} tokens: it was reserved too small")
        self.num_tokens += n_new

    def free(self) -> None:
        if self.size:
            self.space.free(self.start, self.size)
        self.size = self.num_tokens = 0

    def __repr__(self) -> str:
        return f"Region(start={self.start}, size={self.size}, tokens={self.num_tokens})"


class ContiguousManager(MemoryManager):
    """A pool of ``capacity`` token slots handing out one region per request, first fit.

    ``reservation`` is "max_length", "power_of_two" or "exact"; ``slots_fn`` (default
    ``slots_held``) says how many slots it reserves for a request's longest length.
    """

    reserves_ahead = True  # a region holds room for tokens not produced yet
    block_size = 1         # it hands out slots, not blocks
    num_cached_only = 0    # no prefix cache

    def __init__(self, capacity: int, reservation: str, max_len: int = 2048,
                 slots_fn: Callable[..., int] = slots_held):
        if reservation not in RESERVATIONS or reservation == "paged":
            raise ValueError(f"a contiguous reservation is one of {RESERVATIONS[:3]}, "
                             f"got {reservation!r}")
        self.space = FirstFit(capacity)
        self.reservation, self.max_len, self.slots_fn = reservation, max_len, slots_fn

    @property
    def num_blocks(self) -> int:
        return self.space.capacity

    @property
    def num_free(self) -> int:
        return self.space.num_free

    def blocks_for(self, tokens: int) -> int:
        return blocks_for(tokens, self.block_size)  # slots: blocks of one token

    def region_size(self, longest: int) -> int:
        return self.slots_fn(self.reservation, longest, longest, self.max_len, 1)

    def can_hold(self, longest: int) -> bool:
        return longest <= self.max_len and self.region_size(longest) <= self.space.capacity

    def can_allocate(self, tokens: int, longest: int) -> bool:
        return self.space.can_allocate(self.region_size(longest))

    def allocate(self, tokens: int, longest: int) -> Region:
        size = self.region_size(longest)
        if size < tokens:
            raise ValueError(f"a {self.reservation} reservation of {size} slots cannot hold the "
                             f"{tokens} tokens the request brings")
        start = self.space.allocate(size)
        if start is None:
            raise OutOfBlocksError(f"no free region of {size} slots (largest hole: "
                                   f"{max((n for _, n in self.space.holes), default=0)})")
        region = Region(self.space, start, size)
        region.append(tokens)
        return region

    def allocate_sequence(self, seq) -> tuple[Region, int]:
        """A region for ``seq`` (a ``Sequence``) at its longest, its tokens so far in it."""
        return self.allocate(seq.num_tokens, seq.max_tokens), 0

    def remember(self, seq) -> None:
        """No prefix cache: nothing to remember."""

    def make_room(self, n_blocks: int) -> bool:
        """A region never grows: there is no room to make."""
        return False

    def __repr__(self) -> str:
        return (f"ContiguousManager({self.reservation}, {self.num_free}/{self.num_blocks} "
                "slots free)")
