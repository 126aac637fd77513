"""The three interfaces the serving loop runs through, written down: memory, runner, clock.

Several classes stand behind each, and each of them says which one it implements by
subclassing it:

- ``MemoryManager``: where a sequence's K/V go. The paged ``BlockManager``
  (``inferlab.serving.paged_cache``), its prefix-caching form
  (``inferlab.serving.prefix_cache``) and the contiguous reservations Chapter 3 compares
  (``inferlab.serving.reservation``). The scheduler admits, grows and frees sequences through
  it and asks nothing else.
- ``Runner``: one forward pass over ``Span`` rows (a sequence and the tokens it runs), a token
  per row. The model's ``ModelRunner`` (``inferlab.serving.paged_attention``), the simulator's
  ``SimRunner`` that charges modelled seconds (``inferlab.sim.simulator``), Chapter 3's
  ``MemoryRecorder`` (``inferlab.sim.memory_sim``) and the labs' checking runners.
- ``Clock``: the loop's time. ``WallClock`` measures it, ``VirtualClock`` is advanced by a
  simulated runner (``inferlab.serving.loop``).

They are ``typing.Protocol``s, so a notebook's stand-in that has the methods works without
subclassing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # names for the annotations only
    from inferlab.serving.request import Sequence, Span


class MemoryManager(Protocol):
    """Admits sequences into a pool of ``num_blocks`` blocks and grows them."""

    reserves_ahead: bool  # whether a sequence holds room for tokens it has not produced yet
    num_blocks: int       # the pool's size (token slots, for a contiguous memory)
    num_free: int         # how many of them are free now
    num_cached_only: int  # blocks that a prefix cache alone holds (free for the taking)

    def blocks_for(self, tokens: int) -> int:
        """Blocks that ``tokens`` tokens occupy."""

    def can_hold(self, longest: int) -> bool:
        """Whether a sequence of at most ``longest`` tokens could ever fit the empty pool."""

    def can_allocate(self, tokens: int, longest: int) -> bool:
        """Whether a sequence holding ``tokens`` tokens (at most ``longest``) can be admitted."""

    def allocate_sequence(self, seq: Sequence):
        """``(table, cached)``: a table (``BlockTable``-like: ``num_tokens``, ``can_append``,
        ``blocks_needed``, ``append``, ``free``) with room for ``seq``'s tokens, and how many
        leading ones already hold K/V (0 without a prefix cache)."""

    def remember(self, seq: Sequence) -> None:
        """``seq``'s prompt blocks are written: a prefix cache keeps them for later requests."""

    def make_room(self, n_blocks: int) -> bool:
        """Free ``n_blocks`` blocks without preempting anyone (a prefix cache evicts), if it
        can; whether that many are free now."""


class Runner(Protocol):
    """Runs one forward pass."""

    def forward(self, rows: list[Span]) -> list[int]:
        """A token per row, sampled after the row's last token (kept where ``row.emits``)."""


class Clock(Protocol):
    """The loop's clock, in seconds."""

    def now(self) -> float: ...

    def skip_to(self, t: float) -> None:
        """Nothing can happen before ``t``: move there (never back)."""
