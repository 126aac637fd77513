"""The serving engine: requests with arrival times in, each request's tokens and timings out.

``serve(model, requests)`` is the entry point. Underneath, three parts with one job each:

- the ``Scheduler`` (``inferlab.serving.scheduler``) decides every iteration who prefills, who decodes
  and who is preempted, and is the only code that changes a sequence's state;
- the ``ModelRunner`` runs those decisions on the model over the paged KV cache
  (``inferlab.serving.block_manager``): a prefill is one forward of tokens (1, T) at positions (1, T), a decode
  one forward of tokens (n, 1) at positions (n, 1), one row per running sequence, each preceded
  by ``cache.bind(tables)``; it samples greedily and only reads the sequences;
- ``drive`` is the loop between them: it lets requests in when their arrival time comes,
  stamps each output token when it becomes available, and, when nothing can run, skips the
  clock to the next arrival instead of sleeping (the stamps are those a real-time server would
  have made, but an idle trace costs no waiting).

The same loop drives the discrete-event simulator (``inferlab.sim.simulator``), with a runner that
charges modelled step times to a virtual clock instead of running the model.

Invalid requests (an empty prompt, a prompt longer than the model's context, max_new_tokens
that is not a positive integer, ...) are refused one by one with a clear error in their
``Result``; the others still complete.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from inferlab.serving.metrics import RequestTiming, Summary, summarize, SLO
from inferlab.serving.paged_cache import PagedKVCache
from inferlab.serving.scheduler import POLICIES, Scheduler, Sequence, Step


@dataclass(frozen=True)
class Request:
    """A prompt (token ids), how many tokens to generate, and when it arrives (seconds)."""

    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival_s: float = 0.0
    request_id: object = None

    def __post_init__(self) -> None:
        prompt = self.prompt.tolist() if isinstance(self.prompt, torch.Tensor) else self.prompt
        object.__setattr__(self, "prompt", tuple(prompt))


class InvalidRequestError(ValueError):
    """A request the engine cannot serve; the message says why and what would fix it."""


def validate_request(request: Request, config, num_blocks: int | None = None,
                     block_size: int = 16) -> None:
    """Raise ``InvalidRequestError`` unless ``request`` can run on a model shaped ``config``."""
    p, n = request.prompt, request.max_new_tokens
    if len(p) == 0:
        raise InvalidRequestError("the prompt is empty: a request needs at least one token")
    if not all(isinstance(t, int) and 0 <= t < config.vocab_size for t in p):
        raise InvalidRequestError(f"the prompt holds token ids outside [0, {config.vocab_size})")
    if len(p) > config.max_seq_len:
        raise InvalidRequestError(f"the prompt has {len(p)} tokens but the model's context is "
                                  f"{config.max_seq_len}; shorten the prompt")
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise InvalidRequestError(f"max_new_tokens must be a positive integer, got {n!r}")
    if len(p) + n - 1 > config.max_seq_len:
        raise InvalidRequestError(f"{len(p)} prompt tokens + {n} new tokens exceed the model's "
                                  f"context of {config.max_seq_len}; lower max_new_tokens to at "
                                  f"most {config.max_seq_len - len(p) + 1}")
    if not (isinstance(request.arrival_s, (int, float)) and math.isfinite(request.arrival_s)
            and request.arrival_s >= 0):
        raise InvalidRequestError(f"arrival_s must be a finite time >= 0, got {request.arrival_s!r}")
    if num_blocks is not None:
        need = -(-(len(p) + n - 1) // block_size)
        if need > num_blocks:
            raise InvalidRequestError(f"at its longest the request needs {need} KV blocks of "
                                      f"{block_size} tokens but the cache has {num_blocks}")


@dataclass(frozen=True)
class Result:
    """What came back for one request: its tokens and timings, or the error that refused it."""

    request_id: object
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]           # the generated tokens (the prompt not included)
    timing: RequestTiming | None      # None for a refused request
    num_preemptions: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Iteration:
    """One step of the loop as it ran: its prefills, its decode batch and how long each took."""

    start_s: float
    prefills: tuple[tuple[int, int, float], ...]  # (seq_id, tokens, seconds), one forward each
    decode_ids: tuple[int, ...]
    padding_ids: tuple[int, ...]                  # finished rows riding along (static batching)
    decode_context: int                           # K/V tokens the decode batch attends over
    decode_s: float
    preempted: tuple[int, ...]
    free_blocks: int                              # after the step's allocations

    @property
    def decode_batch(self) -> int:
        """Rows in the decode forward, padding included."""
        return len(self.decode_ids) + len(self.padding_ids)

    @property
    def end_s(self) -> float:
        return self.start_s + sum(s for _, _, s in self.prefills) + self.decode_s


class WallClock:
    """Seconds since the run started, measured, except that idle gaps can be skipped."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self._skipped = 0.0

    def now(self) -> float:
        return time.perf_counter() - self._t0 + self._skipped

    def skip_to(self, t: float) -> None:
        """Nothing can run before ``t``: jump there rather than wait."""
        self._skipped += max(0.0, t - self.now())


class ModelRunner:
    """Runs prefills and decode batches on ``model`` over a paged cache; greedy sampling."""

    def __init__(self, model, cache: PagedKVCache):
        self.model, self.cache, self.device = model, cache, model.device

    @torch.inference_mode()
    def prefill(self, seq: Sequence) -> int:
        """The prompt (and, after a preemption, the tokens already produced) in one forward."""
        tokens = torch.tensor([seq.tokens], device=self.device)            # (1, T)
        positions = torch.arange(tokens.shape[1], device=self.device)[None]  # (1, T)
        self.cache.bind([seq.table])
        logits = self.model(tokens, positions, self.cache)[:, -1]           # (1, V)
        return int(logits.argmax(-1))

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> list[int]:
        """One new token for each sequence: its last token in, at its table's last slot.

        For a running sequence that slot is the one ``append_slot`` just made; a padding row
        (a finished member of a static batch) rewrites its last slot, at the same cost.
        """
        tokens = torch.tensor([[s.output[-1]] for s in seqs], device=self.device)      # (n, 1)
        positions = torch.tensor([[s.table.num_tokens - 1] for s in seqs],
                                 device=self.device)                                  # (n, 1)
        self.cache.bind([s.table for s in seqs])
        logits = self.model(tokens, positions, self.cache)[:, -1]                    # (n, V)
        return logits.argmax(-1).tolist()


def drive(requests: dict[int, Request], scheduler: Scheduler, runner, clock,
          on_iteration: Callable[[Iteration], None] | None = None) -> dict[int, list[float]]:
    """Serve ``requests`` (key i becomes sequence i); return each one's token stamps.

    ``runner`` has ``prefill(seq) -> token`` and ``decode(seqs) -> tokens``; ``clock`` has
    ``now()`` and ``skip_to(t)``. The sequences end in ``scheduler.finished``.
    """
    order = sorted(requests, key=lambda i: (requests[i].arrival_s, i))
    pending = deque((i, requests[i]) for i in order)
    stamps: dict[int, list[float]] = {i: [] for i in order}
    while pending or scheduler.has_unfinished:
        now = clock.now()
        while pending and pending[0][1].arrival_s <= now:
            i, r = pending.popleft()
            scheduler.add(Sequence(i, r.prompt, r.max_new_tokens, r.arrival_s))
        step: Step = scheduler.schedule(now)
        if step.is_empty:
            if not pending and not scheduler.has_unfinished:
                break  # the policy retired the last sequences
            wake = [t for t in (pending[0][1].arrival_s if pending else None, step.wake_at_s)
                    if t is not None]
            if not wake:
                raise RuntimeError(f"the scheduler is stuck: {len(scheduler.waiting)} waiting, "
                                   "none admitted, nothing running and no arrival to wait for")
            clock.skip_to(min(wake))
            continue
        tokens, prefills = [], []
        for seq in step.prefills:
            t0 = clock.now()
            tokens.append(runner.prefill(seq))
            t1 = clock.now()
            stamps[seq.seq_id].append(t1)
            prefills.append((seq.seq_id, seq.num_tokens, t1 - t0))
        rows = step.decodes + step.padding
        decode_s, context = 0.0, sum(s.table.num_tokens for s in rows)
        if step.decodes:
            t0 = clock.now()
            tokens.extend(runner.decode(rows)[:len(step.decodes)])  # padding tokens are dropped
            t1 = clock.now()
            decode_s = t1 - t0
            for seq in step.decodes:
                stamps[seq.seq_id].append(t1)
        if on_iteration is not None:
            on_iteration(Iteration(now, tuple(prefills), tuple(s.seq_id for s in step.decodes),
                                   tuple(s.seq_id for s in step.padding), context, decode_s, tuple(s.seq_id for s in step.preempted),
                                   scheduler.allocator.num_free))
        scheduler.update(step, tokens)
    return stamps


def _policy(policy):
    if callable(policy):
        return policy
    try:
        return POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; use one of {sorted(POLICIES)} or pass a "
                         "function policy(scheduler, now) -> Step") from None


def collect_results(requests: list[Request], refused: dict[int, str], scheduler: Scheduler,
                    stamps: dict[int, list[float]]) -> list[Result]:
    """One ``Result`` per request, in the order given; sequence ids index ``requests``."""
    done = {seq.seq_id: seq for seq in scheduler.finished}
    results = []
    for i, r in enumerate(requests):
        rid = i if r.request_id is None else r.request_id
        if i in refused:
            results.append(Result(rid, r.prompt, (), None, 0, refused[i]))
            continue
        seq = done[i]
        results.append(Result(rid, r.prompt, tuple(seq.output),
                              RequestTiming(r.arrival_s, tuple(stamps[i])), seq.num_preemptions))
    return results


class Engine:
    """A model, its paged KV cache of ``num_blocks`` blocks, and a scheduling policy.

    ``policy`` is "continuous", "static", or a function ``policy(scheduler, now) -> Step``.
    ``run`` may be called again; every block is free between runs.
    """

    def __init__(self, model, num_blocks: int, block_size: int = 16, max_batch: int = 32,
                 policy="continuous", max_prefill_tokens: int | None = None):
        self.model = model
        self.cache = PagedKVCache.for_model(model, num_blocks, block_size)
        self.block_size, self.max_batch = block_size, max_batch
        self.policy = _policy(policy)
        self.max_prefill_tokens = max_prefill_tokens
        self.iterations: list[Iteration] = []
        self.num_preemptions = 0

    @property
    def num_blocks(self) -> int:
        return self.cache.allocator.num_blocks

    def run(self, requests: Iterable[Request]) -> list[Result]:
        """Serve ``requests``; one ``Result`` each, in the order given."""
        requests = list(requests)
        refused: dict[int, str] = {}
        for i, r in enumerate(requests):
            try:
                validate_request(r, self.model.config, self.num_blocks, self.block_size)
            except InvalidRequestError as error:
                refused[i] = f"request {r.request_id if r.request_id is not None else i} " \
                             f"refused: {error}"
        valid = {i: r for i, r in enumerate(requests) if i not in refused}
        scheduler = Scheduler(self.cache.allocator, self.block_size, self.max_batch,
                              self.policy, self.max_prefill_tokens)
        self.iterations = []
        stamps = drive(valid, scheduler, ModelRunner(self.model, self.cache),
                       WallClock(), self.iterations.append)
        self.num_preemptions = scheduler.num_preemptions
        leaked = self.num_blocks - self.cache.allocator.num_free
        if leaked:
            raise RuntimeError(f"{leaked} KV blocks are still allocated after every request "
                               "finished: the policy leaked blocks")
        return collect_results(requests, refused, scheduler, stamps)


def serve(model, requests: Iterable[Request], policy="continuous", num_blocks: int | None = None,
          block_size: int = 16, max_batch: int = 32,
          max_prefill_tokens: int | None = None) -> list[Result]:
    """Generate greedily for every request as they arrive; return tokens and timings for each.

    ``num_blocks`` defaults to enough blocks for ``max_batch`` copies of the longest request,
    so no preemption is needed; pass fewer to serve under memory pressure.
    """
    requests = list(requests)
    if num_blocks is None:
        longest = max((len(r.prompt) + max(int(r.max_new_tokens), 1) for r in requests
                       if isinstance(r.max_new_tokens, int)), default=1)
        num_blocks = max_batch * -(-longest // block_size)
    engine = Engine(model, num_blocks, block_size, max_batch, policy, max_prefill_tokens)
    return engine.run(requests)


def summarize_results(results: Iterable[Result], slo: SLO | None = None) -> Summary:
    """``metrics.summarize`` over the requests that completed."""
    return summarize([r.timing for r in results if r.ok], slo)
