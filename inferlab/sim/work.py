"""What a simulated instance computed and moved: the counts that hold a simulation to its
mechanism.

A simulated figure is only as trustworthy as the work behind it, so every simulated instance
counts what its runner actually ran and was charged for, row by row, and what crossed its link.
The mechanism says what the counts must be. A request of ``P`` prompt tokens that produces
``O`` tokens stores the K/V of ``longest_tokens(P, O) = P + O - 1`` tokens
(``inferlab.serving.request``), so across a whole cluster its forwards compute each of those
tokens once: the prompt once (on whichever instance prefilled it) and one decode row per output
token fed back. Anything beyond that is a *recompute*, and only two things may force one:

- a preemption, which frees a running sequence's K/V (``Scheduler.preempt``): every token it
  held is computed again when the sequence is readmitted;
- a failed instance, which loses the K/V of every sequence on it, minus what survived elsewhere
  (the prompt's cache kept on the prefill side, for a retransfer).

``Ledger`` keeps, for each request, how many of its leading tokens hold K/V somewhere in the
cluster (its high-water mark), and ``Work.record`` sorts each row's tokens against it: tokens
below the mark are recomputed, tokens above it are computed for the first time, and a row that
starts beyond the mark would read K/V that nobody computed (``skipped``: a bug, never counted
as work). The counts are the runner's, never a number added beside the mechanism, and the
property tests (``tests/test_conservation.py``) hold them to the rules above:

    first-time tokens, summed over instances = sum over requests of (P + O - 1)
    recomputed tokens, summed over instances = preemptions' dropped K/V + a failure's lost K/V
                                               - what the failure's resume brought back
    bytes moved = KV bytes per token x tokens moved

(STYLE.md 18: a simulation earns trust by counting.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferlab.serving.config import ServingConfig
from inferlab.serving.interfaces import MemoryManager
from inferlab.serving.request import Sequence, Span
from inferlab.serving.scheduler import Scheduler


class Ledger:
    """Per request (a sequence id), how many leading tokens hold K/V somewhere in the cluster:
    the high-water mark of what its forwards computed. One ledger serves every instance of a
    cluster; K/V that a transfer brings were computed where they came from, so a transfer
    never moves the mark."""

    def __init__(self) -> None:
        self.high: dict[int, int] = {}


@dataclass
class Work:
    """One instance's counts: what its runner computed, what its scheduler dropped, what moved.

    ``prompt_tokens`` are the tokens of prompt-work rows (whole prompts, chunks, and the
    recomputation of a preempted or resumed sequence); ``decode_rows`` the one-token decode
    rows; ``recomputed_tokens`` how many of either had been computed before, anywhere in the
    cluster. ``dropped_tokens`` are the K/V its preemptions freed (each computed again when the
    victim returns).
    """

    name: str = ""
    forwards: int = 0
    busy_s: float = 0.0         # seconds its forwards were charged (its GPU's busy time)
    prompt_tokens: int = 0
    decode_rows: int = 0
    padding_rows: int = 0       # a static batch's finished members, computed and dropped
    recomputed_tokens: int = 0
    skipped_tokens: int = 0     # rows started past the computed tokens: K/V never computed (0)
    preemptions: int = 0
    dropped_tokens: int = 0
    transfers_out: int = 0
    tokens_out: int = 0
    bytes_out: float = 0.0
    transfers_in: int = 0
    tokens_in: int = 0
    bytes_in: float = 0.0
    ledger: Ledger = field(default_factory=Ledger, repr=False, compare=False)

    @property
    def computed_tokens(self) -> int:
        """Every token this instance's forwards ran, padding rows excluded."""
        return self.prompt_tokens + self.decode_rows

    @property
    def first_time_tokens(self) -> int:
        """Tokens whose K/V this instance computed before anyone else did."""
        return self.computed_tokens - self.recomputed_tokens

    def record(self, rows: list[Span], seconds: float = 0.0) -> None:
        """Count one forward pass over ``rows`` (the scheduler's ``Span`` rows: a sequence, its
        new tokens, where they start, prompt work or a decode), as the runner runs it, charged
        ``seconds``."""
        self.forwards += 1
        self.busy_s += seconds
        high = self.ledger.high
        for row in rows:
            seq, n, start = row.seq, row.new, row.start
            if seq.is_done:  # a padding row: a finished member of a static batch
                self.padding_rows += 1
                continue
            have = high.get(seq.seq_id, 0)
            self.recomputed_tokens += min(n, max(0, have - start))
            self.skipped_tokens += max(0, start - have)
            high[seq.seq_id] = max(have, start + n)
            if row.prefill:
                self.prompt_tokens += n
            else:
                self.decode_rows += 1

    def send(self, to: "Work", tokens: int, nbytes: float) -> None:
        """``tokens`` tokens' K/V (``nbytes`` bytes) leave this instance for ``to``."""
        self.transfers_out, self.tokens_out = self.transfers_out + 1, self.tokens_out + tokens
        self.bytes_out += nbytes
        to.transfers_in, to.tokens_in = to.transfers_in + 1, to.tokens_in + tokens
        to.bytes_in += nbytes

    def as_dict(self) -> dict:
        """The counts (for a stored record)."""
        keys = ("name", "forwards", "busy_s", "prompt_tokens", "decode_rows", "padding_rows",
                "recomputed_tokens", "skipped_tokens", "preemptions", "dropped_tokens",
                "transfers_out", "tokens_out", "bytes_out", "transfers_in", "tokens_in",
                "bytes_in")
        return {k: getattr(self, k) for k in keys}


class CountingScheduler(Scheduler):
    """The engine's scheduler, unchanged, except that each preemption adds the K/V it frees
    to ``work.dropped_tokens`` (read before ``Scheduler.preempt`` resets ``num_computed``)."""

    def __init__(self, config: ServingConfig, work: Work, memory: MemoryManager | None = None):
        super().__init__(config, memory)
        self.work = work

    def preempt(self, seq: Sequence) -> None:
        self.work.preemptions += 1
        self.work.dropped_tokens += seq.num_computed
        super().preempt(seq)
