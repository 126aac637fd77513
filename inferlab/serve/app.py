"""The FastAPI application: the OpenAI Completions API over an ``OnlineEngine``.

``create_app(engine, tokenizer, model_name)`` returns an ASGI app (run it with uvicorn, as
``python -m inferlab.serve`` does, or on a local port with ``inferlab.serve.background``):

- ``POST /v1/completions``: validates the body (``inferlab.serve.protocol``), maps the API key
  to a tenant (``inferlab.serve.tenants``), tokenizes, submits to the engine and answers with
  one completion, or with Server-Sent Events (sse-starlette), one chunk per token as the engine
  produces it. Text is detokenized incrementally (``Detokenizer``), holding back (an empty
  chunk) what may be the start of a stop string or a character split across tokens. A stop
  string ends the request with an abort, which frees its blocks at once; so does a client that
  hangs up mid-stream.
- Overload: with ``max_waiting`` requests already queued the server answers 429 with
  ``Retry-After`` rather than queueing without bound; while it drains or if the engine loop
  died, 503.
- A request the engine cannot serve is refused with a 400 whose ``param`` names the field, by
  the engine's own check (``OnlineEngine.check``), before it is queued. An error inside the
  engine ends only the requests it hit: a 500 (streaming: an error object, then ``[DONE]``, as
  vLLM does), while the engine serves the rest.
- It logs a banner when it starts and serving stats every ``stats_interval_s`` seconds
  (``inferlab.serve.logs``).
- ``POST /v1/chat/completions``: the same, for a conversation rendered into a prompt by the
  tokenizer's chat template, answered in the Chat Completions format (``inferlab.serve.chat``;
  both endpoints share one handler and differ in their response shape, ``inferlab.serve.shapes``).
- ``GET /v1/models``, ``GET /health`` (200, or 503 while draining or if the engine loop
  stopped), ``GET /metrics``
  (Prometheus text, ``inferlab.serve.metrics``).
- Shutdown (uvicorn's, on SIGTERM or ``should_exit``) stops accepting, lets the open requests
  finish, then the lifespan hook drains and stops the engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferlab.serve.chat import add_chat_route
from inferlab.serve.errors import APIError
from inferlab.serve.logs import StatsLogger, banner, log
from inferlab.serve.metrics import ServerMetrics
from inferlab.serve.protocol import (API_NAMES, CompletionRequest, error_body, model_list,
                                     single_prompt, usage)
from inferlab.serve.shapes import TextShape
from inferlab.serve.tenants import Tenants, TenantLimitError, UnknownKeyError
from inferlab.serving.online import EngineClosedError
from inferlab.serving.request import InvalidRequestError
from inferlab.serving.request import Request as EngineRequest

class Detokenizer:
    """Token ids in, text deltas out, cut at the first stop string.

    The text so far is decoded whole each time (byte-level BPE may split a character across
    tokens, shown as U+FFFD until its last byte arrives), and a tail that could still grow into a
    stop string is held back until it cannot.
    """

    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.text = ""       # emitted so far
        self.stopped = False  # a stop string matched

    def push(self, token: int) -> str:
        self.ids.append(token)
        return self._emit(final=False)

    def flush(self) -> str:
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self.stopped:
            return ""
        full = self.tokenizer.decode(self.ids)
        cut = min((i for i in (full.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            full, self.stopped, final = full[:cut], True, True
        end = len(full)
        if not final:
            if full.endswith("\ufffd"):
                return ""
            for s in self.stops:  # the longest tail that is a proper start of a stop string
                for k in range(min(len(s) - 1, len(full)), 0, -1):
                    if full.endswith(s[:k]):
                        end = min(end, len(full) - k)
                        break
        delta = full[len(self.text):end] if end > len(self.text) else ""
        self.text += delta
        return delta


def create_app(engine, tokenizer, model_name: str, max_waiting: int = 64,
               tenants: Tenants | None = None, drain_timeout_s: float = 30.0,
               stats_interval_s: float = 10.0) -> FastAPI:
    """An app serving ``engine`` (an ``OnlineEngine``) as ``model_name``; it logs a banner at
    startup and serving stats every ``stats_interval_s`` seconds (0: never)."""
    tenants = tenants or Tenants()
    metrics = ServerMetrics(engine)
    started = int(time.time())  # the model's "created" in /v1/models
    eos = tokenizer.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))

    @asynccontextmanager
    async def lifespan(app):
        log.info(banner(engine, model_name))
        stats = None
        if stats_interval_s > 0:
            stats = asyncio.create_task(StatsLogger(engine, metrics, stats_interval_s).run())
        yield
        if stats is not None:
            stats.cancel()
        app.state.draining = True
        await asyncio.to_thread(engine.shutdown, True, drain_timeout_s)

    app = FastAPI(title="inferlab", lifespan=lifespan)
    app.state.draining = False
    app.state.engine, app.state.metrics, app.state.tenants = engine, metrics, tenants
    app.state.records = deque(maxlen=100_000)  # the engine's own timing of each request

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), exc.status_code)

    def parse(body: bytes) -> CompletionRequest:
        try:
            data = json.loads(body)
        except ValueError as e:
            raise APIError(400, f"the body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise APIError(400, "the body must be a JSON object")
        try:
            return CompletionRequest.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            param = str(err["loc"][0]) if err["loc"] else None  # the body's field at fault
            why = err.get("ctx", {}).get("error") or err["msg"]  # our own message, if ours
            raise APIError(400, f"{param}: {why}", param=param) from None

    def engine_request(req: CompletionRequest, tenant: str) -> EngineRequest:
        try:
            prompt = single_prompt(req.prompt)
        except ValueError as e:
            raise APIError(400, str(e), param="prompt") from None
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        er = EngineRequest(tuple(ids), req.max_tokens,
                           eos_token_ids=() if req.ignore_eos else eos_ids,
                           temperature=req.temperature, seed=req.seed,
                           cache_salt=tenants.cache_salt(tenant), top_k=req.top_k,
                           top_p=req.top_p)
        try:  # the engine's own check, in this API's field names: refused here, alone
            engine.check(er, API_NAMES)
        except InvalidRequestError as e:
            raise APIError(400, str(e), param=e.field) from None
        return er

    def finish(cid, tenant, stream, detok, reason_if_aborted, first_chunk_s=None):
        """The finish reason, and the record of the engine's timing (with, for a stream, when
        the handler passed its first token's chunk to the HTTP layer, on the engine's clock)."""
        fin = stream.finished
        reason = "stop" if detok.stopped else fin.reason if fin else reason_if_aborted
        timing = fin.timing if fin else None
        metrics.finished(tenant, reason, timing)
        if timing is not None:
            app.state.records.append({"id": cid, "tenant": tenant, "reason": reason,
                                      "arrival_s": timing.arrival_s,
                                      "token_times_s": timing.token_times_s,
                                      "first_chunk_s": first_chunk_s})
        return reason

    def engine_failed(stream) -> APIError:
        """The 500 of a request that an error inside the engine ended (the engine serves on)."""
        why = stream.finished.error if stream.finished else None
        return APIError(500, why or "the engine failed while serving this request",
                        "server_error")

    @app.post("/v1/completions")
    async def completions(request: Request):
        received = engine.clock.now()  # the request's arrival, for the engine's timing of it
        return await serve(request, parse(await request.body()), received, TextShape())

    async def serve(request: Request, req: CompletionRequest, received: float, shape):
        """Run ``req`` and answer in ``shape`` (``inferlab.serve.shapes``): the one path of
        both generation endpoints."""
        if req.model != model_name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves "
                           f"{model_name!r}", param="model", code="model_not_found")
        try:
            tenant = tenants.tenant_of(request.headers.get("authorization"))
        except UnknownKeyError as e:
            raise APIError(401, str(e), code="invalid_api_key") from None
        er = engine_request(req, tenant)  # a bad request is a 400 whatever the load
        if app.state.draining or not engine.alive:
            raise APIError(503, "the server is shutting down", "server_error", retry=True)
        if engine.num_waiting >= max_waiting:
            metrics.rejected(tenant)
            raise APIError(429, f"{engine.num_waiting} requests are queued already; retry "
                           "later", "rate_limit_error", retry=True)
        try:
            tenants.acquire(tenant)
        except TenantLimitError as e:
            metrics.rejected(tenant)
            raise APIError(429, str(e), "rate_limit_error", retry=True) from None
        try:
            stream = engine.submit(er, loop=asyncio.get_running_loop(), arrival_s=received)
        except InvalidRequestError as e:
            tenants.release(tenant)
            raise APIError(400, str(e), param=e.field) from None
        except EngineClosedError as e:
            tenants.release(tenant)
            raise APIError(503, str(e), "server_error", retry=True) from None
        cid, detok = shape.new_id(), Detokenizer(tokenizer, req.stops)
        created, n_prompt = int(time.time()), len(er.prompt)  # this response's creation time
        with_usage = req.include_usage  # stream_options: usage on its own last chunk

        if req.stream:
            async def events():
                reason, first_chunk_s = "abort", None
                try:
                    async for token in stream:
                        delta = detok.push(token)
                        if detok.stopped:
                            break
                        # a chunk per token, even when its text is held back (""), so that a
                        # client's chunk times are token times
                        chunk = json.dumps(shape.chunk(cid, model_name, delta, None, created,
                                                       with_usage))
                        if first_chunk_s is None:
                            first_chunk_s = engine.clock.now()
                        yield chunk
                    delta = detok.flush()
                    reason = finish(cid, tenant, stream, detok, "stop", first_chunk_s)
                    if reason == "error":  # as vLLM does: an error object, then [DONE]
                        yield json.dumps(engine_failed(stream).body)
                    else:
                        yield json.dumps(shape.chunk(cid, model_name, delta, reason, created,
                                                     with_usage))
                        if with_usage:
                            yield json.dumps(shape.usage_chunk(cid, model_name, usage(
                                n_prompt, len(stream.tokens)), created))
                    yield "[DONE]"
                finally:
                    if stream.finished is None:  # a stop string, or the client went away
                        engine.abort(stream)
                        if reason == "abort":
                            metrics.finished(tenant, "abort", None)
                    metrics.tokens(n_prompt, len(stream.tokens))
                    tenants.release(tenant)
            return EventSourceResponse(events(), sep="\n")

        try:
            text = []
            async for token in stream:
                text.append(detok.push(token))
                if detok.stopped:
                    engine.abort(stream)
                    break
            text.append(detok.flush())
            reason = finish(cid, tenant, stream, detok, "stop")
        finally:
            if stream.finished is None and not detok.stopped:
                engine.abort(stream)
            metrics.tokens(n_prompt, len(stream.tokens))
            tenants.release(tenant)
        if reason == "error":
            raise engine_failed(stream)
        return shape.response(cid, model_name, "".join(text), reason,
                              usage(n_prompt, len(stream.tokens)), created)

    add_chat_route(app, serve, tokenizer, engine.model.config.max_seq_len)

    @app.get("/v1/models")
    async def models():
        return model_list([model_name], started)

    @app.get("/health")
    async def health():
        if app.state.draining or not engine.alive:
            return JSONResponse({"status": "draining" if engine.alive else "dead"}, 503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
