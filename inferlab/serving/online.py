"""The engine online: requests arrive while it runs, and each one's tokens stream back.

``serve`` (``inferlab.serving.engine``) knows every request before it starts. A server does
not: a client may send a request at any moment, read its tokens one at a time as they are
produced, and hang up halfway. ``OnlineEngine`` adds to one ``Engine`` (the same pool,
scheduler, runner and loop as an offline run) only three things: a background thread that
steps it, an inbox that requests wait in until the next step boundary, and a ``Stream`` per
request.

- ``submit(request)`` checks the request (``inferlab.validation``, once: an
  ``InvalidRequestError`` names the field, in the caller's ``names``) and returns its
  ``Stream`` at once, from any thread; the request arrives (its TTFT starts) then.
- Every token leaves through the engine's one hook (``on_token``) into its stream, as soon as
  its forward pass ends, and a last ``Finished`` event (the finish reason and the engine's own
  ``RequestTiming``, read off the sequence) follows when the request is done. A ``Stream`` is
  read by blocking iteration (``for token in stream``) or, from asyncio, by ``async for`` once
  made with ``loop=`` (the tokens then cross threads with ``call_soon_threadsafe``: the engine
  never waits for a slow reader).
- ``abort(stream)`` (the client went away, or a stop string matched) takes the sequence out at
  the next step boundary (``StepLoop.withdraw``, ``Scheduler.abort``), freeing its blocks.
- Nothing a request carries can stop the loop: an exception while admitting, scheduling or
  running one ends that request (or, where it cannot be pinned on one, the step's requests)
  with a ``Finished("error", ...)`` that says what failed (the loop's ``on_failure``); their
  blocks are freed and the loop serves the rest.
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

from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine
from inferlab.serving.metrics import RequestTiming
from inferlab.serving.request import Request, Sequence
from inferlab.validation import validate_request


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

    def __init__(self, seq: Sequence, loop: asyncio.AbstractEventLoop | None):
        self.seq, self.loop = seq, loop
        self.tokens: list[int] = []
        self.finished: Finished | None = None
        self._queue = asyncio.Queue() if loop is not None else queue.Queue()

    @property
    def request(self) -> Request:
        return self.seq.request

    def _push(self, item) -> None:  # called on the engine's thread
        if self.loop is None:
            self._queue.put(item)
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _end(self, reason: str, error: str | None = None) -> None:  # the engine's thread
        seq = self.seq
        timing = RequestTiming(seq.arrival_s, tuple(seq.token_times)) if seq.token_times \
            else None
        self._push(Finished(reason, timing, seq.num_preemptions, error))

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
    """A model and its paged pool, served by a background loop; ``submit`` from any thread.

    ``config.num_blocks`` must be set (the pool is the server's, sized once).
    """

    def __init__(self, model, config: ServingConfig, prefix_cache: bool = False):
        if config.num_blocks is None:
            raise ValueError("OnlineEngine needs config.num_blocks: the pool is sized once")
        self.engine = Engine(model, config, prefix_cache, on_token=self._token,
                             on_failure=self._failed)
        self.model, self.config, self.cache = model, config, self.engine.cache
        self.tier = self.engine.tier  # the second KV tier, if the config asks for one
        self.scheduler, self.clock = self.engine.scheduler, self.engine.clock
        self.num_failed = 0  # requests ended by an error inside the engine (it kept serving)
        self._ids = itertools.count()
        self._inbox: list[Stream] = []       # submitted, not yet handed to the loop
        self._aborts: list[Stream] = []
        self._live: dict[int, Stream] = {}  # by sequence id: handed to the loop, not ended
        self._lock = threading.Condition()
        self._closed = self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="inferlab-engine", daemon=True)
        self._thread.start()

    # -- what clients call, from any thread ------------------------------------------------
    def submit(self, request: Request, loop: asyncio.AbstractEventLoop | None = None,
               names: dict[str, str] | None = None) -> Stream:
        """Queue ``request``; its ``Stream``. Raises ``InvalidRequestError`` if it can never
        run (``validate_request`` against this model and pool, its messages in the caller's
        field ``names``), ``EngineClosedError`` while draining. The request arrives now, on
        the engine's clock: its TTFT is counted from here."""
        validate_request(request, self.model.config, self.cache.memory, names)
        with self._lock:
            if self._closed:
                raise EngineClosedError("the engine is shutting down and takes no new requests")
            seq = Sequence(next(self._ids), replace(request, arrival_s=self.clock.now()))
            stream = Stream(seq, loop)
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
        return len(self._inbox) + len(self.engine.pending) + len(self.scheduler.waiting)

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
            return not self._inbox and not self._live and self.engine.done

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
                self._aborts.extend(self._live.values())
                self._aborts.extend(self._inbox)
            self._stop = True
            self._lock.notify()
        self._thread.join(timeout)

    # -- the loop, on its own thread -------------------------------------------------------
    def _run(self) -> None:
        """Step until stopped. A failure inside a step ends the requests it is blamed on and the
        loop goes on (the loop's ``on_failure``); so does a failure to admit one request. Only
        an error in the loop's own bookkeeping stops it: then every stream it holds, and those
        still in the inbox, end with an error (none hangs), and ``alive`` turns False, so that a
        server's /health answers 503 and it gets restarted."""
        inbox: list[Stream] = []
        try:
            while True:
                with self._lock:
                    while not (self._inbox or self._aborts or self._live or self._stop) \
                            and self.engine.done:  # (a static batch may hold finished members)
                        self._lock.wait()
                    if self._stop and not (self._inbox or self._aborts or self._live):
                        self.engine.close()
                        return
                    inbox, self._inbox = self._inbox, []
                    aborts, self._aborts = self._aborts, []
                for stream in inbox:
                    self._hand_over(stream)
                inbox = []
                for stream in aborts:
                    if self._live.pop(stream.seq.seq_id, None) is not None:  # not ended yet
                        self.engine.withdraw(stream.seq)
                        stream._end("abort")
                if not self.engine.done:
                    for seq in self.engine.step():  # (a static batch's padding member too)
                        self._live.pop(seq.seq_id)._end(seq.finish_reason)
        except Exception as error:
            self.error = error
            why = f"the engine loop stopped: {type(error).__name__}: {error}"
            with self._lock:
                self._closed = True
                for stream in [*self._live.values(), *inbox, *self._inbox]:
                    if stream.finished is None:
                        stream._push(Finished("error", None, error=why))
                self._live.clear()

    def _hand_over(self, stream: Stream) -> None:
        """Give ``stream``'s sequence to the loop; if that fails, end it alone with an error."""
        try:
            self.engine.submit(stream.seq, self.clock.now())
        except Exception as error:
            self.num_failed += 1
            stream._end("error", f"the engine failed while admitting it: "
                                 f"{type(error).__name__}: {error}")
            return
        self._live[stream.seq.seq_id] = stream

    def _token(self, seq: Sequence, token: int, time_s: float) -> None:
        """The loop's ``on_token``: a token leaves for its stream as its forward pass ends."""
        stream = self._live.get(seq.seq_id)
        if stream is not None:
            stream._push(token)

    def _failed(self, seq: Sequence, why: str) -> None:
        """The loop's ``on_failure``: ``seq`` was taken out after an error; end its stream."""
        stream = self._live.pop(seq.seq_id, None)
        if stream is not None:
            self.num_failed += 1
            stream._end("error", why)
