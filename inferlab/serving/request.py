"""A request, the sequence the engine makes of it, and the spans of it a forward pass runs.

A ``Request`` is what a client sends: prompt token ids, how many tokens to generate at most,
when it arrives, the tokens that end it early (end-of-sequence), and how to sample (a
temperature, top-k, top-p and a seed). Inside the engine each request becomes a ``Sequence``,
which holds its request and adds what the engine changes as it serves it: the tokens produced
so far and when each came out, how many of its tokens hold K/V, its status and its block table.
Only the scheduler changes a sequence (nano-vllm's ``sequence.py`` plays the same part); whether
a request can be served at all is ``inferlab.validation``'s question, asked once. A ``Span`` is
one row of a forward pass: some of a sequence's tokens, from a position on, and whether the
token sampled after them is kept; the scheduler lays each step out in spans
(``inferlab.serving.scheduler.Step.plan``), and the loop and the runners read them. All of it
is data that every part reads.

One definition every part of the engine shares: a request that may generate ``n`` tokens stores
the K/V of at most ``longest_tokens(prompt_len, n) = prompt_len + n - 1`` tokens, because the
last token it samples is returned, never fed back through the model. The scheduler reserves by
it, the pool is sized by it and the simulators count by it.
"""

from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from inferlab.model.sampling import is_greedy


def longest_tokens(prompt_len: int, max_new_tokens: int) -> int:
    """Tokens whose K/V a request stores at its longest: the prompt and all but the last output."""
    return prompt_len + max_new_tokens - 1


def _token_ids(ids) -> tuple:
    """``ids`` (a list, tuple, NumPy array or torch tensor) as a tuple; integers become ``int``.

    Anything that is not an integer (a float, a bool, a string) is kept as it is, so that
    validation can name it; the request is not refused here.
    """
    if hasattr(ids, "tolist"):  # NumPy arrays and torch tensors, of any integer dtype
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        return (ids,)
    ids = tuple(ids)
    if set(map(type, ids)) <= {int}:  # the usual case, checked at C speed
        return ids
    return tuple(int(t) if isinstance(t, numbers.Integral) and not isinstance(t, bool) else t
                 for t in ids)


@dataclass(frozen=True)
class Request:
    """A prompt (token ids), at most ``max_new_tokens`` to generate, and when it arrives (s).

    Generation also ends at any token of ``eos_token_ids`` (that token is returned, as the last
    one). The prompt may be a list, a tuple, a NumPy array or a torch tensor of integers.
    ``temperature`` 0 samples greedily (the default), and so does any temperature below
    ``inferlab.model.sampling.GREEDY_BELOW`` (1e-5); above it the runner samples from the
    softmax of logits / temperature with a generator of the request's own, seeded by ``seed``
    (random if None), drawn once per token it emits. ``top_k`` (0: off) keeps only the k
    likeliest tokens and ``top_p`` (1: off) the smallest set of them whose probability reaches
    p (nucleus sampling) before the draw. ``cache_salt`` names the prefix-cache namespace the
    request may share blocks in (None: the shared one; a server sets it per tenant). ``grammar``
    (None: free text) is a compiled grammar its tokens must follow (structured outputs,
    ``inferlab.serving.structured``): end-of-sequence comes only once the text is complete.
    """

    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival_s: float = 0.0
    request_id: object = None
    eos_token_ids: tuple[int, ...] = ()
    temperature: float = 0.0
    seed: int | None = None
    cache_salt: str | None = None
    top_k: int = 0
    top_p: float = 1.0
    grammar: object = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", _token_ids(self.prompt))
        object.__setattr__(self, "eos_token_ids", _token_ids(self.eos_token_ids))

    @property
    def max_tokens(self) -> int:
        """Tokens whose K/V the request stores at its longest (``longest_tokens``)."""
        return longest_tokens(len(self.prompt), self.max_new_tokens)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine: its ``request``, and what serving it has changed so far.

    ``output`` and ``num_computed`` (its leading tokens whose K/V the cache holds) may be given:
    a sequence may arrive with tokens generated and K/V computed elsewhere (a disaggregated
    decode instance receives each request so). ``token_times`` holds when each output token came
    out, on the engine's clock. Only the ``Scheduler`` changes these fields.
    """

    seq_id: int
    request: Request
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: Status = Status.WAITING
    table: object = None  # its block table (``BlockTable``, or a memory manager's own) once running
    num_preemptions: int = 0
    num_cached: int = 0  # prompt tokens a prefix cache held at its first admission
    token_times: list[float] = field(default_factory=list)
    generator: torch.Generator | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.generator is None and not is_greedy(self.request.temperature):
            self.generator = torch.Generator()  # its own stream, drawn once per emitted token
            if self.request.seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(int(self.request.seed))

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt

    @property
    def max_new_tokens(self) -> int:
        return self.request.max_new_tokens

    @property
    def arrival_s(self) -> float:
        return self.request.arrival_s

    @property
    def order(self) -> tuple[float, int]:
        """First come, first served: by arrival time, then by id."""
        return (self.request.arrival_s, self.seq_id)

    @property
    def tokens(self) -> list[int]:
        """The prompt and every token produced so far: what a (re)computing prefill runs."""
        return [*self.request.prompt, *self.output]

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt) + len(self.output)

    @property
    def num_uncomputed(self) -> int:
        """Tokens still to run through the model before the next one can be sampled: the whole
        prompt (and output) at admission, a prompt's remaining chunks, or 1 when decoding."""
        return self.num_tokens - self.num_computed

    def token_slice(self, start: int, n: int) -> list[int]:
        """Tokens ``start .. start + n - 1`` of prompt + output, without building the whole list."""
        p = len(self.request.prompt)
        return [*self.request.prompt[start:start + n],
                *self.output[max(start - p, 0):max(start + n - p, 0)]]

    @property
    def max_tokens(self) -> int:
        """Tokens whose K/V the sequence stores at its longest (``Request.max_tokens``)."""
        return self.request.max_tokens

    @property
    def stopped(self) -> bool:
        """Whether the last token produced is an end-of-sequence token."""
        return bool(self.output) and self.output[-1] in self.request.eos_token_ids

    @property
    def is_done(self) -> bool:
        return len(self.output) >= self.request.max_new_tokens or self.stopped

    @property
    def finish_reason(self) -> str | None:
        """"stop" (an end-of-sequence token), "length" (max_new_tokens), or None (not done)."""
        return "stop" if self.stopped else "length" if self.is_done else None

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, {self.status.value}, prompt={len(self.prompt)}, "
                f"output={len(self.output)}/{self.max_new_tokens}, computed={self.num_computed}, "
                f"preempted={self.num_preemptions})")


class Span(NamedTuple):
    """One row of a forward pass: ``new`` tokens of ``seq`` from position ``start`` on."""

    seq: Sequence
    new: int        # tokens run through the model
    start: int      # their first position: the tokens before it hold K/V already
    prefill: bool   # prompt work (a whole prompt, a chunk, a recompute); False: one decode token
    emits: bool     # it computes the sequence's last uncomputed token: its token is kept
