"""Send a trace's requests to a server at their arrival times and time every streamed token.

Each request is an OpenAI Completions call with ``stream: true``: its prompt is token ids (so
its length is exactly the trace's on any server that takes token-id prompts, as vLLM, SGLang
and ours do), ``max_tokens`` its output length, and ``ignore_eos`` so that it produces them
all. The client notes the time it sent the request and the time each chunk arrived; with one
chunk per token (what these servers send) those are the token times of
``inferlab.serving.metrics.RequestTiming``, measured where the user sits. Requests run as
asyncio tasks on one ``httpx.AsyncClient``, so arrivals never wait for earlier answers
(an open-loop load, as in vLLM's ``benchmark_serving.py``).

Arrivals are Poisson at a rate (``inferlab.sim.traces.poisson_arrivals``), all at once
(``rate=inf``), or given (a trace with its own times).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

from inferlab.sim import traces


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


def make_load(trace: str = "sharegpt_like", num_requests: int = 100, rate: float = math.inf,
              scale: float = 1.0, max_len: int | None = None, vocab_size: int = 1000,
              seed: int = 0, arrivals_s: list[float] | None = None) -> list[LoadRequest]:
    """``num_requests`` rows of a trace of ``inferlab.sim.traces`` (lengths times ``scale``,
    cut to ``max_len``), random prompts below ``vocab_size``, arriving Poisson at ``rate`` per
    second (all at 0 for ``inf``) or at the given ``arrivals_s``."""
    if trace not in traces.WORKLOADS:
        raise ValueError(f"unknown trace {trace!r}; use one of {sorted(traces.WORKLOADS)}")
    rows = getattr(traces, trace)(num_requests, seed=seed)
    if scale != 1.0 or max_len is not None:
        rows = traces.scale_lengths(rows, scale, max_len)
    if arrivals_s is None:
        arrivals_s = ([0.0] * num_requests if math.isinf(rate) or math.isnan(rate)
                      else traces.poisson_arrivals(num_requests, rate, seed))
    if len(arrivals_s) != len(rows):
        raise ValueError(f"{len(rows)} requests but {len(arrivals_s)} arrival times")
    rng = np.random.default_rng(seed)
    return [LoadRequest(tuple(int(t) for t in rng.integers(1, vocab_size, r.prompt_len)),
                        r.output_len, float(t)) for r, t in zip(rows, arrivals_s)]


def served_model(url: str, api_key: str | None = None) -> str:
    """The first model a server's ``/v1/models`` lists (the default a command measures)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.get(url.rstrip("/").removesuffix("/v1") + "/v1/models", headers=headers, timeout=30)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


async def _one(client: httpx.AsyncClient, model: str, req: LoadRequest, t0: float,
               out: Outcome, extra: dict) -> None:
    await asyncio.sleep(max(0.0, t0 + req.send_at_s - time.perf_counter()))
    body = {"model": model, "prompt": list(req.prompt), "max_tokens": req.max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **extra}
    out.sent_s = time.perf_counter() - t0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
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
                   max_connections: int = 1000, extra: dict | None = None) -> list[Outcome]:
    """Send ``load`` to the server at ``url``; one ``Outcome`` per request, in order."""
    from tqdm.auto import tqdm

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    outcomes = [Outcome(r) for r in load]
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url.rstrip("/").removesuffix("/v1"),
                                 headers=headers, timeout=timeout_s, limits=limits) as client:
        bar = tqdm(total=len(load), desc="requests", disable=not progress)
        t0 = time.perf_counter()

        async def tracked(req, out):
            await _one(client, model, req, t0, out, extra or {})
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
