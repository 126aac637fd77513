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

The ``Scheduler`` holds the waiting and running queues and the only actions that change a
sequence (``admit``, ``append_slot``, ``preempt``, ``hold``, ``retire``, ``abort``, and
``update``, which records a step's tokens), each with the question a policy asks first
(``can_admit``, ``can_append``). What runs each step is the policy's choice
(``inferlab.serving.policies``: a function ``policy(scheduler, now) -> Step``); ``schedule``
asks it, checks that the step keeps the rules, and lays it out as forward passes. The model
runner only reads sequences.

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

from inferlab.serving.block_manager import BlockManager
from inferlab.serving.config import ServingConfig
from inferlab.serving.interfaces import MemoryManager
from inferlab.serving.policies import (POLICIES, Step, chunked_policy, continuous_policy,
                                       make_static_policy, resolve_policy, static_policy)
from inferlab.serving.request import Sequence, Status

__all__ = ["POLICIES", "Scheduler", "SchedulingError", "Step", "chunked_policy",
           "continuous_policy", "make_static_policy", "resolve_policy", "static_policy"]
# the policies and the step keep their names here too, for the labs


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
