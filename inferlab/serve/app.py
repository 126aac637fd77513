"""The FastAPI application: the OpenAI Completions and Chat Completions APIs over an ``OnlineEngine``.

``create_app(engine, tokenizer, model_name)`` returns an ASGI app (run it with uvicorn, as
``python -m inferlab.serve`` does, or on a local port with ``inferlab.serve.background``). Its
routes are the module-level handlers below; what they share (the engine, the tokenizer, the
tenants, the metrics, the limits) is one ``Server`` on ``app.state.server``.

- ``POST /v1/completions`` and ``POST /v1/chat/completions`` take one path, ``generate``: the
  body is parsed once (``parse``: the JSON, then ``inferlab.serve.protocol``'s types; a chat's
  messages are first rendered into a prompt, ``inferlab.serve.chat``), the API key is mapped to
  a tenant (``inferlab.serve.tenants``), the prompt tokenized and the request submitted to the
  engine, which checks it (``inferlab.validation``) and answers with its ``Stream``. The
  answer is one completion, or Server-Sent Events (sse-starlette), one chunk per token as the
  engine produces it, in the endpoint's shape (``protocol.TextShape`` or ``ChatShape``). Text
  is detokenized incrementally (``protocol.Detokenizer``), holding back (an empty chunk) what may
  be the start of a stop string or a character split across tokens. A stop string ends the
  request with an abort, which frees its blocks at once; so does a client that hangs up
  mid-stream.
- Every error is an ``APIError`` (``inferlab.serve.errors``) in OpenAI's shape, and names the
  field as the client sent it (a chat's ``messages``, its ``max_completion_tokens``). A request
  the engine cannot serve is a 400; with ``max_waiting`` requests already queued the server
  answers 429 with ``Retry-After`` rather than queueing without bound; while
  it drains or if the engine loop died, 503. An error inside the engine ends only the requests
  it hit: a 500 (streaming: an error object, then ``[DONE]``, as vLLM does), while the engine
  serves the rest.
- Structured outputs: a body's ``response_format`` (JSON schema or any JSON object),
  ``structured_outputs`` (vLLM's: ``json``, ``regex``, ``choice``, ``grammar``,
  ``json_object``) or, on ``/v1/responses``, ``text.format`` is read once
  (``CompletionRequest.constraint``) and compiled by XGrammar (``inferlab.serving.structured``,
  loaded at the first such request, on a worker thread so the event loop serves on); the
  compiled grammar rides on the engine request, whose runner masks that row's logits at every
  step. A schema or pattern it cannot compile is a 400 naming the field.
- ``POST /v1/responses`` (OpenAI's Responses API, ``inferlab.serve.responses``) takes the same
  path in its own shape (``ResponseShape``: a ``response`` object, or typed events), and keeps
  the responses it stores for ``previous_response_id`` and ``GET /v1/responses/{id}``.
- ``GET /v1/models``, ``GET /health`` (200, or 503 while draining or if the engine loop
  stopped), ``GET /metrics`` (Prometheus text, ``inferlab.serving.metrics``).
- It logs a banner when it starts and serving stats every ``stats_interval_s`` seconds
  (``inferlab.serve.logs``). Shutdown (uvicorn's, on SIGTERM or ``should_exit``) stops
  accepting, lets the open requests finish, then the lifespan hook drains and stops the engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferlab.model.chat_template import load_chat_template
from inferlab.serve.chat import client_names, completion_body
from inferlab.serve.errors import APIError, error_body
from inferlab.serve.logs import StatsLogger, banner, log
from inferlab.serve.protocol import (API_NAMES, ChatShape, CompletionRequest, Detokenizer,
                                     TextShape, model_list, single_prompt, usage)
from inferlab.serve.responses import NAMES, ResponseShape, ResponseStore
from inferlab.serve.responses import completion_body as response_body
from inferlab.serve.tenants import Tenants, TenantLimitError, UnknownKeyError
from inferlab.serving.metrics import ServerMetrics
from inferlab.serving.online import EngineClosedError
from inferlab.serving.request import Request as EngineRequest
from inferlab.validation import InvalidRequestError


@dataclass
class Server:
    """What the handlers share: the engine and its tokenizer, the served name, the tenants, the
    metrics and the limits, and the engine's timing of each finished request (``records``)."""

    engine: object                  # an OnlineEngine
    tokenizer: object
    model_name: str
    tenants: Tenants
    metrics: ServerMetrics
    max_waiting: int
    template: str | None            # the tokenizer's chat template (None: no chat route)
    eos_ids: tuple[int, ...]
    started: int = field(default_factory=lambda: int(time.time()))  # "created" in /v1/models
    draining: bool = False
    records: deque = field(default_factory=lambda: deque(maxlen=100_000))
    responses: ResponseStore = field(default_factory=ResponseStore)  # stored responses
    grammars: object = None         # inferlab.serving.structured.Grammars, made when first asked


# -- the one parse ---------------------------------------------------------------------------
async def json_body(request: Request) -> dict:
    """The request's body as a JSON object, or a 400."""
    try:
        data = json.loads(await request.body())
    except ValueError as e:
        raise APIError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object")
    return data


def parse(body: dict, names: dict[str, str]) -> CompletionRequest:
    """``body`` as a ``CompletionRequest``, or a 400 whose ``param`` is the field as the client
    sent it (``names`` maps the body's field names to the client's)."""
    try:
        return CompletionRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = names.get(str(err["loc"][0]), str(err["loc"][0])) if err["loc"] else None
        why = err.get("ctx", {}).get("error") or err["msg"]  # our own message, if ours
        raise APIError(400, f"{param}: {why}", param=param) from None


# -- the routes ------------------------------------------------------------------------------
async def completions(request: Request):
    """``POST /v1/completions``."""
    return await generate(request, await json_body(request), TextShape(), {})


async def chat_completions(request: Request):
    """``POST /v1/chat/completions``: the messages rendered into a prompt, then ``generate``."""
    server: Server = request.app.state.server
    data = await json_body(request)
    if server.template is None:
        raise APIError(400, "this model's tokenizer has no chat template; use "
                       "/v1/completions", param="messages")
    if "prompt" in data:
        raise APIError(400, "a chat request has messages, not a prompt", param="prompt")
    try:
        body = completion_body(data, server.template, server.tokenizer,
                               server.engine.model.config.max_seq_len)
    except ValueError as e:
        param, message = e.args
        raise APIError(400, message, param=param) from None
    return await generate(request, body, ChatShape(), client_names(data))


async def responses(request: Request):
    """``POST /v1/responses``: the input (and an earlier stored response's conversation)
    rendered into a prompt, then ``generate``; a stored response is kept for later turns."""
    server: Server = request.app.state.server
    data = await json_body(request)
    if server.template is None:
        raise APIError(400, "this model's tokenizer has no chat template; use "
                       "/v1/completions", param="input")
    try:
        body, turns = response_body(data, server.template, server.tokenizer,
                                    server.engine.model.config.max_seq_len, server.responses)
    except ValueError as e:
        param, message = e.args
        raise APIError(400, message, param=param) from None
    except LookupError as e:
        raise APIError(404, f"no stored response has the id {e.args[0]!r} (this server keeps "
                       f"the newest {server.responses.capacity} responses stored)",
                       param="previous_response_id", code="response_not_found") from None
    keep = data.get("store", True) is not False
    shape = ResponseShape(data, (lambda r: server.responses.put(r, turns)) if keep else None)
    return await generate(request, body, shape, NAMES)


async def stored_response(request: Request):
    """``GET /v1/responses/{response_id}``: a stored response, or a 404."""
    server: Server = request.app.state.server
    rid = request.path_params["response_id"]
    stored = server.responses.get(rid)
    if stored is None:
        raise APIError(404, f"no stored response has the id {rid!r}",
                       code="response_not_found")
    return stored[1]


async def generate(request: Request, body: dict, shape, names: dict[str, str]):
    """Run one completion ``body`` through the engine and answer in ``shape``: the one path of
    both generation endpoints. ``names`` maps the body's field names to the client's."""
    server: Server = request.app.state.server
    engine, tenants, metrics, tokenizer = (server.engine, server.tenants, server.metrics,
                                           server.tokenizer)
    req = parse(body, names)
    if req.model != server.model_name:
        raise APIError(404, f"the model {req.model!r} does not exist; this server serves "
                       f"{server.model_name!r}", param="model", code="model_not_found")
    try:
        tenant = tenants.tenant_of(request.headers.get("authorization"))
        prompt = single_prompt(req.prompt)
    except UnknownKeyError as e:
        raise APIError(401, str(e), code="invalid_api_key") from None
    except ValueError as e:
        raise APIError(400, str(e), param=names.get("prompt", "prompt")) from None
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    try:
        constraint = req.constraint()
    except ValueError as e:
        param, message = e.args[0]
        raise APIError(400, message, param=names.get(param, param)) from None
    grammar = None if constraint is None else await compile_grammar(server, constraint, names)
    er = EngineRequest(tuple(ids), req.max_tokens, eos_token_ids=() if req.ignore_eos
                       else server.eos_ids, temperature=req.temperature, seed=req.seed,
                       cache_salt=tenants.cache_salt(tenant), top_k=req.top_k, top_p=req.top_p,
                       grammar=grammar)
    stream = submit(server, er, tenant, {k: names.get(v, v) for k, v in API_NAMES.items()})
    cid, detok = shape.new_id(), Detokenizer(tokenizer, req.stops)
    created, n_prompt = int(time.time()), len(er.prompt)  # this response's creation time

    def finish(reason_if_aborted: str, first_chunk_s: float | None = None) -> str:
        """The finish reason; record the engine's timing of the request (with, for a stream,
        when its first chunk went to the HTTP layer, on the engine's clock)."""
        fin = stream.finished
        reason = "stop" if detok.stopped else fin.reason if fin else reason_if_aborted
        timing = fin.timing if fin else None
        metrics.finished(tenant, reason, timing)
        if timing is not None:
            server.records.append({"id": cid, "tenant": tenant, "reason": reason,
                                   "arrival_s": timing.arrival_s,
                                   "token_times_s": timing.token_times_s,
                                   "first_chunk_s": first_chunk_s})
        return reason

    def done() -> None:  # whatever happened: free what the request holds, count its tokens
        if stream.finished is None:  # a stop string, an error here, or the client went away
            engine.abort(stream)
        metrics.tokens(n_prompt, len(stream.tokens))
        tenants.release(tenant)

    if req.stream:
        async def events():
            reason, first_chunk_s, usage_field = "abort", None, req.include_usage
            try:
                for event in shape.opening(cid, server.model_name, created):
                    yield shape.sse(event)
                async for token in stream:
                    delta = detok.push(token)
                    if detok.stopped:
                        break
                    # a chunk per token, even when its text is held back (""), so that a
                    # client's chunk times are token times
                    chunk = shape.sse(shape.chunk(cid, server.model_name, delta, None, created,
                                                  usage_field))
                    if first_chunk_s is None:
                        first_chunk_s = engine.clock.now()
                    yield chunk
                delta = detok.flush()
                reason = finish("stop", first_chunk_s)
                if reason == "error":
                    ending = shape.failure(cid, server.model_name, created,
                                           engine_failed(stream).body)
                else:
                    ending = shape.closing(cid, server.model_name, delta, reason, created,
                                           usage(n_prompt, len(stream.tokens)), usage_field,
                                           cached_tokens(stream))
                for event in ending:
                    yield shape.sse(event)
            finally:
                if reason == "abort" and stream.finished is None:
                    metrics.finished(tenant, "abort", None)
                done()
        return EventSourceResponse(events(), sep="\n")

    try:
        text = []
        async for token in stream:
            text.append(detok.push(token))
            if detok.stopped:
                break
        text.append(detok.flush())
        reason = finish("stop")
    finally:
        done()
    if reason == "error":
        raise engine_failed(stream)
    return shape.response(cid, server.model_name, "".join(text), reason,
                          usage(n_prompt, len(stream.tokens)), created, cached_tokens(stream))


async def compile_grammar(server: Server, constraint: tuple, names: dict[str, str]):
    """The compiled grammar of ``constraint`` (``(kind, spec, field)``), compiled on a worker
    thread; the server's ``Grammars`` is made at the first call. A 400 naming the field when it
    cannot be compiled, a 501 when XGrammar is not installed."""
    kind, spec, param = constraint
    try:
        from inferlab.serving.structured import Grammars

        if server.grammars is None:
            server.grammars = await asyncio.to_thread(
                Grammars, server.tokenizer, server.engine.model.config.vocab_size, server.eos_ids)
        return await asyncio.to_thread(server.grammars.compile, kind, spec)
    except ImportError as e:
        raise APIError(501, str(e), "server_error", param=names.get(param, param)) from None
    except ValueError as e:
        raise APIError(400, f"{names.get(param, param)}: {e}",
                       param=names.get(param, param)) from None


def cached_tokens(stream) -> int:
    """The prompt tokens a prefix cache held when the request was first admitted."""
    return stream.seq.num_cached


def submit(server: Server, er: EngineRequest, tenant: str, names: dict[str, str]):
    """Hand ``er`` to the engine for ``tenant``: its ``Stream``, or the error that refuses it
    (503 while draining; 429 at the queue's or the tenant's limit; 400, in the client's field
    ``names``, if the engine cannot serve it)."""
    engine, tenants, metrics = server.engine, server.tenants, server.metrics
    if server.draining or not engine.alive:
        raise APIError(503, "the server is shutting down", "server_error", retry=True)
    if engine.num_waiting >= server.max_waiting:
        metrics.rejected(tenant)
        raise APIError(429, f"{engine.num_waiting} requests are queued already; retry later",
                       "rate_limit_error", retry=True)
    try:
        tenants.acquire(tenant)
    except TenantLimitError as e:
        metrics.rejected(tenant)
        raise APIError(429, str(e), "rate_limit_error", retry=True) from None
    try:  # the engine checks the request (once) and queues it
        return engine.submit(er, loop=asyncio.get_running_loop(), names=names)
    except InvalidRequestError as e:
        tenants.release(tenant)
        raise APIError(400, str(e), param=e.field) from None
    except EngineClosedError as e:
        tenants.release(tenant)
        raise APIError(503, str(e), "server_error", retry=True) from None


def engine_failed(stream) -> APIError:
    """The 500 of a request that an error inside the engine ended (the engine serves on)."""
    why = stream.finished.error if stream.finished else None
    return APIError(500, why or "the engine failed while serving this request", "server_error")


async def models(request: Request):
    server: Server = request.app.state.server
    return model_list([server.model_name], server.started)


async def health(request: Request):
    server: Server = request.app.state.server
    if server.draining or not server.engine.alive:
        return JSONResponse({"status": "draining" if server.engine.alive else "dead"}, 503)
    return {"status": "ok"}


async def prometheus(request: Request):
    return Response(request.app.state.server.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def api_error(request: Request, exc: APIError):
    return exc.response()


async def http_error(request: Request, exc: StarletteHTTPException):
    return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), exc.status_code)


# -- the app ---------------------------------------------------------------------------------
def create_app(engine, tokenizer, model_name: str, max_waiting: int = 64,
               tenants: Tenants | None = None, drain_timeout_s: float = 30.0,
               stats_interval_s: float = 10.0) -> FastAPI:
    """An app serving ``engine`` (an ``OnlineEngine``) as ``model_name``; it logs a banner at
    startup and serving stats every ``stats_interval_s`` seconds (0: never)."""
    eos = tokenizer.eos_token_id
    path = getattr(tokenizer, "path", None)  # a test's stand-in tokenizer may have none
    server = Server(engine, tokenizer, model_name, tenants or Tenants(), ServerMetrics(engine),
                    max_waiting, load_chat_template(path) if path else None,
                    tuple(eos) if isinstance(eos, (list, tuple)) else
                    (() if eos is None else (eos,)))

    @asynccontextmanager
    async def lifespan(app):
        log.info(banner(engine, model_name))
        stats = None
        if stats_interval_s > 0:
            stats = asyncio.create_task(StatsLogger(engine, server.metrics,
                                                    stats_interval_s).run())
        yield
        if stats is not None:
            stats.cancel()
        server.draining = True
        await asyncio.to_thread(engine.shutdown, True, drain_timeout_s)

    app = FastAPI(title="inferlab", lifespan=lifespan)
    app.state.server = server
    # the parts a notebook or a test reads
    app.state.engine, app.state.metrics = engine, server.metrics
    app.state.tenants, app.state.records = server.tenants, server.records
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/responses", responses, methods=["POST"])
    app.add_api_route("/v1/responses/{response_id}", stored_response, methods=["GET"])
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", prometheus, methods=["GET"])
    return app
