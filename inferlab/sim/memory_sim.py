"""Where reserved KV memory goes: the engine's loop under four reservation schemes.

Kwon et al. 2023 (Fig. 2) measure how much of the KV-cache memory of earlier systems holds real
token states: 20.4% to 38.2%, against 96.3% in vLLM. This module reproduces the experiment in
miniature so a reader can see where the rest goes. A pool of ``capacity`` token slots serves a
backlog of requests from a trace, all waiting at time 0, with the engine's own scheduler and
loop (``inferlab.serving.scheduler``, ``inferlab.serving.loop``): continuous batching, first
come first served, preemption by recompute. Only the memory manager it admits through changes
(``inferlab.serving.reservation``):

- ``max_length``, ``power_of_two``, ``exact``: one contiguous region per request, reserved at
  admission for its longest length (``longest_tokens``) rounded as the scheme says, placed
  first fit, so freed regions leave holes (external fragmentation);
- ``paged``: ``block_size``-token blocks taken one at a time as the sequence grows (vLLM), an
  admission leaving ``watermark`` of the blocks free (vLLM's default is 1%).

The runner runs no model: it only records, at every step while some request is waiting (the
pool, not the trace, limits the batch), where the pool's slots are: token states (real K/V),
reserved (slots a request will fill later), internal fragmentation (slots a request holds and
will never fill) and free slots the next waiting request cannot use (external fragmentation, or
simply too few).

Also here: ``sharing_saving``, the memory that copy-on-write saves when n parallel samples share
their prompt's blocks, and ``prefix_sharing_experiment``, the prefill that prefix caching
(``inferlab.serving.prefix_cache``) saves when prompts start with shared system prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from inferlab.serving.paged_cache import BlockAllocator, BlockManager, BlockTable, blocks_for
from inferlab.serving.config import BLOCK_SIZE, ServingConfig
from inferlab.serving.interfaces import Runner
from inferlab.serving.prefix_cache import PrefixCache
from inferlab.serving.loop import StepLoop, VirtualClock
from inferlab.serving.reservation import RESERVATIONS, ContiguousManager, slots_held
from inferlab.serving.scheduler import Scheduler
from inferlab.sim.workloads import trace_requests

PAPER_WATERMARK = 0.01  # vLLM's default share of blocks an admission leaves free


@dataclass(frozen=True)
class MemoryUse:
    """Averages over the steps during which some request was waiting (the pool was the limit).

    If the pool never limited the batch (no request ever waited), the averages are all 0:
    serve a longer trace or use a smaller pool.
    """

    reservation: str
    token_fraction: float       # slots holding real token states / capacity
    reserved_fraction: float    # reserved for tokens not generated yet
    internal_fraction: float    # held but never to be filled
    free_fraction: float        # free, yet the next waiting request did not fit
    mean_running: float         # sequences in the batch
    steps: int
    preemptions: int
    prompt_tokens: int = 0      # the trace's prompt tokens: what one prefill each would compute
    prefill_tokens: int = 0     # prompt work the run computed, recomputes included
    window_tokens: int = 0      # tokens produced over the steps averaged (one a row)
    window_s: float = 0.0       # their modelled seconds (0 without a step model)
    recompute_s: float = 0.0    # of which forwards that recomputed a preempted request

    @property
    def recomputed_tokens(self) -> int:
        """Prompt work done again after preemptions: computed minus the prompts' tokens."""
        return self.prefill_tokens - self.prompt_tokens

    @property
    def tokens_per_s(self) -> float:
        """Tokens produced per modelled second over the steps averaged (prefills, recomputes
        and decodes all priced); 0 without a step model."""
        return self.window_tokens / self.window_s if self.window_s else 0.0


class MemoryRecorder(Runner):
    """A runner that runs no model: every step it records where the pool's slots are."""

    def __init__(self, scheduler: Scheduler, capacity: int, step_model=None):
        self.scheduler, self.capacity, self.step_model = scheduler, capacity, step_model
        self.sums = dict(tokens=0.0, reserved=0.0, internal=0.0, free=0.0, running=0.0)
        self.counted = self.steps = 0
        self.prefill_tokens = self.window_tokens = 0
        self.window_s = self.recompute_s = 0.0
        self._prefilled: set[int] = set()

    def forward(self, rows) -> list[int]:
        return [1] * len(rows)

    def record(self, iteration) -> None:
        """Called once per step, after the step's allocations (the loop's ``on_iteration``)."""
        self.steps += 1
        self.prefill_tokens += sum(r.new for r in iteration.prefill_rows)
        again = {r.seq_id for r in iteration.prefill_rows if r.seq_id in self._prefilled}
        self._prefilled.update(r.seq_id for r in iteration.prefill_rows)
        sched = self.scheduler
        if not sched.waiting:  # the trace, not the pool, limits the batch
            return
        self.window_tokens += len(iteration.rows)  # every row, prefill or decode, makes a token
        if self.step_model is not None:  # each forward priced as it ran
            for f in iteration.forwards:
                seconds = self.step_model.rows_s([(r.new, r.cached) for r in f.rows])
                self.window_s += seconds
                if f.rows and all(r.seq_id in again and r.prefill for r in f.rows):
                    self.recompute_s += seconds  # a forward that only recomputed
        ahead = sched.memory.reserves_ahead
        held = tokens = final = 0
        for seq in sched.running:
            now = seq.table.num_tokens
            tokens += now
            final += seq.max_tokens if ahead else now  # paging reserves nothing ahead
            held += seq.table.slots_held
        c = self.capacity
        self.sums["tokens"] += tokens / c
        self.sums["reserved"] += (final - tokens) / c
        self.sums["internal"] += (held - final) / c
        self.sums["free"] += (c - held) / c
        self.sums["running"] += len(sched.running)
        self.counted += 1


def simulate_memory(rows, reservation: str, capacity: int, max_len: int = 2048,
                    block_size: int = BLOCK_SIZE, slots_fn: Callable[..., int] = slots_held,
                    watermark: float = PAPER_WATERMARK, step_model=None) -> MemoryUse:
    """Serve ``rows`` (objects with ``prompt_len``, ``output_len``), all waiting at time 0.

    Each step every running request produces one token (a newly admitted one its first, from
    its prefill); finished requests free their memory; waiting requests are admitted first come,
    first served while they fit. Under paging a request that needs a block when none is free
    preempts the latest-arrived running request, which later recomputes its tokens (Kwon et al.
    2023, Sec. 4.5). ``slots_fn`` (``slots_held``'s signature) sizes the contiguous regions.

    Every prefill token the run computes is counted (``prefill_tokens``; a preempted request's
    recompute included, so ``recomputed_tokens`` is the work preemption cost). Given a
    ``step_model`` (``inferlab.analysis.step_time.StepModel``), every forward of the steps
    averaged is priced as it ran, prefills and recomputes as well as decodes, so
    ``tokens_per_s`` compares policies on the same terms.
    """
    if reservation not in RESERVATIONS:
        raise ValueError(f"unknown reservation {reservation!r}; choose one of {RESERVATIONS}")
    requests = trace_requests(rows, [0.0] * len(rows))
    config = ServingConfig(block_size=block_size, max_batch=max(1, len(requests)),
                           watermark=watermark if reservation == "paged" else 0.0)
    if reservation == "paged":
        memory = BlockManager(capacity // block_size, block_size, watermark)
    else:
        memory = ContiguousManager(capacity, reservation, max_len, slots_fn)
    sched = Scheduler(config, memory)
    recorder = MemoryRecorder(sched, capacity, step_model)
    StepLoop(sched, recorder, VirtualClock(), recorder.record).run(requests)
    s, n = recorder.sums, max(recorder.counted, 1)
    return MemoryUse(reservation, s["tokens"] / n, s["reserved"] / n, s["internal"] / n,
                     s["free"] / n, s["running"] / n, recorder.steps, sched.num_preemptions,
                     sum(r.prompt_len for r in rows), recorder.prefill_tokens,
                     recorder.window_tokens, recorder.window_s, recorder.recompute_s)


def sharing_saving(prompt_len: int, output_len: int, n_samples: int,
                   block_size: int = BLOCK_SIZE) -> float:
    """Fraction of KV memory copy-on-write saves when ``n_samples`` samples share one prompt.

    Builds the tables with the real allocator: one prefilled prompt forked ``n_samples - 1``
    times, each sample then generating ``output_len`` tokens, against ``n_samples`` separate
    copies. Memory is averaged over the decode steps (blocks in use after each step).
    """
    if n_samples < 1 or prompt_len < 1 or output_len < 1:
        raise ValueError("need n_samples, prompt_len and output_len >= 1")
    blocks = n_samples * (blocks_for(prompt_len + output_len, block_size) + 1)
    used = {}
    for shared in (False, True):
        alloc = BlockAllocator(blocks)
        first = BlockTable(alloc, block_size)
        first.append(prompt_len)
        tables = [first]
        for _ in range(n_samples - 1):
            if shared:
                tables.append(first.fork())
            else:
                tables.append(BlockTable(alloc, block_size))
                tables[-1].append(prompt_len)
        total = 0
        for _ in range(output_len):
            for t in tables:
                t.append(1)
            alloc.take_copies()  # a real engine copies the K/V here
            total += alloc.num_blocks - alloc.num_free
        used[shared] = total
    return 1 - used[True] / used[False]


def prefix_sharing_experiment(prompt_lens, system_len: int, n_system_prompts: int = 1,
                              num_blocks: int = 4096, block_size: int = 16, seed: int = 0,
                              vocab: int = 32000, hash_fn=None) -> dict:
    """Serve prompts that each start with one of ``n_system_prompts`` shared system prompts.

    Each request's prompt is a system prompt of ``system_len`` tokens followed by its own
    ``prompt_len`` random tokens. Requests run one after another and free their tables; the
    prefix cache keeps the full blocks. Returns the block hit rate and the share of prompt
    tokens that needed no prefill.
    """
    import random

    rng = random.Random(seed)
    systems = [[rng.randrange(vocab) for _ in range(system_len)] for _ in range(n_system_prompts)]
    alloc = BlockAllocator(num_blocks)
    cache = PrefixCache(alloc, block_size, hash_fn)
    total = saved = 0
    for n in prompt_lens:
        tokens = rng.choice(systems) + [rng.randrange(vocab) for _ in range(n)]
        table, cached = cache.allocate_prompt(tokens)
        cache.insert(table, tokens)  # after the prefill has written the new blocks' K/V
        total, saved = total + len(tokens), saved + cached
        table.free()
    return dict(hit_rate=cache.hit_rate, prefill_saved=saved / total, requests=len(prompt_lens),
                cached_blocks=len(cache))


def slower_attention(step_model, slowdown: float):
    """``step_model`` with every attention byte costing ``slowdown`` times as long: a paged
    kernel that reads its blocks ``slowdown`` times slower than a contiguous one (Kwon et al.
    2023 measured 1.2-1.26 for decode, Fig. 18a). Only the memory side moves; FLOPs do not."""
    from dataclasses import replace

    a = step_model.attention
    return replace(step_model, attention=replace(a, kv_bytes_per_token=slowdown * a.kv_bytes_per_token))
