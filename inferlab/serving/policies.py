"""The scheduling policies: who runs in the next step, written with the scheduler's actions.

A policy is a function ``policy(scheduler, now) -> Step``: it reads the scheduler's queues,
changes sequences only through its actions (``admit``, ``append_slot``, ``preempt``, ``hold``,
``retire``; ``inferlab.serving.scheduler``) and returns the ``Step`` to run
(``inferlab.serving.step``). The scheduler looks a named policy up in ``POLICIES`` here
(``resolve_policy``); this module imports nothing of the scheduler's at run time.

- ``continuous_policy``: iteration-level batching (Orca, Yu et al., OSDI 2022) with preemption
  by recompute when the paged pool runs dry (vLLM, Kwon et al., SOSP 2023): the latest arrival
  is preempted first, and nobody is admitted in a step that preempted.
- ``chunked_policy``: chunked prefill (Sarathi-Serve, Agrawal et al., OSDI 2024), Chapter 7's:
  a token budget per step, spent on the running decodes first and then on prefill chunks, so
  that a long prompt never stalls the decodes for longer than one bounded step.
- ``static_policy`` and ``make_static_policy``: request-level batching, and dynamic batching
  (a window to fill the batch), the baseline Chapter 4 compares against. Padding is this
  policy's alone: it ``hold``s each member, so that a finished one keeps its place and its
  memory, lists the finished ones as ``step.padding`` rows while the batch is in flight, and
  retires them all when the batch is over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from inferlab.serving.request import Status
from inferlab.serving.step import Step

if TYPE_CHECKING:  # the scheduler imports this module, never the other way round
    from inferlab.serving.scheduler import Scheduler


def _schedule_decodes(sched: Scheduler, step: Step, skip_prefilling: bool = False) -> None:
    """Give every running sequence a slot for its next token, oldest first; when the pool is
    empty, preempt the latest arrival (possibly the sequence itself) until the slot fits. Both
    policies begin a step this way; the chunked one skips sequences whose prompt is not yet
    computed (``skip_prefilling``), since those get prefill work, not a decode."""
    for seq in list(sched.running):  # oldest first; the list changes as we preempt
        if seq.status is not Status.RUNNING:  # preempted earlier in this loop
            continue
        if skip_prefilling and sched.is_prefilling(seq):  # its prompt is not computed yet
            continue
        while not sched.can_append(seq):
            victim = sched.running[-1]  # the latest arrival
            sched.preempt(victim)
            step.preempted.append(victim)
            if victim is seq:
                break
        else:
            sched.append_slot(seq)
            step.decodes.append(seq)


def continuous_policy(sched: Scheduler, now: float = 0.0) -> Step:
    """Iteration-level batching with preemption by recompute (vLLM's default policy).

    1. Every running sequence, oldest first, gets a slot for its next token. When the pool is
       empty, preempt the latest-arrived running sequence (possibly this one) until it fits.
    2. If nobody was preempted, admit waiting sequences in arrival order while a batch slot,
       their memory and the prefill-token budget allow; stop at the first that does not fit.
    """
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


def chunked_policy(sched: Scheduler, now: float = 0.0) -> Step:
    """Chunked prefill (Sarathi-Serve's stall-free batching): one forward pass of at most
    ``sched.token_budget`` tokens a step.

    1. Decodes first: every running sequence whose prompt is computed gets a slot for its next
       token, oldest first, preempting the latest arrival when the pool is empty, exactly as
       ``continuous_policy`` does. Each costs one token of the budget.
    2. The rest of the budget goes to prefill work, oldest first: first the running sequences
       whose prompt is partly computed, then waiting sequences admitted in arrival order (with
       memory for all their tokens, as ``continuous_policy`` asks; none after a preemption).
       Each gets min(its uncomputed tokens, the budget left); a sequence that gets fewer than
       all of them is a chunk (``step.chunks``) and continues next step.
    """
    step = Step()
    begun = [s for s in sched.running if sched.is_prefilling(s)]  # prompts chunked earlier
    _schedule_decodes(sched, step, skip_prefilling=True)
    budget = sched.token_budget - len(step.decodes)
    for seq in begun:
        if seq.status is Status.RUNNING and budget > 0:  # not preempted above
            n = min(seq.num_uncomputed, budget)
            step.prefill(seq, n)
            budget -= n
    while not step.preempted and budget > 0 and sched.waiting \
            and sched.can_admit(sched.waiting[0]):
        seq = sched.waiting[0]
        sched.admit(seq)
        n = min(seq.num_uncomputed, budget)
        step.prefill(seq, n)
        budget -= n
    return step


def static_policy(sched: Scheduler, now: float = 0.0, max_wait_s: float = 0.0,
                  pad: bool = True) -> Step:
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


def make_static_policy(max_wait_s: float = 0.0,
                       pad: bool = True) -> Callable[[Scheduler, float], Step]:
    """A static (``max_wait_s=0``) or dynamic-batching (``max_wait_s>0``) policy function.

    ``pad=False`` lets finished members leave the decode batch early (no padding rows); the
    batch still admits nobody until all its members are done.
    """
    if max_wait_s < 0:
        raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")

    def policy(sched: Scheduler, now: float = 0.0) -> Step:
        return static_policy(sched, now, max_wait_s, pad)

    policy.__name__ = "static_policy" if max_wait_s == 0 else f"dynamic_policy({max_wait_s}s)"
    return policy


POLICIES = {"continuous": continuous_policy, "static": static_policy, "chunked": chunked_policy}


def resolve_policy(policy) -> Callable[["Scheduler", float], Step]:
    """A policy function from a name in ``POLICIES`` or a function ``policy(scheduler, now)``."""
    if callable(policy):
        return policy
    try:
        return POLICIES[policy]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy {policy!r}; use one of {sorted(POLICIES)} or pass a "
                         "function policy(scheduler, now) -> Step") from None
