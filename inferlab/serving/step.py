"""One step of the scheduler: what one iteration will run, and the error a policy raises by breaking
the rules.

A policy (``inferlab.serving.policies``) fills a ``Step`` with the scheduler's actions
(``inferlab.serving.scheduler``); the loop (``inferlab.serving.loop``) runs it. Both modules
import this one, and neither imports the other's code at run time through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferlab.serving.request import Sequence


class SchedulingError(RuntimeError):
    """A policy broke the rules: ran a sequence without room, or ran one twice in a step."""


@dataclass
class Step:
    """One iteration: prefill each of ``prefills`` (alone), then decode ``decodes`` as a batch
    (with any ``padding`` rows).

    With a token budget (chunked prefill) the step is one forward pass over both, and
    ``chunks`` says how many tokens a prefill computes when that is fewer than all its
    uncomputed tokens: a prompt may then span several steps and samples a token only in the
    step that computes its last chunk. ``padding`` lists finished sequences the policy keeps
    in the batch as rows (static batching's padding): the decode forward computes them and
    their tokens are dropped. ``wake_at_s`` lets a policy that chose to wait (dynamic
    batching's window) say when it wants to be asked again.
    """

    prefills: list[Sequence] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    padding: list[Sequence] = field(default_factory=list)
    wake_at_s: float | None = None
    chunks: dict[Sequence, int] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def scheduled(self) -> list[Sequence]:
        """Every sequence the step computes, in the order the engine runs them."""
        return [*self.prefills, *self.decodes]

    def prefill(self, seq: Sequence, n: int | None = None) -> None:
        """Prefill ``n`` of ``seq``'s uncomputed tokens this step (default: all of them)."""
        self.prefills.append(seq)
        if n is not None and n < seq.num_uncomputed:
            self.chunks[seq] = n

    def new_tokens(self, seq: Sequence) -> int:
        """Tokens of ``seq`` this step runs through the model: its chunk, or all uncomputed."""
        if self.chunks and seq in self.chunks:
            return self.chunks[seq]
        return seq.num_uncomputed

    def samples(self, seq: Sequence) -> bool:
        """Whether this step computes ``seq``'s last uncomputed token, so samples its next one."""
        return not (self.chunks and seq in self.chunks) or \
            self.chunks[seq] == seq.num_uncomputed

    @property
    def num_tokens(self) -> int:
        """Tokens the step runs through the model (what a token budget bounds): padding rows
        are computed too."""
        return sum(self.new_tokens(s) for s in self.prefills) + len(self.decodes) + \
            len(self.padding)
