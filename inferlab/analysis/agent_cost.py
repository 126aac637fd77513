"""What an agent's task costs: many calls, each sending again a context that keeps growing.

An agent works by calling the model again and again: call i sends the system prompt and the
task, everything the model wrote before and every tool result it got back, plus the new tool
result, and generates the next step. Its input grows by one output and one tool result per
call, so over N calls the input tokens grow with N squared while the output grows with N.
A per-token price therefore says little; the price of the task is what matters.

Most of each call's input is the previous call's input. A server with prefix caching
(``inferlab.serving.prefix_cache``: K/V blocks named by a chained hash of their tokens) keeps
those blocks and prefills only the new tokens, and API providers charge such cached input
tokens at a discount (``data/api_prices_2026.csv``). ``agent_calls`` runs a conversation's prompts,
as token ids, through a ``PrefixCache`` to count the cached tokens of each call (whole blocks
only, and never the last prompt token: see ``PrefixCache.allocate_prompt``); ``task_cost``
prices the calls with or without the cache.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from inferlab.analysis.prices import TokenPrice
from inferlab.serving.paged_cache import BlockAllocator
from inferlab.serving.config import BLOCK_SIZE
from inferlab.serving.prefix_cache import PrefixCache


@dataclass(frozen=True)
class Call:
    """One model call of a task: its prompt, how much of it was cached, and its output."""

    prompt: int        # input tokens sent
    cached: int        # of which found in the prefix cache
    output: int        # tokens generated

    @property
    def uncached(self) -> int:
        return self.prompt - self.cached


def agent_calls(n_calls: int, first_prompt: int, tool_tokens: int, output: int,
                block_size: int = BLOCK_SIZE, seed: int = 0) -> list[Call]:
    """The calls of a task: call 1 sends ``first_prompt`` tokens; each later call sends the
    previous prompt, the previous output and ``tool_tokens`` new tokens. Every call generates
    ``output`` tokens. Cached tokens are counted by a ``PrefixCache`` that keeps every block
    of each call's prompt and output once they are computed."""
    if n_calls < 1 or first_prompt < 1 or output < 1 or tool_tokens < 0:
        raise ValueError("need n_calls, first_prompt and output >= 1 and tool_tokens >= 0")
    rng = random.Random(seed)
    new = lambda n: [rng.randrange(32000) for _ in range(n)]  # noqa: E731
    longest = first_prompt + (n_calls - 1) * (output + tool_tokens) + output
    cache = PrefixCache(BlockAllocator(2 * (longest // block_size + 2)), block_size)
    prompt, calls = new(first_prompt), []
    for i in range(n_calls):
        if i:
            prompt = prompt + generated + new(tool_tokens)
        table, cached = cache.allocate_prompt(prompt)
        generated = new(output)
        table.append(output - 1)               # the last output token is never fed back
        cache.insert(table, prompt + generated[:-1])
        table.free()
        calls.append(Call(len(prompt), cached, output))
    return calls


@dataclass(frozen=True)
class TaskCost:
    """Tokens and dollars of one task."""

    calls: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    usd: float             # with the prefix cache's discount
    usd_uncached: float    # every input token at the full price

    @property
    def saving(self) -> float:
        """Share of the uncached price that the cache saves."""
        return 1 - self.usd / self.usd_uncached


def task_cost(calls: list[Call], price: TokenPrice) -> TaskCost:
    """Price ``calls`` at ``price``. With the cache, a cached input token costs the cached
    rate and every other input token the cache-write rate (it is stored for the next call);
    without, every input token costs the input rate."""
    inp = sum(c.prompt for c in calls)
    cached = sum(c.cached for c in calls)
    out = sum(c.output for c in calls)
    per = 1e-6
    usd = ((inp - cached) * price.usd_per_m_cache_write + cached * price.usd_per_m_cached_input
           + out * price.usd_per_m_output) * per
    full = (inp * price.usd_per_m_input + out * price.usd_per_m_output) * per
    return TaskCost(len(calls), inp, cached, out, usd, full)
