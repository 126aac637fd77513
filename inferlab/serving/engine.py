"""The serving engine's front door: ``serve(model, requests, config)`` returns a ``Run``.

Underneath, three parts with one job each, all reading one ``ServingConfig``:

- the ``Scheduler`` (``inferlab.serving.scheduler``) decides every iteration who prefills, who
  decodes and who is preempted, and is the only code that changes a sequence's state;
- the ``ModelRunner`` (``inferlab.serving.runner``) runs those decisions on the model over the
  paged KV cache (``inferlab.serving.paged_cache``) and samples each row's next token;
- the ``StepLoop`` (``inferlab.serving.loop``) is the loop between them; the discrete-event
  simulator (``inferlab.sim.simulator``) runs the same loop with modelled step times and
  returns a ``Run`` of the same shape.

A run goes through three layers: ``serve`` (the front door), ``Engine.run`` (the model, its pool
and a scheduler) and ``StepLoop.run`` (the steps).

Invalid requests (an empty prompt, token ids that are not integers in the vocabulary, a prompt
longer than the model's context, max_new_tokens that is not a positive integer, a temperature
outside [0, 2], a seed outside 64-bit integers, ...: ``validate_request``, the check the online
engine and the HTTP server run too) are refused one by one before anything runs: each gets a
``Result`` with no tokens, no timing and ``error`` saying why ("request 3 refused: ..."), and
the others still complete. When the
config leaves ``num_blocks`` unset, ``serve`` sizes the pool from the requests it accepts:
room for ``max_batch`` copies of the longest, and never more than the device's free memory
allows.
"""

from __future__ import annotations

from typing import Iterable

from inferlab.device import free_memory_bytes
from inferlab.serving.block_manager import blocks_for
from inferlab.serving.config import ServingConfig
from inferlab.serving.loop import Run, StepLoop, WallClock
from inferlab.serving.paged_cache import block_bytes
from inferlab.serving.paged_int8 import pool_for
from inferlab.serving.request import InvalidRequestError, Request, longest_tokens, validate_request
from inferlab.serving.runner import ModelRunner
from inferlab.serving.policies import resolve_policy
from inferlab.serving.scheduler import Scheduler

# Share of the device's free memory that serve() may give the KV pool when it sizes it.
POOL_MEMORY_FRACTION = 0.8


def refusals(requests: list[Request], model_config, num_blocks: int | None = None,
             block_size: int | None = None) -> dict[int, str]:
    """The index and reason of every request that cannot run (``validate_request``)."""
    refused = {}
    for i, r in enumerate(requests):
        try:
            validate_request(r, model_config, num_blocks, block_size)
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
    longest = max((longest_tokens(len(r.prompt), r.max_new_tokens)
                   for i, r in enumerate(requests) if i not in refused), default=1)
    return pool_blocks_for(model, longest, config, memory_fraction)


def pool_blocks_for(model, longest: int, config: ServingConfig,
                    memory_fraction: float = POOL_MEMORY_FRACTION) -> int:
    """The engine's one sizing rule: ``config.max_batch`` sequences of ``longest`` tokens, at
    most what ``memory_fraction`` of the device's free memory holds. A server that cannot know
    its requests passes the model's context length."""
    wanted = config.max_batch * blocks_for(longest, config.block_size)
    affordable = int(free_memory_bytes(model.device) * memory_fraction) // \
        block_bytes(model, config.block_size, config)
    return max(1, min(wanted, affordable))


class Engine:
    """A model, its paged KV cache of ``config.num_blocks`` blocks, and a scheduling policy.

    ``run`` may be called again; every block is free between runs.
    """

    def __init__(self, model, config: ServingConfig):
        if config.num_blocks is None:
            raise ValueError("Engine needs config.num_blocks; serve() sizes the pool for you")
        resolve_policy(config.policy)  # an unknown policy fails here, not halfway through
        self.model, self.config = model, config
        self.cache = pool_for(model, config)

    @property
    def num_blocks(self) -> int:
        return self.cache.num_blocks

    def run(self, requests: Iterable[Request]) -> Run:
        """Serve ``requests``: a ``Run`` with one ``Result`` each, in the order given."""
        requests = list(requests)
        refused = refusals(requests, self.model.config, self.num_blocks, self.config.block_size)
        scheduler = Scheduler(self.config, self.cache.memory)
        run = StepLoop(scheduler, ModelRunner(self.model, self.cache), WallClock()).run(
            requests, refused)
        leaked = self.num_blocks - self.cache.memory.num_free
        if leaked:
            raise RuntimeError(f"{leaked} KV blocks are still allocated after every request "
                               "finished: the policy leaked blocks")
        return run


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
