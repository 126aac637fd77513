"""Routing multi-turn chats across replicas: round-robin against longest cached prefix.

Each replica keeps a prefix cache of ``capacity`` KV blocks, least recently used evicted first
(Chapter 3's prefix cache, by block). A chat session's every turn resends the whole conversation
so far plus a new message, so its prompt extends the previous one; all sessions also start with
one shared system prompt. A request *hits* the longest run of its leading blocks that its
replica holds (a block is only reusable when every block before it is: the chained hash of
Chapter 3); the rest is prefilled and cached.

Routers: ``round_robin`` ignores the caches; ``prefix_aware`` sends each request to the replica
holding its longest cached prefix among those not already ahead in load, breaking ties by the
fewest requests so far: the two signals cache-aware routers weigh (SGLang's router, Dynamo's KV
router), in their simplest form. ``simulate``
returns the share of prompt tokens served from cache, the prefill tokens computed, the load
of each replica (so that a router that wins hits by piling work onto one replica shows it) and
each request's cached and new tokens; ``priced`` turns those into time and dollars with the
course's one step-time model, inside a batched engine: a busy replica packs the uncached tokens
of its requests into steps of a token budget (chunked prefill, Chapter 7), and each step reads
the weights once for all its rows.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ChatWorkload:
    sessions: int = 64
    turns: int = 6
    system_blocks: int = 8      # the shared system prompt, in blocks
    turn_blocks: int = 4        # blocks each turn adds (the user's message and the reply)
    block_size: int = 16
    seed: int = 0

    def requests(self) -> list[tuple[int, int]]:
        """(session, turn) in arrival order: sessions interleaved at random, turns in order."""
        rng = random.Random(self.seed)
        pending = {s: 0 for s in range(self.sessions)}
        out = []
        while pending:
            s = rng.choice(sorted(pending))
            out.append((s, pending[s]))
            pending[s] += 1
            if pending[s] == self.turns:
                del pending[s]
        return out

    def blocks(self, session: int, turn: int) -> list[tuple]:
        """The prompt's block keys: the shared system blocks, then this session's blocks."""
        return [("system", i) for i in range(self.system_blocks)] + \
            [(session, i) for i in range((turn + 1) * self.turn_blocks)]


class Replica:
    """A prefix cache of ``capacity`` blocks with least-recently-used eviction."""

    def __init__(self, capacity: int):
        self.capacity, self.cache, self.requests = capacity, OrderedDict(), 0

    def cached_prefix(self, blocks: list) -> int:
        n = 0
        for b in blocks:
            if b not in self.cache:
                break
            n += 1
        return n

    def serve(self, blocks: list) -> int:
        """Serve a prompt: returns the blocks found; touches them and caches the rest."""
        hit = self.cached_prefix(blocks)
        self.requests += 1
        for b in blocks:
            self.cache[b] = True
            self.cache.move_to_end(b)
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)
        return hit


def simulate(workload: ChatWorkload, replicas: int, capacity: int, router: str,
             balance_slack: int = 2) -> dict:
    """Run ``workload`` through ``replicas`` replicas of ``capacity`` blocks with ``router``.
    ``prefix_aware`` only considers replicas within ``balance_slack`` requests of the least
    loaded one (without such a bound every request follows the shared system prompt to one
    replica)."""
    pool = [Replica(capacity) for _ in range(replicas)]
    hit = total = 0
    served = []  # (replica, cached tokens, new tokens) per request, in arrival order
    for i, (session, turn) in enumerate(workload.requests()):
        blocks = workload.blocks(session, turn)
        if router == "round_robin":
            r = pool[i % replicas]
        elif router == "prefix_aware":  # longest cached prefix among the not-overloaded
            least = min(p.requests for p in pool)
            fair = [p for p in pool if p.requests <= least + balance_slack]
            r = max(fair, key=lambda p: (p.cached_prefix(blocks), -p.requests))
        else:
            raise ValueError(f"router must be round_robin or prefix_aware, got {router!r}")
        found = r.serve(blocks)
        served.append((pool.index(r), found * workload.block_size,
                       (len(blocks) - found) * workload.block_size))
        hit += found
        total += len(blocks)
    loads = [p.requests for p in pool]
    return {"router": router, "hit_rate": hit / total,
            "prefill_tokens": (total - hit) * workload.block_size,
            "prompt_tokens": total * workload.block_size,
            "load_imbalance": max(loads) / (sum(loads) / len(loads)), "loads": loads,
            "requests": served}


def batched_steps(requests: list[tuple[int, int]], token_budget: int) -> list[list[tuple]]:
    """A busy replica's prefill work as an engine with a token budget runs it: the requests'
    ``(cached, new)`` tokens, in arrival order, packed into steps of at most ``token_budget``
    new tokens; a request that does not fit what is left of a step is cut, and its next chunk
    starts the following step over what is cached by then. Returns each step's rows
    ``(new tokens, cached tokens)``."""
    steps, rows, room = [], [], token_budget
    for cached, new in requests:
        while new:
            take = min(new, room)
            rows.append((take, cached))
            cached, new, room = cached + take, new - take, room - take
            if room == 0:
                steps.append(rows)
                rows, room = [], token_budget
    if rows:
        steps.append(rows)
    return steps


def priced(result: dict, model, usd_per_hour: float, token_budget: int = 2048) -> dict:
    """Time and money of a ``simulate`` result on ``model`` (a ``step_time.StepModel``).

    GPU time is priced inside a batched engine: each replica's requests are packed into steps
    of ``token_budget`` tokens (``batched_steps``), each step one forward over its rows
    (``StepModel.rows_s``), so the weights are read once per step and shared by every request
    in it, as a busy engine shares them. At ``usd_per_hour`` per device the summed steps give
    dollars per million prompt tokens. ``gpu_s_alone`` prices the same requests as prefills of
    their own, one forward each (what an idle replica spends): the weight read is then paid per
    request. ``ttft_s`` is that lone forward: the first token's time on an idle replica, no
    queueing, which isolates what a cache hit saves a user.
    """
    requests = result["requests"]
    ttft = np.array([model.rows_s([(new, cached)]) for _, cached, new in requests])
    replicas = sorted({r for r, _, _ in requests})
    gpu_s = sum(model.rows_s(rows) for r in replicas for rows in batched_steps(
        [(cached, new) for rr, cached, new in requests if rr == r], token_budget))
    return {"router": result["router"], "hit_rate": result["hit_rate"],
            "token_budget": token_budget,
            "ttft_mean_s": float(ttft.mean()), "ttft_p90_s": float(np.percentile(ttft, 90)),
            "gpu_s": float(gpu_s), "gpu_s_alone": float(ttft.sum()),
            "usd_per_m_input": usd_per_hour / 3600 * gpu_s / result["prompt_tokens"] * 1e6,
            "ttft_s": ttft}
