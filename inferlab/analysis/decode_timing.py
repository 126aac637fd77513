"""What one generation step costs on this device, measured: cached decode and full recompute.

Chapter 2 compares two ways to get the next token's logits: run only the newest token against
a KV cache holding the tokens before it (``cached_step``), or run the whole sequence again
(``recompute_step``, what generation without a cache does at every step). Each returns a
function of no arguments, so two of them can be timed interleaved (``inferlab.timing.compare``);
``cached_step_seconds`` and ``recompute_step_seconds`` time one alone.
Chapter 1 places the cached step of batch 1 against the bandwidth floor. Both are timed with
``inferlab.timing.time_fn`` (``torch.utils.benchmark``), as medians, in steady state: the cached
step overwrites the same slot at every call.
"""

from __future__ import annotations

import torch

from inferlab.model.generate import decode_one_token, prefill
from inferlab.model.kv_cache import KVCache
from inferlab.timing import time_fn


def recompute_step(model, context: int, batch: int = 1):
    """A function of no arguments that gets the next token's logits by running all ``context``
    tokens through the model (what generation without a cache does at every step)."""
    tokens = torch.randint(0, model.config.vocab_size, (batch, context), device=model.device,
                           generator=torch.Generator(device=model.device).manual_seed(0))

    @torch.inference_mode()
    def step():
        return model(tokens)[:, -1]

    return step


def cached_step(model, context: int, batch: int = 1, cache_cls=KVCache):
    """A function of no arguments that decodes token ``context`` against a cache holding the
    ``context - 1`` before it (the same slot is overwritten every call: a steady state)."""
    if context < 2:
        raise ValueError(f"context must be at least 2 (a prompt and a new token), got {context}")
    gen = torch.Generator(device=model.device).manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (batch, context - 1), device=model.device,
                           generator=gen)
    cache = cache_cls.for_model(model, batch, max_len=context)
    token = prefill(model, prompt, cache).argmax(-1)

    def step():
        cache.length = context - 1
        return decode_one_token(model, token, cache)

    return step


def recompute_step_seconds(model, context: int, batch: int = 1, min_run_time: float = 0.2,
                           num_threads: int | None = None) -> float:
    """Median seconds of ``recompute_step``."""
    return time_fn(recompute_step(model, context, batch), min_run_time=min_run_time,
                   num_threads=num_threads).median_s


def cached_step_seconds(model, context: int, batch: int = 1, min_run_time: float = 0.2,
                        cache_cls=KVCache, num_threads: int | None = None) -> float:
    """Median seconds of ``cached_step``."""
    return time_fn(cached_step(model, context, batch, cache_cls), min_run_time=min_run_time,
                   num_threads=num_threads).median_s
