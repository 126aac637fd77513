"""Who runs in the next step: the ``Step`` a policy returns, and the policies that write it.

A policy is a function ``policy(scheduler, now) -> Step``: it reads the scheduler's queues,
changes sequences only through the scheduler's actions (``admit``, ``append_slot``,
``preempt``, ``hold``, ``retire``; ``inferlab.serving.scheduler``) and lists in a ``Step`` what
the next iteration runs. The scheduler checks the step and lays it out once as forward passes
of ``Span`` rows (``Step.plan``): the loop, the runner and the scheduler's bookkeeping all read
those rows, so whether a row's token is kept, and which rows share a forward pass, are decided
in one place. This module imports nothing of the scheduler's; the scheduler looks a named
policy up here (``resolve_policy``).

- ``continuous_policy``: iteration-level batching (Orca, Yu et al., OSDI 2022) with preemption
  by recompute when the paged pool runs dry (vLLM, Kwon et al., SOSP 2023). Every running
  sequence, oldest first, gets a slot for its next token; when the pool is empty the
  latest-arrived running sequence (possibly this one) is preempted until the slot fits. If
  nobody was preempted, waiting sequences are admitted in arrival order while a batch slot,
  their memory and the prefill-token budget allow, stopping at the first that does not fit.
- ``chunked_policy``: chunked prefill (Sarathi-Serve, Agrawal et al., OSDI 2024), Chapter 7's:
  a token budget per step, so that a long prompt never stalls the decodes for longer than one
  bounded step. Decodes first, exactly as ``continuous_policy`` gives them (one token of the
  budget each); the rest of the budget goes to prefill work, oldest first: the running
  sequences whose prompt is partly computed, then waiting sequences admitted in arrival order
  (with memory for all their tokens; none after a preemption). Each gets min(its uncomputed
  tokens, the budget left); one that gets fewer is a chunk (``step.chunks``) and continues
  next step.
- ``static_policy`` and ``make_static_policy``: request-level batching, and dynamic batching
  (a window to fill the batch), the baseline Chapter 4 compares against. Padding is this
  policy's alone: it ``hold``s each member, so that a finished one keeps its place and its
  memory, lists the finished ones as ``step.padding`` rows while the batch is in flight, and
  retires them all when the batch is over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from inferlab.serving.request import Sequence, Status


class Span(NamedTuple):
    """One row of a forward pass: ``new`` tokens of ``seq`` from position ``start`` on."""

    seq: Sequence
    new: int        # tokens run through the model
    start: int      # their first position: the tokens before it hold K/V already
    prefill: bool   # prompt work (a whole prompt, a chunk, a recompute); False: one decode token
    emits: bool     # it computes the sequence's last uncomputed token: its token is kept


@dataclass
class Step:
    """One iteration: prefill each of ``prefills`` (alone), then decode ``decodes`` as a batch
    (with any ``padding`` rows).

    With a token budget (chunked prefill) the step is one forward pass over both, and
    ``chunks`` says how many tokens a prefill computes when that is fewer than all its
    uncomputed tokens: a prompt may then span several steps and keeps a token only in the step
    that computes its last chunk. ``padding`` lists finished sequences the policy keeps in the
    batch as rows (static batching's padding): the decode forward computes them and their
    tokens are dropped. ``wake_at_s`` lets a policy that chose to wait (dynamic batching's
    window) say when it wants to be asked again. ``forwards`` is the step laid out as forward
    passes (``plan``), filled by the scheduler once the step is checked.
    """

    prefills: list[Sequence] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    padding: list[Sequence] = field(default_factory=list)
    wake_at_s: float | None = None
    chunks: dict[Sequence, int] = field(default_factory=dict)
    forwards: list[list[Span]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def scheduled(self) -> list[Sequence]:
        """Every sequence the step computes, in the order the engine runs them."""
        return [*self.prefills, *self.decodes]

    def prefill(self, seq: Sequence, n: int | None = None) -> int:
        """Prefill ``n`` of ``seq``'s uncomputed tokens this step (default: all of them); how
        many that is."""
        self.prefills.append(seq)
        if n is not None and n < seq.num_uncomputed:
            self.chunks[seq] = n
        return self.new_tokens(seq)

    def new_tokens(self, seq: Sequence) -> int:
        """Tokens of ``seq`` this step runs through the model: its chunk, or all uncomputed."""
        return self.chunks.get(seq, seq.num_uncomputed)

    def emits(self, seq: Sequence) -> bool:
        """Whether this step computes ``seq``'s last uncomputed token, so keeps its next one."""
        return self.new_tokens(seq) == seq.num_uncomputed

    @property
    def num_tokens(self) -> int:
        """Tokens the step runs through the model (what a token budget bounds): padding rows
        are computed too."""
        return sum(map(self.new_tokens, self.prefills)) + len(self.decodes) + len(self.padding)

    def plan(self, one_forward: bool) -> None:
        """Lay the step out as forward passes of ``Span`` rows, decodes first: one pass
        (``one_forward``: chunked prefill), or a pass per prefill and one of the decodes."""
        decodes = [_span(s, 1, True) for s in self.decodes] + \
            [Span(s, 1, s.table.num_tokens - 1, False, False) for s in self.padding]
        prefills = [_span(s, self.new_tokens(s), self.emits(s)) for s in self.prefills]
        self.forwards = [decodes + prefills] if one_forward else \
            [[p] for p in prefills] + ([decodes] if decodes else [])


def _span(seq: Sequence, n: int, emits: bool) -> Span:
    """A row of ``n`` of ``seq``'s uncomputed tokens; a decode is one token after its prompt."""
    decode = n == 1 and bool(seq.output) and seq.num_computed >= len(seq.request.prompt)
    return Span(seq, n, seq.num_computed, not decode, emits)


def _schedule_decodes(sched, step: Step, skip_prefilling: bool = False) -> None:
    """Give every running sequence (but a prefilling one, with ``skip_prefilling``) a slot for
    its next token, oldest first, preempting the latest arrival until the slot fits."""
    for seq in list(sched.running):  # oldest first; the list changes as we preempt
        if seq.status is not Status.RUNNING or (skip_prefilling and sched.is_prefilling(seq)):
            continue  # preempted earlier in this loop, or its prompt is not computed yet
        while not sched.can_append(seq):
            victim = sched.running[-1]  # the latest arrival
            sched.preempt(victim)
            step.preempted.append(victim)
            if victim is seq:
                break
        else:
            sched.append_slot(seq)
            step.decodes.append(seq)


def continuous_policy(sched, now: float = 0.0) -> Step:
    """Iteration-level batching (vLLM's default policy): decode every running sequence,
    preempting the latest arrivals; if nobody was preempted, admit in arrival order."""
    step = Step()
    _schedule_decodes(sched, step)
    if step.preempted:  # memory is short: admitting now would only preempt again
        return step
    budget = sched.max_prefill_tokens
    while sched.waiting and sched.can_admit(sched.waiting[0]):
        seq = sched.waiting[0]
        if step.prefills and seq.num_tokens > budget:
            break
        sched.admit(seq)
        step.prefills.append(seq)
        budget -= seq.num_tokens
    return step


def chunked_policy(sched, now: float = 0.0) -> Step:
    """Chunked prefill (Sarathi-Serve's stall-free batching): one forward pass of at most
    ``sched.token_budget`` tokens a step, the decodes first, then prefill chunks oldest first."""
    step = Step()
    begun = [s for s in sched.running if sched.is_prefilling(s)]  # prompts chunked earlier
    _schedule_decodes(sched, step, skip_prefilling=True)
    budget = sched.token_budget - len(step.decodes)
    for seq in begun:
        if seq.status is Status.RUNNING and budget > 0:  # not preempted above
            budget -= step.prefill(seq, min(seq.num_uncomputed, budget))
    while not step.preempted and budget > 0 and sched.waiting \
            and sched.can_admit(sched.waiting[0]):
        seq = sched.waiting[0]
        sched.admit(seq)
        budget -= step.prefill(seq, min(seq.num_uncomputed, budget))
    return step


def static_policy(sched, now: float = 0.0, max_wait_s: float = 0.0, pad: bool = True) -> Step:
    """Request-level (static) batching: form a batch, run it until its last member finishes.

    While a batch is in flight nobody joins it, and (with ``pad``, as FasterTransformer-style
    engines do) members that finished keep their row as padding until the longest is done: the
    policy holds them (``sched.hold``) and lists them in ``step.padding``, the runner computes
    their rows and the loop drops what they produce, and the policy retires them when the batch
    is over. Then the waiting requests (up to ``max_batch``, in arrival order, while their
    full-length reservations fit) form the next batch. With ``max_wait_s`` > 0 this is *dynamic
    batching*: an incomplete batch waits up to that long after its oldest request arrived,
    hoping to fill. Prompts are prefilled one by one at their own length (kinder to the
    baseline than padding them to the longest).
    """
    step = Step()
    live = [s for s in sched.running if not s.is_done]
    if live:  # a batch is in flight
        for seq in live:
            sched.append_slot(seq)  # cannot fail: the batch reserved its blocks at launch
            step.decodes.append(seq)
        if pad:
            step.padding = [s for s in sched.running if s.is_done]
        return step
    for seq in list(sched.running):  # the batch is over: its held members leave with it
        sched.retire(seq)
    if not sched.waiting:
        return step
    deadline = sched.waiting[0].arrival_s + max_wait_s
    if max_wait_s > 0 and len(sched.waiting) < sched.max_batch and now < deadline:
        step.wake_at_s = deadline
        return step
    batch, reserved = [], 0  # blocks for each member's longest length, from the start
    for seq in sched.waiting[:sched.max_batch]:
        reserved += sched.blocks_for(seq.max_tokens)
        if reserved > sched.memory.num_free:
            break
        batch.append(seq)
    for seq in batch:
        sched.admit(seq)
        if pad:
            sched.hold(seq)
        step.prefills.append(seq)
    return step


def make_static_policy(max_wait_s: float = 0.0, pad: bool = True) -> Callable:
    """A static (``max_wait_s=0``) or dynamic-batching (``max_wait_s>0``) policy function.

    ``pad=False`` lets finished members leave the decode batch early (no padding rows); the
    batch still admits nobody until all its members are done.
    """
    if max_wait_s < 0:
        raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")

    def policy(sched, now: float = 0.0) -> Step:
        return static_policy(sched, now, max_wait_s, pad)

    policy.__name__ = "static_policy" if max_wait_s == 0 else f"dynamic_policy({max_wait_s}s)"
    return policy


POLICIES = {"continuous": continuous_policy, "static": static_policy, "chunked": chunked_policy}


def resolve_policy(policy) -> Callable:
    """A policy function from a name in ``POLICIES`` or a function ``policy(scheduler, now)``."""
    if callable(policy):
        return policy
    try:
        return POLICIES[policy]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy {policy!r}; use one of {sorted(POLICIES)} or pass a "
                         "function policy(scheduler, now) -> Step") from None
