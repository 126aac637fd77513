"""Where reserved KV memory goes: a small serving simulation under four reservation policies.

Kwon et al. 2023 (Fig. 2) measure how much of the KV-cache memory of earlier systems holds real
token states: 20.4% to 38.2%, against 96.3% in vLLM. This module reproduces the experiment in
miniature so a reader can see where the rest goes. A pool of ``capacity`` token slots serves a
backlog of requests from a trace, one token per running request per step, under a policy that
decides how many slots a request holds:

- ``max_length``: one contiguous region of ``max_len`` slots, the longest sequence the model
  allows (Orca-Max in the paper);
- ``power_of_two``: a contiguous region of the next power of two at or above the request's
  final length, as if the system knew it to within a factor of two (Orca-Pow2);
- ``exact``: a contiguous region of exactly its final length, which needs an oracle (Orca-Oracle);
- ``paged``: ``block_size``-token blocks taken one at a time as the sequence grows
  (vLLM), simulated with the real ``inferlab.serving.block_manager`` allocator.

Contiguous regions are placed first-fit, so freed regions leave holes (external fragmentation).
Every step the pool's slots are split into four kinds: token states (real K/V), reserved (slots a
request will fill later), internal fragmentation (slots a request holds and will never fill) and
free slots that the next waiting request cannot use (external fragmentation, or simply too few).

Also here: ``sharing_saving``, the memory that copy-on-write saves when n parallel samples share
their prompt's blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from inferlab.serving.block_manager import BlockAllocator, BlockTable

POLICIES = ("max_length", "power_of_two", "exact", "paged")


def slots_held(policy: str, prompt_len: int, output_len: int, tokens_so_far: int,
               max_len: int = 2048, block_size: int = 16) -> int:
    """KV slots a request holds under ``policy`` once it has ``tokens_so_far`` tokens cached.

    ``tokens_so_far`` runs from ``prompt_len`` (just prefilled) to ``prompt_len + output_len``.
    The three contiguous policies reserve everything at admission; paging holds whole blocks.
    """
    final = prompt_len + output_len
    if not 0 < prompt_len <= tokens_so_far <= final <= max_len:
        raise ValueError(f"need 0 < prompt_len <= tokens_so_far <= prompt_len + output_len <= "
                         f"max_len; got {prompt_len}, {tokens_so_far}, {final}, {max_len}")
    if policy == "max_length":
        return max_len
    if policy == "power_of_two":
        return min(max_len, 1 << (final - 1).bit_length())
    if policy == "exact":
        return final
    if policy == "paged":
        return -(-tokens_so_far // block_size) * block_size
    raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")


class _FirstFit:
    """A contiguous allocator over [0, capacity): sorted free holes, first fit, merge on free."""

    def __init__(self, capacity: int):
        self.holes = [(0, capacity)]  # (start, length), sorted by start

    def allocate(self, n: int) -> int | None:
        for i, (start, length) in enumerate(self.holes):
            if length >= n:
                self.holes[i:i + 1] = [(start + n, length - n)] if length > n else []
                return start
        return None

    def free(self, start: int, n: int) -> None:
        self.holes.append((start, n))
        self.holes.sort()
        merged = [self.holes[0]]
        for s, n in self.holes[1:]:
            ps, pn = merged[-1]
            merged[-1:] = [(ps, pn + n)] if ps + pn == s else [(ps, pn), (s, n)]
        self.holes = merged


@dataclass(eq=False)  # identity, not field equality: two requests may look alike
class _Running:
    prompt: int       # tokens cached at admission (a recomputed request's prompt includes its output so far)
    output: int       # tokens still to generate
    generated: int = 0
    region: tuple[int, int] | None = None  # contiguous policies: (start, length)
    table: BlockTable | None = None        # paging


@dataclass(frozen=True)
class SimResult:
    """Averages over the steps during which some request was waiting (the pool was the limit).

    If the pool never limited the batch (no request ever waited), the averages are all 0:
    serve a longer trace or use a smaller pool.
    """

    policy: str
    token_fraction: float       # slots holding real token states / capacity
    reserved_fraction: float    # reserved for tokens not generated yet
    internal_fraction: float    # held but never to be filled
    free_fraction: float        # free, yet the next waiting request did not fit
    mean_running: float         # sequences in the batch
    steps: int
    preemptions: int


def simulate(rows, policy: str, capacity: int, max_len: int = 2048, block_size: int = 16,
             slots_fn: Callable[..., int] = slots_held, watermark: float = 0.01) -> SimResult:
    """Serve ``rows`` (objects with ``prompt_len``, ``output_len``), all waiting at time 0.

    Each step admits waiting requests first come, first served while they fit, then every
    running request generates one token; finished requests free their memory. Under paging a
    request that needs a block when none is free preempts the most recently admitted request,
    which later recomputes its tokens (Kwon et al. 2023, Sec. 4.5). Paging admits a request only
    if ``watermark`` of the blocks stay free afterwards (vLLM's default is 1%), so that running
    requests have room to grow and preemption stays rare.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")
    waiting = [_Running(r.prompt_len, r.output_len) for r in rows]
    waiting.reverse()  # pop() takes the oldest
    running: list[_Running] = []
    paged = policy == "paged"
    alloc = BlockAllocator(capacity // block_size) if paged else None
    fit = None if paged else _FirstFit(capacity)
    sums = dict(tokens=0.0, reserved=0.0, internal=0.0, free=0.0, running=0.0)
    steps = counted = preemptions = 0

    def admit(req: _Running) -> bool:
        if paged:
            table = BlockTable(alloc, block_size)
            spare = int(watermark * alloc.num_blocks)
            if not alloc.can_allocate(table.blocks_needed(req.prompt) + spare):
                return False
            table.append(req.prompt)
            req.table = table
            return True
        n = slots_fn(policy, req.prompt, req.output, req.prompt, max_len, block_size)
        start = fit.allocate(n)
        if start is None:
            return False
        req.region = (start, n)
        return True

    while waiting or running:
        while waiting and admit(waiting[-1]):
            running.append(waiting.pop())
        if not running:
            raise ValueError(f"a request needs more than the whole pool of {capacity} slots")
        if waiting:  # the pool, not the trace, limits the batch: record where memory goes
            held = tokens = final = 0
            for r in running:
                now = r.prompt + r.generated
                tokens += now
                final += now if paged else r.prompt + r.output  # paging reserves nothing ahead
                held += len(r.table.blocks) * block_size if paged else r.region[1]
            sums["tokens"] += tokens / capacity
            sums["reserved"] += (final - tokens) / capacity
            sums["internal"] += (held - final) / capacity
            sums["free"] += (capacity - held) / capacity
            sums["running"] += len(running)
            counted += 1
        for r in list(running):  # one decode step: the newest token's K/V is written
            if r not in running:
                continue  # preempted earlier in this step
            if paged:
                while not r.table.can_append(1):
                    victim = running.pop()  # the latest admitted
                    victim.table.free()
                    waiting.append(_Running(victim.prompt + victim.generated,
                                            victim.output - victim.generated))
                    preemptions += 1
                    if victim is r:
                        break
                if r not in running:
                    continue
                r.table.append(1)
            r.generated += 1
        for r in [r for r in running if r.generated >= r.output]:
            running.remove(r)
            if paged:
                r.table.free()
            else:
                fit.free(*r.region)
        steps += 1
    n = max(counted, 1)
    return SimResult(policy, sums["tokens"] / n, sums["reserved"] / n, sums["internal"] / n,
                     sums["free"] / n, sums["running"] / n, steps, preemptions)


def sharing_saving(prompt_len: int, output_len: int, n_samples: int, block_size: int = 16) -> float:
    """Fraction of KV memory copy-on-write saves when ``n_samples`` samples share one prompt.

    Builds the tables with the real allocator: one prefilled prompt forked ``n_samples - 1``
    times, each sample then generating ``output_len`` tokens, against ``n_samples`` separate
    copies. Memory is averaged over the decode steps (blocks in use after each step).
    """
    if n_samples < 1 or prompt_len < 1 or output_len < 1:
        raise ValueError("need n_samples, prompt_len and output_len >= 1")
    blocks = n_samples * (-(-(prompt_len + output_len) // block_size) + 1)
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


