"""The engine with the model: ``Engine(model, config)`` wires it, ``serve(model, requests)`` runs it.

``Engine`` is the serving loop (``inferlab.serving.loop.StepLoop``) assembled, in this one
place, over the model's parts, all reading one ``ServingConfig``:

- the paged KV pool (``inferlab.serving.paged_cache``, or its int8 form), whose blocks the
  memory manager there hands out (with ``prefix_cache``, the prefix-caching one of
  ``inferlab.serving.prefix_cache``);
- the ``Scheduler`` (``inferlab.serving.scheduler``), which decides every iteration who
  prefills, who decodes and who is preempted, and is the only code that changes a sequence;
- the ``ModelRunner`` (``inferlab.serving.paged_attention``), which runs those decisions on
  the model over the pool and samples each row's next token;
- a ``WallClock``;
- with ``config.overlap``, one step of lookahead (``OverlapEngine``, ``inferlab.serving.overlap``):
  each step is scheduled and prepared while the step before runs its forward passes.

An offline run is one call: ``serve`` (or ``Engine.run``) serves a list of requests to the end
and returns a ``Run``. The online engine (``inferlab.serving.online``) adds to one ``Engine``
only its thread, its inbox and its streams; the discrete-event simulator
(``inferlab.sim.simulator``) runs the same loop with modelled step times and returns a ``Run``
of the same shape.

Invalid requests (an empty prompt, token ids that are not integers in the vocabulary, a prompt
longer than the model's context, max_new_tokens that is not a positive integer, a temperature
outside [0, 2], a seed outside 64-bit integers, ...: ``inferlab.validation``, the check
the online engine runs too) are refused one by one before anything runs: each gets a
``Result`` with no tokens, no timing and ``error`` saying why ("request 3 refused: ..."), and
the others still complete. When the config leaves ``num_blocks`` unset, ``serve`` sizes the
pool from the requests it accepts: room for ``max_batch`` copies of the longest, and never more
than the device's free memory allows (``inferlab.serving.paged_cache.pool_blocks_for``).
"""

from __future__ import annotations

from typing import Iterable

from inferlab.serving.config import ServingConfig
from inferlab.serving.loop import StepLoop, WallClock
from inferlab.serving.overlap import LookaheadLoop
from inferlab.serving.paged_cache import POOL_MEMORY_FRACTION, BlockManager, pool_blocks_for
from inferlab.serving.kv_tier import tier_for
from inferlab.serving.paged_int8 import pool_for
from inferlab.serving.prefix_cache import PrefixCachingBlockManager
from inferlab.serving.request import Request
from inferlab.serving.run import Run
from inferlab.serving.paged_attention import ModelRunner
from inferlab.serving.scheduler import Scheduler
from inferlab.validation import InvalidRequestError, validate_request


def refusals(requests: list[Request], model_config, memory=None) -> dict[int, str]:
    """The index and reason of every request that cannot run (``validate_request``; with
    ``memory``, the engine's memory manager, also those that could never fit its pool)."""
    refused = {}
    for i, r in enumerate(requests):
        try:
            validate_request(r, model_config, memory)
        except InvalidRequestError as error:
            name = r.request_id if r.request_id is not None else i
            refused[i] = f"request {name} refused: {error}"
    return refused


def pool_blocks(model, requests: list[Request], config: ServingConfig,
                memory_fraction: float = POOL_MEMORY_FRACTION) -> int:
    """Blocks for ``max_batch`` copies of the longest request that can run, so that no
    preemption is needed, but at most what ``memory_fraction`` of the device's free memory
    holds (requests that need more than that are then refused): ``pool_blocks_for``."""
    refused = refusals(requests, model.config)
    longest = max((r.max_tokens for i, r in enumerate(requests) if i not in refused), default=1)
    return pool_blocks_for(model, longest, config, memory_fraction)


class Engine(StepLoop):
    """A model, its paged KV pool of ``config.num_blocks`` blocks, a scheduler and the loop.

    ``prefix_cache=True`` admits through ``PrefixCachingBlockManager`` (it needs chunked
    prefill: a prompt then starts after its cached blocks). The hooks are the loop's
    (``on_token``, ``on_failure``, ``on_iteration``). ``run`` may be called again; every block
    is free between runs.
    """

    def __new__(cls, model, config: ServingConfig, *args, **kwargs):
        """``config.overlap`` makes it an ``OverlapEngine``: the same parts, one step ahead."""
        if config.overlap and cls is Engine:
            cls = OverlapEngine
        return super().__new__(cls)

    def __init__(self, model, config: ServingConfig, prefix_cache: bool = False, **hooks):
        if config.num_blocks is None:
            raise ValueError("Engine needs config.num_blocks; serve() sizes the pool for you")
        if prefix_cache and not config.chunked:
            raise ValueError("prefix caching needs chunked prefill (config.token_budget and "
                             "policy='chunked'): a prompt then starts after its cached blocks")
        if config.kv_tier_blocks and not prefix_cache:
            raise ValueError("a KV tier keeps evicted prefix-cache blocks: it needs "
                             "prefix_cache=True")
        memory = PrefixCachingBlockManager if prefix_cache else BlockManager
        self.model, self.config = model, config
        self.cache = pool_for(model, config, memory_class=memory)
        self.tier = None
        if config.kv_tier_blocks:  # evicted prefix blocks go down to it, hits come back
            self.tier = tier_for(self.cache, config.kv_tier_blocks)
            self.cache.memory.cache.tier, self.cache.memory.cache.pool = self.tier, self.cache
        super().__init__(Scheduler(config, self.cache.memory), ModelRunner(model, self.cache),
                         WallClock(), **hooks)

    @property
    def num_blocks(self) -> int:
        return self.cache.num_blocks

    def run(self, requests: Iterable[Request]) -> Run:
        """Serve ``requests``: a ``Run`` with one ``Result`` each, in the order given (the ones
        that cannot run refused, with why)."""
        requests = list(requests)
        run = super().run(requests, refusals(requests, self.model.config, self.cache.memory))
        leaked = self.num_blocks - self.cache.memory.num_free - self.cache.memory.num_cached_only
        if leaked:
            raise RuntimeError(f"{leaked} KV blocks are still allocated after every request "
                               "finished: the policy leaked blocks")
        return run


class OverlapEngine(LookaheadLoop, Engine):
    """An ``Engine`` whose loop schedules and prepares each step while the one before runs
    (``inferlab.serving.overlap``); ``Engine(model, config)`` makes one when
    ``config.overlap``."""

    def run(self, requests: Iterable[Request]) -> Run:
        try:
            return super().run(requests)
        finally:
            self.close()  # the forward thread: a later run starts it again


def serve(model, requests: Iterable[Request], config: ServingConfig | None = None) -> Run:
    """Generate for every request as they arrive (greedily, or at each request's temperature
    with its seed); return their tokens and timings, and the refusals (``Result.error``).

    ``config`` defaults to ``ServingConfig()`` (continuous batching, 32 sequences at once,
    blocks of 16 tokens). Without ``num_blocks`` the pool is sized by ``pool_blocks``; pass
    fewer blocks to serve under memory pressure.
    """
    requests = list(requests)
    config = config or ServingConfig()
    if config.num_blocks is None:
        config = config.replace(num_blocks=pool_blocks(model, requests, config))
    return Engine(model, config).run(requests)
