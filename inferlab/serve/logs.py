"""What the server tells its operator in its log: a startup banner and periodic stats.

vLLM's server does both: it logs its configuration when it starts and, every few seconds while
it serves, a line of throughput, queue and KV-cache figures (``--disable-log-stats`` turns that
off). The course server logs the same kind of lines to the ``inferlab.serve`` logger:

- ``banner(engine, model_name)``: the model, its context length, the KV pool (blocks, tokens,
  bytes, dtype), the batch limits and the scheduling policy, the device;
- ``StatsLogger``: every ``interval_s`` seconds while anything ran, requests running and
  waiting, KV blocks in use, and prompt and generated tokens per second over the interval
  (counted when each request ends, from the counters ``/metrics`` exports).

uvicorn writes its own access log, one line per request.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("inferlab.serve")


def banner(engine, model_name: str) -> str:
    """One paragraph on what this server runs: model, context, KV pool, limits, device."""
    c, sc, cache = engine.model.config, engine.config, engine.cache
    budget = f", {sc.token_budget}-token steps" if sc.token_budget else ""
    return (f"serving {model_name!r}: {c.n_layers} layers, context {c.max_seq_len} tokens, "
            f"vocabulary {c.vocab_size}; KV cache {cache.num_blocks} blocks x "
            f"{cache.block_size} tokens = {cache.num_blocks * cache.block_size} tokens "
            f"({cache.nbytes / 2**20:.1f} MiB of {str(cache.k.dtype).removeprefix('torch.')}); "
            f"up to {sc.max_batch} sequences at once, {sc.policy} batching{budget}; "
            f"on {engine.model.device}")


class StatsLogger:
    """Logs a line of serving stats every ``interval_s`` seconds while the server is busy."""

    def __init__(self, engine, metrics, interval_s: float = 10.0):
        self.engine, self.metrics, self.interval_s = engine, metrics, interval_s
        self._last = (time.monotonic(), 0, 0)

    def line(self) -> str | None:
        """The stats since the last line; None if nothing ran or waited meanwhile."""
        now = time.monotonic()
        t, prompt, generated = self._last
        m, e = self.metrics, self.engine
        dt = max(now - t, 1e-9)
        self._last = (now, m.num_prompt_tokens, m.num_generation_tokens)
        busy = e.num_running or e.num_waiting or m.num_generation_tokens > generated
        if not busy:
            return None
        return (f"prompt {(m.num_prompt_tokens - prompt) / dt:.1f} tokens/s, generation "
                f"{(m.num_generation_tokens - generated) / dt:.1f} tokens/s (requests that "
                f"ended in the last {dt:.0f} s); running {e.num_running}, waiting "
                f"{e.num_waiting}; KV blocks in use {e.blocks_in_use}/{e.cache.num_blocks} "
                f"({e.blocks_in_use / e.cache.num_blocks:.0%})")

    async def run(self) -> None:
        """Log a line every interval, until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            text = self.line()
            if text is not None:
                log.info(text)
