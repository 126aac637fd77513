"""Send a trace's requests to a server at their arrival times and time every streamed token.

Each request is an OpenAI Completions call with ``stream: true``: its prompt is token ids (so
its length is exactly the trace's on any server that takes token-id prompts, as vLLM, SGLang
and ours do), ``max_tokens`` its output length, and ``ignore_eos`` so that it produces them
all. The client notes the time it sent the request and the time each chunk arrived; with one
chunk per token (what these servers send) those are the token times of
``inferlab.serving.metrics.RequestTiming``, measured where the user sits. Requests run as
asyncio tasks on one ``httpx.AsyncClient``, so arrivals never wait for earlier answers
(an open-loop load, as in vLLM's ``benchmark_serving.py``).

Arrivals are Poisson at a rate (``inferlab.sim.workloads.poisson_arrivals``), all at once
(``rate=inf``), or given (a trace with its own times). ``max_concurrency`` caps the requests in
flight, as ``vllm bench serve --max-concurrency`` does (an ``asyncio.Semaphore`` around each
request, in vllm/benchmarks/serve.py): a request that arrives while the cap is reached waits for
a slot, and its clock starts when it is sent, so TTFT does not count that wait.

Besides the traces, ``trace="random"`` makes vLLM's random dataset (``--dataset-name random``,
vllm/benchmarks/datasets/random.py): each request's input and output lengths are drawn uniformly
from [floor(n (1 - r)), ceil(n (1 + r))] around ``input_len`` and ``output_len`` with range ratio
r (0 by default: every request the same lengths), and its prompt is random token ids.

``endpoint="/v1/chat/completions"`` sends the same load as Chat Completions calls: the prompt
becomes one user message (``chat_content``: a word per token id, so the length in tokens is
close to, not exactly, the trace's; the server's usage reports the exact count) and the
streamed ``chat.completion.chunk`` deltas are timed as the completion chunks are.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

from inferlab.sim import traces, workloads


@dataclass(frozen=True)
class LoadRequest:
    """One request of a load: prompt token ids, tokens to generate, when to send it (s)."""

    prompt: tuple[int, ...]
    max_tokens: int
    send_at_s: float


@dataclass
class Outcome:
    """What happened to one request: its send time and chunk times on the load's clock (s)."""

    request: LoadRequest
    sent_s: float = math.nan
    chunk_times_s: list[float] = field(default_factory=list)
    completion_tokens: int | None = None  # from the server's usage, when it reports one
    status: int | None = None
    error: str | None = None
    response_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times_s)


RANDOM = "random"  # vLLM's random dataset: lengths given, prompts random token ids


def random_lengths(num_requests: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                   seed: int = 0) -> list[traces.TraceRow]:
    """Input and output lengths of vLLM's random dataset: uniform integers in
    [floor(n (1 - r)), ceil(n (1 + r))] around each length n, outputs at least 1."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    if input_len < 1 or output_len < 1:
        raise ValueError(f"input and output lengths must be at least 1, got {input_len}, "
                         f"{output_len}")
    rng = np.random.default_rng(seed)
    lows = [max(1, math.floor(n * (1 - range_ratio))) for n in (input_len, output_len)]
    highs = [math.ceil(n * (1 + range_ratio)) for n in (input_len, output_len)]
    ins = rng.integers(lows[0], highs[0] + 1, size=num_requests)
    outs = rng.integers(lows[1], highs[1] + 1, size=num_requests)
    return [traces.TraceRow(n, int(i), int(o)) for n, (i, o) in enumerate(zip(ins, outs))]


def make_load(trace: str = "sharegpt_like", num_requests: int = 100, rate: float = math.inf,
              scale: float = 1.0, max_len: int | None = None, vocab_size: int = 1000,
              seed: int = 0, arrivals_s: list[float] | None = None,
              input_len: int = 1024, output_len: int = 128,
              range_ratio: float = 0.0) -> list[LoadRequest]:
    """``num_requests`` rows of a trace of ``inferlab.sim.traces`` (lengths times ``scale``,
    cut to ``max_len``), or of the random dataset (``trace="random"``: ``input_len``,
    ``output_len``, ``range_ratio``), random prompts below ``vocab_size``, arriving Poisson at
    ``rate`` per second (all at 0 for ``inf``) or at the given ``arrivals_s``."""
    if trace == RANDOM:
        rows = random_lengths(num_requests, input_len, output_len, range_ratio, seed)
    elif trace in traces.WORKLOADS:
        rows = getattr(traces, trace)(num_requests, seed=seed)
    else:
        raise ValueError(f"unknown trace {trace!r}; use one of "
                         f"{sorted([*traces.WORKLOADS, RANDOM])}")
    if scale != 1.0 or max_len is not None:
        rows = traces.scale_lengths(rows, scale, max_len)
    if arrivals_s is None:
        arrivals_s = ([0.0] * num_requests if math.isinf(rate) or math.isnan(rate)
                      else workloads.poisson_arrivals(num_requests, rate, seed))
    if len(arrivals_s) != len(rows):
        raise ValueError(f"{len(rows)} requests but {len(arrivals_s)} arrival times")
    rng = np.random.default_rng(seed)
    return [LoadRequest(tuple(int(t) for t in rng.integers(1, vocab_size, r.prompt_len)),
                        r.output_len, float(t)) for r, t in zip(rows, arrivals_s)]


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


COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
ENDPOINTS = (COMPLETIONS, CHAT)


def chat_content(prompt: tuple[int, ...]) -> str:
    """A chat message standing for token-id prompt ``prompt``: one short word per id."""
    return " ".join(f"w{t}" for t in prompt)


def request_body(model: str, req: LoadRequest, endpoint: str = COMPLETIONS) -> dict:
    """The streamed request a load sends for ``req`` to ``endpoint``."""
    body = {"model": model, "max_tokens": req.max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    if endpoint == CHAT:
        return body | {"messages": [{"role": "user", "content": chat_content(req.prompt)}]}
    if endpoint != COMPLETIONS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    return body | {"prompt": list(req.prompt)}


async def _one(client: httpx.AsyncClient, model: str, req: LoadRequest, t0: float,
               out: Outcome, extra: dict, endpoint: str = COMPLETIONS) -> None:
    body = request_body(model, req, endpoint) | extra
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
                choices = chunk.get("choices") or []
                if choices and choices[0].get("finish_reason") is None:
                    out.chunk_times_s.append(now)  # a token's chunk (the last one only ends)
    except httpx.HTTPError as e:
        out.error = f"{type(e).__name__}: {e}"


async def run_load(url: str, model: str, load: list[LoadRequest], api_key: str | None = None,
                   progress: bool = True, timeout_s: float = 600.0,
                   max_connections: int = 1000, extra: dict | None = None,
                   max_concurrency: int | None = None,
                   endpoint: str = COMPLETIONS) -> list[Outcome]:
    """Send ``load`` to the server at ``url``; one ``Outcome`` per request, in order. With
    ``max_concurrency``, at most that many requests are in flight at once; ``endpoint``:
    ``/v1/completions`` or ``/v1/chat/completions``."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    from tqdm.auto import tqdm

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    outcomes = [Outcome(r) for r in load]
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url.rstrip("/").removesuffix("/v1"),
                                 headers=headers, timeout=timeout_s, limits=limits) as client:
        bar = tqdm(total=len(load), desc="requests", disable=not progress)
        t0 = time.perf_counter()

        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def tracked(req, out):
            await asyncio.sleep(max(0.0, t0 + req.send_at_s - time.perf_counter()))
            if slots is None:
                await _one(client, model, req, t0, out, extra or {}, endpoint)
            else:
                async with slots:  # wait for a request in flight to finish
                    await _one(client, model, req, t0, out, extra or {}, endpoint)
            bar.update(1)
        await asyncio.gather(*(tracked(r, o) for r, o in zip(load, outcomes)))
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
