"""The log of a serving run, one ``Iteration`` a step, each a list of ``Forward`` passes of ``Row``s.

Every step of ``inferlab.serving.loop.StepLoop`` is logged in the same shape whatever the
policy: its forward passes, each with its rows (sequence, new tokens, cached tokens, prompt work
or a decode) and its seconds. The simulator's step-time fits, Chapter 4's timelines and Chapter
7's interference measurements read this log and nothing else of the loop's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Row(NamedTuple):
    """One row of a forward pass: a sequence and the tokens it ran."""

    seq_id: int
    new: int        # tokens run through the model this forward
    cached: int     # tokens before them whose K/V the cache already held
    prefill: bool   # prompt work (a whole prompt, a chunk, a recompute); False: one decode


@dataclass(frozen=True)
class Forward:
    """One forward pass as it ran: its rows and how long it took."""

    rows: tuple[Row, ...]
    seconds: float

    @property
    def prefill_share(self) -> float:
        """The share of this forward's tokens that were prompt work (a decode row is one
        token, a prefill row its new tokens): how its time splits between the two phases."""
        prompt = sum(r.new for r in self.rows if r.prefill)
        return prompt / (prompt + sum(not r.prefill for r in self.rows))


@dataclass(frozen=True)
class Iteration:
    """One step of the loop as it ran: its forward passes, in order, and what the step changed.

    Every policy logs the same shape. Without a token budget a step is a forward per prefill
    (one row each, a whole prompt), then one forward for the decode batch; with one, the whole
    step is one forward whose rows are the decodes and the prefill chunks. ``padding_ids`` are
    the step's padding rows (``Step.padding``: finished members a static batch keeps in its
    decode forward, computed and their tokens dropped).
    """

    start_s: float
    forwards: tuple[Forward, ...]
    preempted: tuple[int, ...]
    free_blocks: int                              # after the step's allocations
    padding_ids: tuple[int, ...] = ()

    @property
    def rows(self) -> list[Row]:
        return [row for f in self.forwards for row in f.rows]

    @property
    def prefill_rows(self) -> list[Row]:
        """The rows that did prompt work (whole prompts or chunks)."""
        return [row for row in self.rows if row.prefill]

    @property
    def decode_ids(self) -> tuple[int, ...]:
        """Sequences that decoded a token this step (padding rows not included)."""
        pad = set(self.padding_ids)
        return tuple(r.seq_id for r in self.rows if not r.prefill and r.seq_id not in pad)

    @property
    def decode_batch(self) -> int:
        """Decode rows, padding included."""
        return sum(not r.prefill for r in self.rows)

    @property
    def busy_s(self) -> float:
        return sum(f.seconds for f in self.forwards)

    @property
    def end_s(self) -> float:
        return self.start_s + self.busy_s
