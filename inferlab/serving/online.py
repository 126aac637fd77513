"""The engine online: requests arrive while it runs, and each one's tokens stream back.

``serve`` (``inferlab.serving.engine``) knows every request before it starts. A server does
not: a client may send a request at any moment, read its tokens one at a time as they are
produced, and hang up halfway. ``OnlineEngine`` runs the same ``StepLoop`` loop
(``inferlab.serving.loop``) on a background thread, so the scheduler, the runner and the
paged cache are exactly the offline engine's:

- ``submit(request)`` hands it a request from any thread and returns a ``Stream`` at once;
  the loop lets the request in before its next step, stamped with the time it arrived.
- After every step the loop pushes each sequence's new tokens into its ``Stream``, and a last
  ``Finished`` event (the finish reason and the engine's own ``RequestTiming``) when it is done.
  A prefill's token goes out sooner, as soon as its own forward pass ends (``StepLoop``'s
  ``on_prefill``), rather than after the step's decode batch: a newcomer's TTFT does not wait
  for everyone else's next token.
  A ``Stream`` is read by blocking iteration (``for token in stream``) or, from asyncio, by
  ``async for`` once made with ``loop=`` (the tokens then cross threads with
  ``call_soon_threadsafe``: the engine never waits for a slow reader).
- ``abort(stream)`` (the client went away, or a stop string matched) takes the sequence out at
  the next step boundary through ``StepLoop.withdraw`` and ``Scheduler.abort``, which frees its blocks at once.
- ``prefix_cache=True`` admits through ``PrefixCachingBlockManager``: a prompt that starts with
  blocks cached earlier (under the same ``cache_salt``) skips their prefill.
- Nothing a request carries can stop the loop: ``submit`` refuses a request the engine cannot
  serve (``validate_request``, ``InvalidRequestError``) before it reaches the loop's thread,
  and an exception while admitting, scheduling or running one ends that request (or, where it
  cannot be pinned on one, the step's requests) with a ``Finished("error", ...)`` that says
  what failed; their blocks are freed and the loop serves the rest (``StepLoop(isolate=True)``).
- ``shutdown(drain=True)`` refuses new requests, lets those in flight finish, and stops the
  thread.

vLLM's ``AsyncLLMEngine`` (Kwon et al. 2023) has the same shape: a background loop stepping the
engine and a per-request output queue.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from dataclasses import dataclass, replace

from inferlab.serving.block_manager import BlockManager
from inferlab.serving.config import ServingConfig
from inferlab.serving.loop import StepLoop, WallClock
from inferlab.serving.metrics import RequestTiming
from inferlab.serving.paged_int8 import pool_for
from inferlab.serving.prefix_cache import PrefixCachingBlockManager
from inferlab.serving.request import Request, Sequence, validate_request
from inferlab.serving.runner import ModelRunner
from inferlab.serving.scheduler import Scheduler


class EngineClosedError(RuntimeError):
    """The engine is draining or stopped and takes no new requests."""


@dataclass(frozen=True)
class Finished:
    """The last event of a stream: why it ended and the engine's own timing of it."""

    reason: str                  # "stop", "length", "abort" or "error"
    timing: RequestTiming | None  # None when it ended before its first token
    num_preemptions: int = 0
    error: str | None = None     # what went wrong, when the reason is "error"


class Stream:
    """One request's tokens as the engine produces them, then one ``Finished``.

    Iterate it (blocking) for the token ids, or ``async for`` when made with ``loop=``.
    ``tokens`` and ``finished`` hold what has arrived so far.
    """

    def __init__(self, request: Request, seq_id: int, loop: asyncio.AbstractEventLoop | None):
        self.request, self.seq_id, self.loop = request, seq_id, loop
        self.tokens: list[int] = []
        self.arrival_s = 0.0  # on the engine's clock, set by submit
        self.num_sent = 0  # tokens the engine has pushed (its thread's count)
        self.finished: Finished | None = None
        self._queue = asyncio.Queue() if loop is not None else queue.Queue()

    def _push(self, item) -> None:  # called on the engine's thread
        if self.loop is None:
            self._queue.put(item)
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _take(self, item):
        if isinstance(item, Finished):
            self.finished = item
            return None
        self.tokens.append(item)
        return item

    def __iter__(self):
        if self.loop is not None:
            raise TypeError("this stream belongs to an asyncio loop: use `async for`")
        while self.finished is None:
            token = self._take(self._queue.get())
            if token is not None:
                yield token

    async def __aiter__(self):
        if self.loop is None:
            raise TypeError("this stream was made without loop=: iterate it with `for`")
        while self.finished is None:
            token = self._take(await self._queue.get())
            if token is not None:
                yield token

    def result(self) -> list[int]:
        """Block until the request is done; its tokens (threads only)."""
        for _ in self:
            pass
        return self.tokens


class OnlineEngine:
    """A model and its paged cache, served by a background loop; ``submit`` from any thread.

    ``config.num_blocks`` must be set (the pool is the server's, sized once). ``eos_token_ids``
    end every request that does not bring its own.
    """

    def __init__(self, model, config: ServingConfig, eos_token_ids: tuple[int, ...] = (),
                 prefix_cache: bool = False):
        if config.num_blocks is None:
            raise ValueError("OnlineEngine needs config.num_blocks: the pool is sized once")
        if prefix_cache and not config.chunked:
            raise ValueError("prefix caching needs chunked prefill (config.token_budget and "
                             "policy='chunked'): a prompt then starts after its cached blocks")
        self.model, self.config = model, config
        self.eos_token_ids = tuple(eos_token_ids)
        self.cache = pool_for(
            model, config, memory_class=PrefixCachingBlockManager if prefix_cache else BlockManager)
        self.scheduler = Scheduler(config, self.cache.memory)
        self.clock = WallClock()
        self.loop = StepLoop(self.scheduler, ModelRunner(model, self.cache), self.clock,
                             on_prefill=self._first_token, isolate=True)
        self.num_failed = 0  # requests ended by an error inside the engine (it kept serving)
        self._ids = itertools.count()
        self._inbox: list[Stream] = []       # submitted, not yet handed to the scheduler
        self._aborts: list[Stream] = []
        self._live: dict[int, tuple[Sequence, Stream]] = {}
        self._lock = threading.Condition()
        self._closed = self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="inferlab-engine", daemon=True)
        self._thread.start()

    # -- what clients call, from any thread ------------------------------------------------
    def check(self, request: Request, names: dict[str, str] | None = None) -> None:
        """Raise ``InvalidRequestError`` unless this engine can serve ``request``: the check
        ``submit`` runs (``validate_request`` against this model and pool). An HTTP server calls
        it first with its API's field ``names``, so that its 400 names the field as the client
        sent it."""
        validate_request(request, self.model.config, self.config.num_blocks,
                         self.config.block_size, names)

    def submit(self, request: Request, loop: asyncio.AbstractEventLoop | None = None,
               arrival_s: float | None = None) -> Stream:
        """Queue ``request`` (validated here: ``InvalidRequestError`` if it can never run).

        ``arrival_s`` (on ``self.clock``; default: now) is when the request reached the server,
        e.g. when an HTTP server received it, so that its TTFT counts the time before it got
        here too.
        """
        if not request.eos_token_ids and self.eos_token_ids:
            request = replace(request, eos_token_ids=self.eos_token_ids)
        self.check(request)
        with self._lock:
            if self._closed:
                raise EngineClosedError("the engine is shutting down and takes no new requests")
            stream = Stream(request, next(self._ids), loop)
            stream.arrival_s = self.clock.now() if arrival_s is None else arrival_s
            self._inbox.append(stream)
            self._lock.notify()
        return stream

    def abort(self, stream: Stream) -> None:
        """Stop ``stream``'s request; its blocks are freed before the next step."""
        with self._lock:
            if stream.finished is None:
                self._aborts.append(stream)
                self._lock.notify()

    @property
    def num_waiting(self) -> int:
        """Requests queued: submitted and not yet running (the queue an operator watches)."""
        return len(self._inbox) + len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def blocks_cached(self) -> int:
        """Blocks that only the prefix cache holds (0 without prefix caching)."""
        return self.cache.memory.num_cached_only

    @property
    def blocks_in_use(self) -> int:
        """Blocks that requests hold (the prefix cache's own references not counted)."""
        return self.cache.num_blocks - self.cache.memory.num_free - self.blocks_cached

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def idle(self) -> bool:
        """Nothing queued, running or in the inbox."""
        with self._lock:
            return not self._inbox and not self._live and self.loop.done

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Wait until ``idle()`` (aborts take effect at the next step boundary); whether it is."""
        deadline = time.monotonic() + timeout_s
        while not self.idle() and time.monotonic() < deadline and self.alive:
            time.sleep(0.002)
        return self.idle()

    def shutdown(self, drain: bool = True, timeout: float | None = 30.0) -> None:
        """Take no new requests; finish those in flight (``drain``) or abort them; stop."""
        with self._lock:
            self._closed = True
            if not drain:
                self._aborts.extend(s for _, s in self._live.values())
                self._aborts.extend(self._inbox)
            self._stop = True
            self._lock.notify()
        self._thread.join(timeout)

    # -- the loop, on its own thread -------------------------------------------------------
    def _run(self) -> None:
        """Step until stopped. A failure inside a step ends the requests it is blamed on and the
        loop goes on (``StepLoop(isolate=True)``); so does a failure to admit one request. Only an
        error in the loop's own bookkeeping stops it: then every stream it holds, and those
        still in the inbox, end with an error (none hangs), and ``alive`` turns False, so that a
        server's /health answers 503 and it gets restarted."""
        inbox: list[Stream] = []
        try:
            while True:
                with self._lock:
                    while not (self._inbox or self._aborts or self._live or self._stop) \
                            and self.loop.done:  # (a static batch may hold finished members)
                        self._lock.wait()
                    if self._stop and not (self._inbox or self._aborts or self._live):
                        return
                    inbox, self._inbox = self._inbox, []
                    aborts, self._aborts = self._aborts, []
                while inbox:
                    self._admit(inbox.pop(0))
                for stream in aborts:
                    self._abort(stream)
                if not self.loop.done:
                    self.loop.step()
                self._deliver()
        except Exception as error:
            self.error = error
            why = f"the engine loop stopped: {type(error).__name__}: {error}"
            with self._lock:
                self._closed = True
                for stream in [*(s for _, s in self._live.values()), *inbox, *self._inbox]:
                    if stream.finished is None:
                        stream._push(Finished("error", None, error=why))
                self._live.clear()

    def _admit(self, stream: Stream) -> None:
        """Hand ``stream``'s request to the server; if that fails, end it alone with an error."""
        try:
            seq = Sequence.of(stream.seq_id, stream.request, arrival_s=stream.arrival_s)
            self.loop.submit(seq, self.clock.now())
        except Exception as error:
            self.num_failed += 1
            stream._push(Finished("error", None, error=f"the engine failed while admitting "
                                  f"it: {type(error).__name__}: {error}"))
            return
        self._live[seq.seq_id] = (seq, stream)

    def _abort(self, stream: Stream) -> None:
        entry = self._live.pop(stream.seq_id, None)
        if entry is None:  # it finished before the abort came
            return
        seq = entry[0]
        self.loop.withdraw(seq)
        stream._push(Finished("abort", self._timing(seq), seq.num_preemptions))
        self.loop.stamps.pop(seq.seq_id, None)

    def _timing(self, seq: Sequence) -> RequestTiming | None:
        stamps = self.loop.stamps.get(seq.seq_id, [])
        return RequestTiming(seq.arrival_s, tuple(stamps)) if stamps else None

    def _first_token(self, seq: Sequence, token: int) -> None:
        """A prefill's token, streamed as soon as its forward pass ends (the step's decode batch
        still runs before the scheduler records it); ``_deliver`` then skips it."""
        entry = self._live.get(seq.seq_id)
        if entry is not None and entry[1].num_sent == len(seq.output):
            entry[1]._push(token)
            entry[1].num_sent += 1

    def _deliver(self) -> None:
        """Push every live sequence's new tokens; end the streams of finished ones, and of those
        the server took out after a failure (with the error)."""
        failed = {seq.seq_id: why for seq, why in self.loop.failures}
        self.loop.failures = []
        for seq_id, (seq, stream) in list(self._live.items()):
            for token in seq.output[stream.num_sent:]:  # (a failed one's: before the failure)
                stream._push(token)
            stream.num_sent = len(seq.output)
            # a static batch's padding member is done too: it produces no more tokens
            if seq_id in failed or seq.is_done:
                del self._live[seq_id]
                self.num_failed += seq_id in failed
                reason = "error" if seq_id in failed else seq.finish_reason
                stream._push(Finished(reason, self._timing(seq), seq.num_preemptions,
                                      failed.get(seq_id)))
                self.loop.stamps.pop(seq_id, None)  # a server runs for days: keep nothing
        self.scheduler.finished.clear()
