"""Send a load's requests to a server at their send times and time every streamed token.

Each request is an OpenAI Completions call (or, with ``endpoint="/v1/chat/completions"``, a
Chat Completions call) with ``stream: true`` and ``stream_options.include_usage``: its prompt is
token ids (a chat request sends the load's text of the same length as one user message, see
``inferlab.loadgen.dataset``), ``max_tokens`` (``max_completion_tokens`` for chat, the field's
current name) its output length, ``ignore_eos`` (vLLM's extension) unless switched off, and only
the sampling parameters given (as ``vllm bench serve`` does, which leaves the rest to the
server's defaults). The client notes the time it sent the request and the time each token's
chunk arrived; with one chunk per token (what these servers send) those are the token times of
``inferlab.serving.metrics.RequestTiming``, measured where the user sits. The last chunk's
``usage`` gives the server's own count of the prompt's and the completion's tokens. Requests run
as asyncio tasks on one ``httpx.AsyncClient``, so arrivals never wait for earlier answers (an
open-loop load, as in vLLM's ``vllm bench serve``).

``max_concurrency`` caps the requests in flight, as ``vllm bench serve --max-concurrency`` does
(an ``asyncio.Semaphore`` around each request): a request that arrives while the cap is reached
waits for a slot, and its clock starts when it is sent, so TTFT does not count that wait.
``warmups`` requests (copies of the first) go out first and are not counted, as vLLM's
``--num-warmups``; ``wait_until_ready`` polls a server that is still starting.

A request that fails keeps why: the HTTP status and the server's message (a 429 is the server
shedding load, not an error of the load generator), or the connection error.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

import httpx

from inferlab.loadgen.dataset import (RANDOM, LoadRequest, make_load,  # noqa: F401 (the
                                      random_lengths)                # chapter imports them here)


@dataclass
class Outcome:
    """What happened to one request: its send time and chunk times on the load's clock (s)."""

    request: LoadRequest
    sent_s: float = math.nan
    chunk_times_s: list[float] = field(default_factory=list)
    completion_tokens: int | None = None  # from the server's usage, when it reports one
    prompt_tokens: int | None = None      # the server's count of the prompt (chat template in)
    status: int | None = None
    error: str | None = None
    response_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times_s)

    @property
    def failure(self) -> str | None:
        """Why it failed, as a class: ``HTTP 429``, ``ConnectError``, ``no tokens streamed``."""
        if self.ok:
            return None
        if self.status is not None and self.status != 200:
            return f"HTTP {self.status}"
        if self.error:
            return self.error.split(":")[0]
        return "no tokens streamed"


class ServerUnreachable(ConnectionError):
    """The server did not answer ``/v1/models`` as an OpenAI-compatible server does; the message
    says what happened and what to try."""


def served_model(url: str, api_key: str | None = None) -> str:
    """The first model a server's ``/v1/models`` lists (the default a command measures); raises
    ``ServerUnreachable`` when nothing answers there, or not as such a server does."""
    base = url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(base + "/v1/models", headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise ServerUnreachable(
            f"cannot reach a server at {base} ({type(e).__name__}: {e}). Is it running, and is "
            "--url right? The course's server starts with `python -m inferlab.serve` "
            "(it listens on http://127.0.0.1:8000).") from None
    if r.status_code in (401, 403):
        raise ServerUnreachable(f"the server at {base} refused the request ({r.status_code}): "
                                "pass its API key with --api-key.")
    try:
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        raise ServerUnreachable(f"{base}/v1/models answered {r.status_code} with no model list: "
                                "is this an OpenAI-compatible server? (pass --model to name "
                                "the model yourself)") from None


def wait_until_ready(url: str, api_key: str | None = None, timeout_s: float = 0.0,
                     poll_s: float = 1.0) -> str:
    """``served_model``, asked again every ``poll_s`` until the server answers or ``timeout_s``
    has passed (0: once); a server still loading its model is not yet an error."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return served_model(url, api_key)
        except ServerUnreachable:
            if time.monotonic() + poll_s > deadline:
                raise
            time.sleep(poll_s)


COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
ENDPOINTS = (COMPLETIONS, CHAT)


def request_body(model: str, req: LoadRequest, endpoint: str = COMPLETIONS,
                 ignore_eos: bool = True, sampling: dict | None = None) -> dict:
    """The streamed request a load sends for ``req`` to ``endpoint``."""
    body = {"model": model, "stream": True, "stream_options": {"include_usage": True},
            **(sampling or {})}
    if ignore_eos:
        body["ignore_eos"] = True
    if endpoint == CHAT:
        if req.text is None:
            raise ValueError("a chat request sends text: make the load with the served model's "
                             "tokenizer and text=True (the command does, with --tokenizer)")
        return body | {"messages": [{"role": "user", "content": req.text}],
                       "max_completion_tokens": req.max_tokens}
    if endpoint != COMPLETIONS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    return body | {"prompt": list(req.prompt), "max_tokens": req.max_tokens}


async def _one(client: httpx.AsyncClient, req: LoadRequest, body: dict, t0: float,
               out: Outcome, endpoint: str) -> None:
    out.sent_s = time.perf_counter() - t0
    try:
        async with client.stream("POST", endpoint, json=body) as r:
            out.status = r.status_code
            if r.status_code != 200:
                out.error = (await r.aread()).decode(errors="replace")[:500]
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                now = time.perf_counter() - t0
                out.response_id = chunk.get("id", out.response_id)
                if chunk.get("usage"):
                    out.completion_tokens = chunk["usage"].get("completion_tokens")
                    out.prompt_tokens = chunk["usage"].get("prompt_tokens")
                choices = chunk.get("choices") or []
                if choices and choices[0].get("finish_reason") is None:
                    out.chunk_times_s.append(now)  # a token's chunk (the last one only ends)
    except httpx.HTTPError as e:
        out.error = f"{type(e).__name__}: {e}"


async def run_load(url: str, model: str, load: list[LoadRequest], api_key: str | None = None,
                   progress: bool = True, timeout_s: float = 600.0,
                   max_connections: int = 1000, extra: dict | None = None,
                   max_concurrency: int | None = None, endpoint: str = COMPLETIONS,
                   ignore_eos: bool = True, sampling: dict | None = None,
                   warmups: int = 0) -> list[Outcome]:
    """Send ``load`` to the server at ``url``; one ``Outcome`` per request, in order.

    With ``max_concurrency``, at most that many requests are in flight at once; ``endpoint``:
    ``/v1/completions`` or ``/v1/chat/completions``; ``sampling``: fields such as
    ``temperature`` or ``top_p`` sent with every request (none: the server's defaults);
    ``extra``: any other fields; ``warmups``: copies of the first request sent and awaited
    before the load, not counted."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    from tqdm.auto import tqdm

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    bodies = [request_body(model, r, endpoint, ignore_eos, sampling) | (extra or {})
              for r in load]
    outcomes = [Outcome(r) for r in load]
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=100)
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def limited(client, req, body, t0, out):
        if slots is None:
            await _one(client, req, body, t0, out, endpoint)
        else:
            async with slots:  # wait for a request in flight to finish
                await _one(client, req, body, t0, out, endpoint)

    async with httpx.AsyncClient(base_url=url.rstrip("/").removesuffix("/v1"),
                                 headers=headers, timeout=timeout_s, limits=limits) as client:
        if warmups and load:
            warm = [Outcome(load[0]) for _ in range(warmups)]
            t0 = time.perf_counter()
            await asyncio.gather(*(limited(client, load[0], bodies[0], t0, w) for w in warm))
        bar = tqdm(total=len(load), desc="requests", disable=not progress)
        t0 = time.perf_counter()

        async def tracked(req, body, out):
            await asyncio.sleep(max(0.0, t0 + req.send_at_s - time.perf_counter()))
            await limited(client, req, body, t0, out)
            bar.update(1)
        await asyncio.gather(*(tracked(r, b, o) for r, b, o in zip(load, bodies, outcomes)))
        bar.close()
    return outcomes


def run(url: str, model: str, load: list[LoadRequest], **kwargs) -> list[Outcome]:
    """``run_load`` from synchronous code (a script or a test); in a notebook whose event loop
    is running, it runs on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_load(url, model, load, **kwargs))
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run_load(url, model, load, **kwargs)).result()
