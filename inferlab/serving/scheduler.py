"""The iteration-level scheduler: who runs in the next step, and who waits.

Orca (Yu et al., OSDI 2022) schedules a serving engine one iteration at a time instead of one
batch at a time: before every forward pass the scheduler re-forms the batch, so a finished
request leaves at once and a waiting one joins at once. vLLM (Kwon et al., SOSP 2023) pairs
that with the paged KV cache (``inferlab.serving.block_manager``): a request is admitted when
the blocks for its prompt are free, takes one more block each time it crosses a block boundary,
and when the pool runs dry the scheduler *preempts*: it frees every block of the latest-arrived
running request and puts it back in the waiting queue, to be recomputed from its prompt and the
tokens it already produced (first come, first served; all or nothing).

The scheduler admits through a memory manager: the paged ``BlockManager`` by default, or one of
the contiguous reservations of ``inferlab.serving.reservation``, which is how Chapter 3's
memory experiment runs through this same code.

Read in this order:

- ``Step``: what one forward pass will run: prefills, decodes, and who was preempted.
- ``Scheduler``: the waiting and running queues and the only actions that change a sequence
  (``admit``, ``append_slot``, ``preempt``, ``hold``, ``update``/``retire``, ``abort``), each
  with the check a policy asks first (``can_admit``, ``can_append``). The model runner only reads
  sequences.
- ``continuous_policy`` and ``static_policy``: the two decisions Chapter 4 compares, written
  with those actions. A policy is a function ``policy(scheduler, now) -> Step``.
- ``chunked_policy``: chunked prefill (Sarathi-Serve, Agrawal et al., OSDI 2024), Chapter 7's:
  a token budget per step, spent on the running decodes first and then on prefill chunks, so
  that a long prompt never stalls the decodes for longer than one bounded step.

Token bookkeeping, the invariant the engine relies on: a running sequence's block table has a
slot for every one of its tokens (admission allocates the whole prompt, ``append_slot`` one
slot before each decode), and ``seq.num_computed`` says how many of them hold K/V. A step runs
``step.new_tokens(seq)`` of the uncomputed ones through the model (all of them, unless a chunk
says fewer); the step that computes the last one samples the next token. So after each step that
sampled a token the cache holds K/V for ``len(prompt) + len(output) - 1`` tokens, and the newest
token's K/V is written by the next decode step, which feeds that token in. A sequence is done
after ``max_new_tokens`` tokens or at an end-of-sequence token, whichever comes first.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable

from inferlab.serving.block_manager import BlockManager
from inferlab.serving.config import ServingConfig
from inferlab.serving.interfaces import MemoryManager
from inferlab.serving.request import Sequence, Status


class SchedulingError(RuntimeError):
    """A policy broke the rules: ran a sequence without room, or ran one twice in a step."""


@dataclass
class Step:
    """One iteration: prefill each of ``prefills`` (alone), then decode ``decodes`` as a batch.

    With a token budget (chunked prefill) the step is one forward pass over both, and
    ``chunks`` says how many tokens a prefill computes when that is fewer than all its
    uncomputed tokens: a prompt may then span several steps and samples a token only in the
    step that computes its last chunk. ``wake_at_s`` lets a policy that chose to wait (dynamic
    batching's window) say when it wants to be asked again.
    """

    prefills: list[Sequence] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
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
        """Tokens the step runs through the model (what a token budget bounds)."""
        return sum(self.new_tokens(s) for s in self.prefills) + len(self.decodes)


def _insert(queue: list[Sequence], seq: Sequence) -> None:
    """Insert ``seq`` keeping ``queue`` sorted by arrival (FCFS)."""
    bisect.insort(queue, seq, key=lambda s: s.order)


def resolve_policy(policy) -> Callable[["Scheduler", float], Step]:
    """A policy function from a name in ``POLICIES`` or a function ``policy(scheduler, now)``."""
    if callable(policy):
        return policy
    try:
        return POLICIES[policy]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy {policy!r}; use one of {sorted(POLICIES)} or pass a "
                         "function policy(scheduler, now) -> Step") from None


class Scheduler:
    """Waiting and running queues over one KV memory; ``config.policy`` decides each step.

    ``config.max_batch`` caps how many sequences run at once (vLLM's ``max_num_seqs``) and
    ``config.max_prefill_tokens`` how many prompt tokens one step may prefill (at least one
    prefill always goes, however long); ``config.token_budget`` how many tokens a chunked step
    runs, decodes included. ``memory`` defaults to a ``BlockManager`` of ``config.num_blocks``
    blocks of ``config.block_size`` tokens.

    A finished sequence leaves the batch in ``update``, unless its policy ``hold``s it: static
    batching keeps finished members as padding rows until its batch is over.
    """

    def __init__(self, config: ServingConfig, memory: MemoryManager | None = None):
        if memory is None:
            if config.num_blocks is None:
                raise ValueError("the scheduler needs config.num_blocks (or a memory manager)")
            memory = BlockManager(config.num_blocks, config.block_size, config.watermark)
        self.config = config
        self.memory = memory
        self.max_batch = config.max_batch
        self.max_prefill_tokens = config.max_prefill_tokens or math.inf
        self.token_budget = config.token_budget  # None: whole prompts, a forward pass each
        self.policy = resolve_policy(config.policy)
        self.waiting: list[Sequence] = []   # sorted by arrival
        self.running: list[Sequence] = []   # sorted by arrival
        self.finished: list[Sequence] = []
        self.num_preemptions = 0
        self._num_held = 0  # running sequences a policy holds (``hold``)

    # -- questions a policy asks ------------------------------------------------------------
    def blocks_for(self, n_tokens: int) -> int:
        """Blocks that hold ``n_tokens`` tokens in this scheduler's memory."""
        return self.memory.blocks_for(n_tokens)

    def can_admit(self, seq: Sequence) -> bool:
        """Whether ``seq`` may start running now: a batch slot and memory for all its tokens."""
        return (len(self.running) < self.max_batch
                and self.memory.can_allocate(seq.num_tokens, seq.max_tokens))

    def can_append(self, seq: Sequence) -> bool:
        """Whether a running ``seq`` can get one more token slot (a new block if it needs one);
        a prefix-caching memory may evict cached blocks to make the room."""
        return seq.table.can_append(1) or self.memory.make_room(seq.table.blocks_needed(1))

    def is_prefilling(self, seq: Sequence) -> bool:
        """Whether a running ``seq`` still has prompt tokens to compute (a chunked prompt):
        admission gave it slots for all its tokens, and not all of them hold K/V yet. A running
        sequence that is not prefilling is decoding: it needs a slot for its newest token."""
        return seq.num_computed < seq.table.num_tokens

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def padding(self) -> list[Sequence]:
        """Finished sequences held in the batch (``hold``): rows that compute and produce nothing."""
        if not self._num_held:
            return []
        return [s for s in self.running if s.held and s.is_done]

    # -- the actions: the only code that changes a sequence's state ------------------------
    def add(self, seq: Sequence) -> None:
        """A new request joins the waiting queue."""
        if seq.status is not Status.WAITING or seq.table is not None:
            raise SchedulingError(f"only new sequences can be added, got {seq!r}")
        if not self.memory.can_hold(seq.max_tokens):
            raise ValueError(f"sequence {seq.seq_id} needs {self.blocks_for(seq.max_tokens)} "
                             f"blocks at its longest but the pool has "
                             f"{self.memory.num_blocks}: it could never finish")
        _insert(self.waiting, seq)

    def admit(self, seq: Sequence) -> None:
        """Move ``seq`` from waiting to running, with memory for its prompt and output so far."""
        if seq.status is not Status.WAITING:
            raise SchedulingError(f"admit: {seq!r} is not waiting")
        if len(self.running) >= self.max_batch:
            raise SchedulingError(f"admit: the batch is full ({self.max_batch} running)")
        # raises OutOfBlocksError, changing nothing, if there is no room
        table, cached = self.memory.allocate_sequence(seq)  # cached: a prefix cache's hit
        self.waiting.remove(seq)
        seq.table, seq.status, seq.num_computed = table, Status.RUNNING, cached
        _insert(self.running, seq)

    def append_slot(self, seq: Sequence) -> None:
        """Give a running ``seq`` room for the token its next decode feeds in."""
        if seq.status is not Status.RUNNING:
            raise SchedulingError(f"append_slot: {seq!r} is not running")
        seq.table.append(1)

    def hold(self, seq: Sequence) -> None:
        """Keep a running ``seq`` in the batch once it finishes, until the policy retires it."""
        if seq.status is not Status.RUNNING:
            raise SchedulingError(f"hold: {seq!r} is not running")
        if not seq.held:
            seq.held = True
            self._num_held += 1

    def preempt(self, seq: Sequence) -> None:
        """Free all of ``seq``'s memory and send it back to wait; it will be recomputed."""
        if seq.status is not Status.RUNNING:
            raise SchedulingError(f"preempt: {seq!r} is not running")
        seq.table.free()
        self.running.remove(seq)
        self._num_held -= seq.held
        seq.table, seq.status, seq.held = None, Status.WAITING, False
        seq.num_computed = 0  # its K/V are gone: a recompute starts from the first token
        seq.num_preemptions += 1
        self.num_preemptions += 1
        _insert(self.waiting, seq)

    def retire(self, seq: Sequence) -> None:
        """A finished ``seq`` leaves the batch and returns its memory."""
        if seq.status is not Status.RUNNING or not seq.is_done:
            raise SchedulingError(f"retire: {seq!r} is not a finished running sequence")
        seq.table.free()
        self.running.remove(seq)
        self._num_held -= seq.held
        seq.table, seq.status, seq.held = None, Status.FINISHED, False
        self.finished.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Take ``seq`` out, waiting or running (or half-way, after a failure), and free its
        memory now (its client left, or the engine failed on it)."""
        if seq.status is Status.FINISHED:
            raise SchedulingError(f"abort: {seq!r} has already finished")
        if seq in self.waiting:  # identity: a Sequence compares by identity
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
            self._num_held -= seq.held
        if seq.table is not None:
            seq.table.free()
        seq.table, seq.held = None, False
        seq.status = Status.FINISHED  # but not in ``finished``: it completed nothing

    def schedule(self, now: float = 0.0) -> Step:
        """Ask the policy for the next step and check that it kept the rules."""
        step = self.policy(self, now)
        self._validate(step)
        return step

    def update(self, step: Step, tokens: list[int]) -> list[Sequence]:
        """Record what each scheduled sequence computed and its new token (the token of a chunk
        that leaves part of its prompt for later is dropped); retire the finished ones and
        return them."""
        scheduled = step.scheduled
        if len(tokens) != len(scheduled):
            raise ValueError(f"{len(tokens)} tokens for {len(scheduled)} scheduled sequences")
        done, chunks = [], step.chunks
        for seq, token in zip(scheduled, tokens):
            if chunks and seq in chunks and chunks[seq] < seq.num_uncomputed:
                seq.num_computed += chunks[seq]  # part of its prompt is left: no token yet
                continue
            seq.num_computed = seq.num_tokens
            seq.output.append(int(token))
            if seq in step.prefills:
                self.memory.remember(seq)  # its prompt's blocks, for a prefix cache
            if seq.is_done:
                done.append(seq)
                if not seq.held:
                    self.retire(seq)
        return done

    def _validate(self, step: Step) -> None:
        seen = set()
        chunked = self.token_budget is not None
        if step.chunks and self.token_budget is None:
            raise SchedulingError("a step with prefill chunks needs config.token_budget: "
                                  "chunks run in one forward pass with the decodes")
        if self.token_budget is not None and step.num_tokens > self.token_budget:
            raise SchedulingError(f"the step runs {step.num_tokens} tokens but the token budget "
                                  f"is {self.token_budget}: decodes take one each, and prefill "
                                  "chunks only what is left")
        chunks = step.chunks
        for kind, seqs in (("prefill", step.prefills), ("decode", step.decodes)):
            for seq in seqs:
                key = id(seq)
                if key in seen:
                    raise SchedulingError(f"{seq!r} is scheduled twice in one step")
                seen.add(key)
                if seq.status is not Status.RUNNING:
                    raise SchedulingError(f"{kind} of {seq!r}, which is not running: admit it "
                                          "first (and do not run a sequence you preempted)")
                n = len(seq.prompt) + len(seq.output)
                if seq.table.num_tokens != n:
                    raise SchedulingError(
                        f"{kind} of {seq!r}: its block table holds {seq.table.num_tokens} "
                        f"tokens but the step needs room for {n} (prefill: admit "
                        "gives room for every token; decode: call append_slot once)")
                if seq.is_done:
                    raise SchedulingError(f"{kind} of {seq!r}, which is already done")
                left = n - seq.num_computed
                new = chunks[seq] if chunks and seq in chunks else left
                if not 0 < new <= left:
                    raise SchedulingError(f"{kind} of {seq!r} runs {new} tokens; it has "
                                          f"{left} still to compute (a chunk "
                                          "runs at least one and at most all of them)")
                if chunked and kind == "decode" and left != 1:
                    raise SchedulingError(f"decode of {seq!r}, whose prompt is not computed "
                                          "yet: it needs prefill chunks first")
        if len(seen) + self._num_held < len(self.running) or self._num_held:
            for seq in self.running:
                if id(seq) not in seen and not (seq.held and seq.is_done) \
                        and not (chunked and self.is_prefilling(seq)):  # mid-prompt may wait
                    raise SchedulingError(f"{seq!r} is running but got no token this step: "
                                          "every running sequence decodes in every step")


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


def static_reservation(sched: Scheduler, seqs: list[Sequence]) -> int:
    """Blocks a static batch reserves: each member's longest length, from the start."""
    return sum(sched.blocks_for(s.max_tokens) for s in seqs)


def static_policy(sched: Scheduler, now: float = 0.0, max_wait_s: float = 0.0,
                  pad: bool = True) -> Step:
    """Request-level (static) batching: form a batch, run it until its last member finishes.

    While a batch is in flight nobody joins it, and (with ``pad``, as FasterTransformer-style
    engines do) members that finished keep their row as padding until the longest is done: the
    policy holds them (``sched.hold``), the runner computes their rows and drops what they
    produce, and the policy retires them when the batch is over. Then the waiting requests (up
    to ``max_batch``, in arrival order, while their full-length reservations fit) form the next
    batch. With ``max_wait_s`` > 0 this is *dynamic batching*: an incomplete batch waits up to
    that long after its oldest request arrived, hoping to fill. Prompts are prefilled one by one
    at their own length (kinder to the baseline than padding them to the longest).
    """
    step = Step()
    live = [s for s in sched.running if not s.is_done]
    if live:  # a batch is in flight
        for seq in live:
            sched.append_slot(seq)  # cannot fail: the batch reserved its blocks at launch
            step.decodes.append(seq)
        return step
    for seq in list(sched.running):  # the batch is over: its held members leave with it
        sched.retire(seq)
    if not sched.waiting:
        return step
    deadline = sched.waiting[0].arrival_s + max_wait_s
    if max_wait_s > 0 and len(sched.waiting) < sched.max_batch and now < deadline:
        step.wake_at_s = deadline
        return step
    batch: list[Sequence] = []
    for seq in sched.waiting[:sched.max_batch]:
        if static_reservation(sched, batch + [seq]) > sched.memory.num_free:
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
