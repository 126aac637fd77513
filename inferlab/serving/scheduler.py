"""The iteration-level scheduler: who runs in the next step, and who waits.

Orca (Yu et al., OSDI 2022) schedules a serving engine one iteration at a time instead of one
batch at a time: before every forward pass the scheduler re-forms the batch, so a finished
request leaves at once and a waiting one joins at once. vLLM (Kwon et al., SOSP 2023) pairs
that with the paged KV cache (``inferlab.serving.paged_cache``): a request is admitted when
the blocks for its prompt are free, takes one more block each time it crosses a block boundary,
and when the pool runs dry the scheduler *preempts*: it frees every block of the latest-arrived
running request and puts it back in the waiting queue, to be recomputed from its prompt and the
tokens it already produced (first come, first served; all or nothing).

Read in this order:

- ``Step``: one iteration as a policy lists it (prefills, decodes, chunks, padding rows), and
  ``Step.plan``, which lays it out once as forward passes of ``Span`` rows
  (``inferlab.serving.request``): the loop, the runner and ``update`` all read those rows, so
  whether a row's token is kept, and which rows share a forward pass, are decided in one place.
- ``Scheduler``: the waiting and running queues over one memory manager (the paged
  ``BlockManager`` by default, or one of the contiguous reservations of
  ``inferlab.serving.reservation``, which is how Chapter 3's memory experiment runs through
  this same code), and the only actions that change a sequence (``admit``, ``append_slot``,
  ``preempt``, ``hold``, ``retire``, ``abort``, and ``update``, which records a step's
  tokens), each with the question a policy asks first (``can_admit``, ``can_append``).
  ``schedule`` asks the policy, checks that the step keeps the rules, and lays it out.
- The policies, functions ``policy(scheduler, now) -> Step`` apart from the scheduler's state:
  they read its queues and change sequences only through its actions.
  ``continuous_policy``: iteration-level batching with preemption by recompute. Every running
  sequence, oldest first, gets a slot for its next token; when the pool is empty the
  latest-arrived running sequence (possibly this one) is preempted until the slot fits. If
  nobody was preempted, waiting sequences are admitted in arrival order while a batch slot,
  their memory and the prefill-token budget allow, stopping at the first that does not fit.
  ``chunked_policy``: chunked prefill (Sarathi-Serve, Agrawal et al., OSDI 2024), Chapter 7's:
  a token budget per step, so that a long prompt never stalls the decodes for longer than one
  bounded step. Decodes first, exactly as ``continuous_policy`` gives them (one token of the
  budget each); the rest of the budget goes to prefill work, oldest first: the running
  sequences whose prompt is partly computed, then waiting sequences admitted in arrival order
  (with memory for all their tokens; none after a preemption). Each gets min(its uncomputed
  tokens, the budget left); one that gets fewer is a chunk (``step.chunks``) and continues
  next step. ``static_policy`` and ``make_static_policy``: request-level batching, and dynamic
  batching (a window to fill the batch), the baseline Chapter 4 compares against. Padding is
  this policy's alone: it ``hold``s each member, so that a finished one keeps its place and its
  memory, lists the finished ones as ``step.padding`` rows while the batch is in flight, and
  retires them all when the batch is over. A named policy is looked up in ``POLICIES``
  (``resolve_policy``). The model runner only reads sequences.

Token bookkeeping, the invariant the engine relies on: a running sequence's block table has a
slot for every one of its tokens (admission allocates them all, ``append_slot`` one slot before
each decode), and ``seq.num_computed`` says how many of them hold K/V. A step runs
``step.new_tokens(seq)`` of the uncomputed ones through the model (all of them, unless a chunk
says fewer); the step that computes the last one keeps the next token. So after each step that
kept a token the cache holds K/V for ``len(prompt) + len(output) - 1`` tokens, and the newest
token's K/V is written by the next decode step, which feeds that token in. A sequence is done
after ``max_new_tokens`` tokens or at an end-of-sequence token, whichever comes first.
Preemption throws K/V away: the scheduler counts the tokens it threw away
(``recomputed_tokens``), which are computed again when the sequence is admitted again.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable

from inferlab.serving.paged_cache import BlockManager
from inferlab.serving.config import ServingConfig
from inferlab.serving.interfaces import MemoryManager
from inferlab.serving.request import Sequence, Span, Status


# -- a step: what a policy lists, and the forward passes it runs ----------------------------------
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


# -- the scheduler: the queues and the only actions that change a sequence ------------------------
class SchedulingError(RuntimeError):
    """A policy broke the rules: ran a sequence without room, or ran one twice in a step."""


def _insert(queue: list[Sequence], seq: Sequence) -> None:
    """Insert ``seq`` keeping ``queue`` sorted by arrival (FCFS)."""
    bisect.insort(queue, seq, key=lambda s: s.order)


class Scheduler:
    """Waiting and running queues over one KV memory; ``config.policy`` decides each step.

    ``config.max_batch`` caps how many sequences run at once (vLLM's ``max_num_seqs``) and
    ``config.max_prefill_tokens`` how many prompt tokens one step may prefill (at least one
    prefill always goes, however long); ``config.token_budget`` how many tokens a chunked step
    runs, decodes included. ``memory`` defaults to a ``BlockManager`` of ``config.num_blocks``
    blocks of ``config.block_size`` tokens.

    A finished sequence leaves the batch in ``update``, unless its policy ``hold``s it: static
    batching keeps its finished members, and their memory, until its batch is over (and says in
    ``step.padding`` which of them to compute as rows).

    ``check`` says whether ``schedule`` checks every step against the rules (``check``); by
    default it checks the steps of a policy the engine did not define (a lab's, a notebook's),
    and trusts its own, which the property tests run with ``check=True``.
    """

    def __init__(self, config: ServingConfig, memory: MemoryManager | None = None,
                 check: bool | None = None):
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
        self.checks = self.policy not in POLICIES.values() if check is None else check
        self.one_forward = config.chunked  # chunked prefill: a step is one forward pass
        self.waiting: list[Sequence] = []   # sorted by arrival
        self.running: list[Sequence] = []   # sorted by arrival
        self.num_preemptions = 0
        self.recomputed_tokens = 0  # tokens whose K/V a preemption threw away
        self._held: set[Sequence] = set()  # running sequences ``update`` does not retire

    # -- questions a policy asks ------------------------------------------------------------
    def blocks_for(self, n_tokens: int) -> int:
        """Blocks that hold ``n_tokens`` tokens in this scheduler's memory."""
        return self.memory.blocks_for(n_tokens)

    def can_admit(self, seq: Sequence) -> bool:
        """Whether ``seq`` may start running now: a batch slot and memory for all its tokens."""
        return (len(self.running) < self.max_batch
                and self.memory.can_allocate(seq.num_tokens, seq.max_tokens))

    def can_append(self, seq: Sequence) -> bool:
        """Whether a running ``seq`` can get one more slot (a prefix cache may evict for it)."""
        return seq.table.can_append(1) or self.memory.make_room(seq.table.blocks_needed(1))

    def is_prefilling(self, seq: Sequence) -> bool:
        """Whether a running ``seq`` has slots whose K/V are not computed yet (a chunked prompt)."""
        return seq.num_computed < seq.table.num_tokens

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the actions: the only code that changes a sequence's state ------------------------
    def add(self, seq: Sequence) -> None:
        """A new request joins the waiting queue.

        A sequence may arrive with its cache: ``seq.num_computed`` leading tokens whose K/V were
        computed elsewhere and travel with it (a disaggregated decode instance receives each
        request so, from the prefill instance that ran its prompt). ``admit`` keeps them; at
        least the newest token is left to compute, since that step keeps the next one.
        """
        if seq.status is not Status.WAITING or seq.table is not None:
            raise SchedulingError(f"only new sequences can be added, got {seq!r}")
        if not 0 <= seq.num_computed < seq.num_tokens:
            raise SchedulingError(f"{seq!r} arrives with K/V for {seq.num_computed} of its "
                                  f"{seq.num_tokens} tokens; at least its newest one is left "
                                  "to compute")
        if not self.memory.can_hold(seq.max_tokens):
            raise ValueError(f"sequence {seq.seq_id} needs {self.blocks_for(seq.max_tokens)} "
                             f"blocks at its longest but the pool has "
                             f"{self.memory.num_blocks}: it could never finish")
        _insert(self.waiting, seq)

    def admit(self, seq: Sequence) -> None:
        """Move ``seq`` from waiting to running, with memory for its prompt and output so far.

        The tokens whose K/V it holds are the more of what it arrived with (``num_computed``:
        0 for a new request and after a preemption, the transferred tokens for a handed-off one)
        and what the memory already caches (a prefix cache's hit); only the rest are computed.
        """
        if seq.status is not Status.WAITING:
            raise SchedulingError(f"admit: {seq!r} is not waiting")
        if len(self.running) >= self.max_batch:
            raise SchedulingError(f"admit: the batch is full ({self.max_batch} running)")
        # raises OutOfBlocksError, changing nothing, if there is no room
        table, cached = self.memory.allocate_sequence(seq)  # cached: a prefix cache's hit
        self.waiting.remove(seq)
        seq.table, seq.status = table, Status.RUNNING
        seq.num_computed = max(seq.num_computed, cached)
        if seq.num_preemptions == 0:
            seq.num_cached = cached
        _insert(self.running, seq)

    def append_slot(self, seq: Sequence) -> None:
        """Give a running ``seq`` room for the token its next decode feeds in."""
        if seq.status is not Status.RUNNING:
            raise SchedulingError(f"append_slot: {seq!r} is not running")
        seq.table.append(1)

    def hold(self, seq: Sequence) -> None:
        """Keep a running ``seq``, its place and its memory, once it finishes: ``update`` does not
        retire it, the policy will (static batching holds its members until the batch ends)."""
        if seq.status is not Status.RUNNING:
            raise SchedulingError(f"hold: {seq!r} is not running")
        self._held.add(seq)

    def _leave(self, seq: Sequence, status: Status) -> None:
        """Take ``seq`` out of the batch (if it is in it), free its memory, set its ``status``."""
        if seq in self.running:  # identity: a Sequence compares by identity
            self.running.remove(seq)
        self._held.discard(seq)
        if seq.table is not None:
            seq.table.free()
        seq.table, seq.status = None, status

    def preempt(self, seq: Sequence) -> None:
        """Free all of ``seq``'s memory and send it back to wait; it will be recomputed."""
        if seq.status is not Status.RUNNING:
            raise SchedulingError(f"preempt: {seq!r} is not running")
        self._leave(seq, Status.WAITING)
        self.recomputed_tokens += seq.num_computed  # its K/V are gone: computed again later
        seq.num_computed = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        _insert(self.waiting, seq)

    def retire(self, seq: Sequence) -> None:
        """A finished ``seq`` leaves the batch and returns its memory."""
        if seq.status is not Status.RUNNING or not seq.is_done:
            raise SchedulingError(f"retire: {seq!r} is not a finished running sequence")
        self._leave(seq, Status.FINISHED)

    def abort(self, seq: Sequence) -> None:
        """Take ``seq`` out, waiting or running (or half-way, after a failure), and free its
        memory now (its client left, or the engine failed on it)."""
        if seq.status is Status.FINISHED:
            raise SchedulingError(f"abort: {seq!r} has already finished")
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._leave(seq, Status.FINISHED)

    def end(self, seq: Sequence) -> None:
        """``seq`` turned out done after a later step was scheduled (a lookahead learns its
        tokens a step late, ``inferlab.serving.overlap``): it leaves now, running or waiting,
        unless its static batch holds it."""
        if seq not in self._held:
            if seq in self.waiting:
                self.waiting.remove(seq)
            self._leave(seq, Status.FINISHED)

    # -- a step: the policy's choice, checked and laid out; then its tokens recorded ---------
    def schedule(self, now: float = 0.0) -> Step:
        """The policy's next step, checked (``checks``) and laid out as passes (``Step.plan``)."""
        step = self.policy(self, now)
        if self.checks:
            self.check(step)
        step.plan(self.one_forward)
        return step

    def update(self, step: Step, tokens: list[int],
               times: list[float] | None = None) -> list[Sequence]:
        """Record what each of ``step.scheduled`` computed, and the token (and its time) of each
        that keeps one; retire the finished ones and return them."""
        scheduled, done = step.scheduled, []
        if len(tokens) != len(scheduled):
            raise ValueError(f"{len(tokens)} tokens for {len(scheduled)} scheduled sequences")
        for i, seq in enumerate(scheduled):
            if not step.emits(seq):  # a chunk that leaves part of its prompt: no token
                seq.num_computed += step.new_tokens(seq)
                continue
            seq.num_computed = seq.num_tokens
            seq.output.append(int(tokens[i]))
            if times is not None:
                seq.token_times.append(times[i])
            if seq in step.prefills:
                self.memory.remember(seq)  # its prompt's blocks, for a prefix cache
            if seq.is_done:
                done.append(seq)
                if seq not in self._held:
                    self.retire(seq)
        return done

    def check(self, step: Step) -> None:
        """Raise ``SchedulingError`` unless ``step`` keeps the rules: every running sequence that
        is not done (or mid-prompt, chunked) runs once, with a slot for each of its tokens and
        at least one of them uncomputed; chunks and the token budget only with a budget;
        padding rows are finished members riding along with a decode batch."""
        budget = self.token_budget
        if step.chunks and budget is None:
            raise SchedulingError("a step with prefill chunks needs config.token_budget: "
                                  "chunks run in one forward pass with the decodes")
        if budget is not None and step.num_tokens > budget:
            raise SchedulingError(f"the step runs {step.num_tokens} tokens but the token budget "
                                  f"is {budget}: decodes take one each, and prefill chunks only "
                                  "what is left")
        if step.padding and not step.decodes:
            raise SchedulingError("padding rows ride along with a decode batch; this step has "
                                  "no decodes")
        seen = set()
        for kind, seqs in (("prefill", step.prefills), ("decode", step.decodes),
                           ("padding row", step.padding)):
            for seq in seqs:
                if id(seq) in seen:
                    raise SchedulingError(f"{seq!r} is scheduled twice in one step")
                seen.add(id(seq))
                if seq.status is not Status.RUNNING:
                    raise SchedulingError(f"{kind} of {seq!r}, which is not running: admit it "
                                          "first (and do not run a sequence you preempted)")
                if (kind == "padding row") != seq.is_done:
                    raise SchedulingError(f"{kind} of {seq!r}, which is " + (
                        "already done" if seq.is_done else "not done: a live sequence decodes, "
                        "only a finished one can be padding"))
                if kind == "padding row":
                    continue
                new, left = step.new_tokens(seq), seq.num_uncomputed
                if seq.table.num_tokens != seq.num_tokens or not 0 < new <= left:
                    raise SchedulingError(
                        f"{kind} of {seq!r} runs {new} of its {left} uncomputed tokens, and its "
                        f"block table holds {seq.table.num_tokens} tokens for its "
                        f"{seq.num_tokens} (prefill: admit gives room for every token; decode: "
                        "call append_slot once; a chunk runs from one token to all of them)")
                if kind == "decode" and budget is not None and left != 1:
                    raise SchedulingError(f"decode of {seq!r}, whose prompt is not computed "
                                          "yet: it needs prefill chunks first")
        for seq in self.running:  # a finished (held) one, or one mid-prompt, may wait
            if id(seq) not in seen and not seq.is_done \
                    and not (budget is not None and self.is_prefilling(seq)):
                raise SchedulingError(f"{seq!r} is running but got no token this step: "
                                      "every running sequence decodes in every step")


# -- the policies: who runs next, through the scheduler's actions only ----------------------------
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
    # the prompts whose chunks began in earlier steps
    begun = [s for s in sched.running if sched.is_prefilling(s)]
    _schedule_decodes(sched, step, skip_prefilling=True)
    budget = sched.token_budget - len(step.decodes)
    for seq in begun:
        # a prompt that the decodes preempted above is waiting again: skip it
        if seq.status is Status.RUNNING and budget > 0:
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
