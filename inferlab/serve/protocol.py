"""The wire format of ``/v1/completions``: what a client sends and what it gets back.

The bodies follow OpenAI's legacy Completions API, the one vLLM and SGLang also serve, so the
official ``openai`` client and any load generator written for those engines work unchanged:
``prompt`` (text, or token ids), ``max_tokens`` (default 16), ``temperature`` (default 1, at
most 2; a temperature below 1e-5, ``inferlab.model.sampling.GREEDY_BELOW``, decodes greedily,
as 0 does), ``top_p`` and vLLM's ``top_k`` (sampling among the likeliest tokens only), ``stop``
(a string or a list of up to four), ``stream`` (Server-Sent Events, one chunk per token, then
``data: [DONE]``), ``seed`` (a 64-bit signed integer: the same seed and prompt give the same
tokens whatever else the server is running), ``stream_options`` (``include_usage``: a last
chunk with the token counts), ``user`` (accepted), and vLLM's ``ignore_eos`` (generate exactly
``max_tokens``, as a load generator wants). ``null`` stands for a field's default. The fields
it does not implement (``logprobs``, ``echo``, the penalties, ``n`` > 1, ``best_of``,
``logit_bias``, ``suffix``, and vLLM's ``min_p`` and ``min_tokens``) are refused with a 400
that names the field unless they ask for the default (``NOT_IMPLEMENTED``): a client is never
silently given something other than what it asked for. Other unknown fields are ignored, as
vLLM ignores them. Each response carries the time it was made (``created``).

The same request comes back in one of two *shapes*, one per generation endpoint, built per
request (a chat stream's first chunk carries the assistant's role, the later ones do not):
``TextShape``, OpenAI's legacy Completions objects (``text_completion``), and ``ChatShape``,
Chat Completions objects (``chat.completion`` with a ``message``, and, when streaming,
``chat.completion.chunk`` objects whose ``delta`` holds the role (first chunk) and the new
``content``; the finishing chunk has an empty delta and the ``finish_reason``, as OpenAI's API
and vLLM send them). A shape builds the four things a handler sends: a response (``stream``
false), a streamed chunk, the last chunk's finish reason, and the usage chunk of
``stream_options.include_usage``.

The text of either shape is detokenized incrementally (``Detokenizer``): the tokens so far
decoded whole, each delta cut at the first stop string, and a tail that could still grow into
one (or a character split across tokens) held back until it cannot.

Errors carry OpenAI's body (``inferlab.serve.errors``), with a 4xx status for a bad request and
429/503 for overload.
"""

from __future__ import annotations

import json
import time
import uuid

from pydantic import BaseModel, ConfigDict, field_validator


class StreamOptions(BaseModel):
    """``stream_options``: with ``include_usage``, one more chunk before ``[DONE]`` carries the
    request's token counts (``choices`` empty), and every other chunk has ``"usage": null``."""

    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: bool | None = False


# OpenAI fields (and vLLM's common sampling extensions) that this server does not implement:
# accepted at the value that means "off", which is what a client that spells out every field
# sends, and refused with a 400 that names the field at any other value, rather than ignored.
NOT_IMPLEMENTED = {
    "best_of": ((None, 1), "one completion is generated per request"),
    "echo": ((None, False), "the prompt is not echoed back"),
    "frequency_penalty": ((None, 0), "no repetition penalties are applied"),
    "presence_penalty": ((None, 0), "no repetition penalties are applied"),
    "repetition_penalty": ((None, 1), "no repetition penalties are applied"),
    "logit_bias": ((None, {}), "logits are not biased"),
    "logprobs": ((None,), "log probabilities are not returned"),
    "suffix": ((None, ""), "there is no insertion mode"),
    "min_p": ((None, 0), "sampling draws from the whole distribution (no min-p)"),
    "min_tokens": ((None, 0), "generation may end at the first end-of-sequence token"),
    # vLLM's names before v0.12.0, which removed them (its structured-outputs page)
    **{f"guided_{kind}": ((None,), f"vLLM removed guided_{kind} in v0.12.0; send "
                                   f"structured_outputs={{'{kind}': ...}} instead")
       for kind in ("json", "regex", "choice", "grammar")},
}
# Structured outputs, as vLLM spells them (``structured_outputs``, one of these keys) and as
# OpenAI's ``response_format`` types map onto them (``structured``).
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


class CompletionRequest(BaseModel):
    """The body of POST /v1/completions. Unknown fields are allowed (clients send extras) and
    ignored, as vLLM does, except the ones in ``NOT_IMPLEMENTED``.

    Strict, as JSON's types are: ``true`` is not a number, ``"5"`` not an integer (an integer
    is a number, though). ``null`` means the default, as in OpenAI's API.
    """

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    # Types are checked here; ranges by the engine's own check (``validate_request``, with
    # ``API_NAMES``), the one every front door runs: max_tokens >= 1 and within the context,
    # temperature in [0, 2] (below 1e-5: greedy), seed a 64-bit signed integer.
    max_tokens: int | None = 16
    temperature: float | None = 1.0
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int | None = 1  # one completion per request
    user: str | None = None  # accepted: it only names the end user
    ignore_eos: bool = False  # vLLM's extension: run to max_tokens (load generators use it)
    best_of: int | None = None
    echo: bool | None = False
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    repetition_penalty: float | None = 1.0
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    suffix: str | None = None
    top_p: float | None = 1.0  # nucleus sampling: the smallest set of tokens with this mass
    top_k: int | None = 0  # vLLM's extension: the k likeliest tokens (0 or -1: all)
    min_p: float | None = 0.0
    min_tokens: int | None = 0
    guided_json: object = None
    guided_regex: object = None
    guided_choice: object = None
    guided_grammar: object = None
    # structured outputs: vLLM's field, and OpenAI's (Chat Completions; vLLM takes it on
    # Completions too); checked by ``constraint``
    structured_outputs: dict | None = None
    response_format: dict | None = None

    @field_validator("max_tokens", "temperature", "stream", "top_p", mode="after")
    @classmethod
    def _null_is_the_default(cls, value, info):
        return cls.model_fields[info.field_name].default if value is None else value

    @field_validator("top_k", mode="after")
    @classmethod
    def _all_tokens(cls, top_k):
        return 0 if top_k in (None, -1) else top_k  # the engine's "off"

    @field_validator("n", mode="after")
    @classmethod
    def _one_completion(cls, n):
        if n not in (None, 1):
            raise ValueError(f"n={n}: this server returns one completion per request; send "
                             f"{n} requests (with different seeds) instead")
        return 1

    @field_validator(*NOT_IMPLEMENTED, mode="after")
    @classmethod
    def _refuse_what_is_not_implemented(cls, value, info):
        off, why = NOT_IMPLEMENTED[info.field_name]
        if value not in off:
            raise ValueError(f"{info.field_name}={value!r} is not supported by this server: "
                             f"{why}; leave it out")
        return value

    @field_validator("stop")
    @classmethod
    def _at_most_four(cls, stop):
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences")
        return stop

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop or [] if s]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def constraint(self) -> tuple[str, object, str] | None:
        """The structured output this request asks for, as ``(kind, spec, field)``: ``kind``
        one of ``STRUCTURED_KINDS`` (``inferlab.serving.structured.Grammars.compile`` takes
        it), ``field`` where it came from (for an error's ``param``); None for free text.
        Raises ``ValueError((param, message))`` for a malformed or unsupported one."""
        so, rf = self.structured_outputs, self.response_format
        if so is not None and rf is not None and rf.get("type") != "text":
            raise ValueError(("response_format", "send structured_outputs or response_format, "
                                                 "not both"))
        found = structured(so) if so is not None else response_format(rf) if rf else None
        if found is not None and self.ignore_eos:
            raise ValueError(("ignore_eos", "a structured output ends when its text is "
                                            "complete; ignore_eos cannot be used with it"))
        return found


def structured(so: dict) -> tuple[str, object, str]:
    """vLLM's ``structured_outputs``: exactly one of ``STRUCTURED_KINDS`` (``json`` a schema,
    ``regex`` a pattern, ``choice`` a list of strings, ``grammar`` EBNF, ``json_object`` true);
    its whitespace options are accepted (this server never puts whitespace between JSON
    tokens); ``structural_tag`` and other keys are refused."""
    given = [k for k in STRUCTURED_KINDS if so.get(k) is not None]
    if len(given) != 1:
        raise ValueError(("structured_outputs", "structured_outputs takes exactly one of "
                          f"{', '.join(STRUCTURED_KINDS)}; got {len(given)}"))
    other = set(so) - set(STRUCTURED_KINDS) - {"disable_any_whitespace", "whitespace_pattern",
                                               "disable_additional_properties"}
    if other:
        key = sorted(other)[0]
        raise ValueError((f"structured_outputs.{key}", f"structured_outputs.{key} is not "
                          "supported by this server (structural tags are not implemented)"))
    kind = given[0]
    if kind == "json_object" and so[kind] is not True:
        raise ValueError(("structured_outputs.json_object", "json_object must be true"))
    return kind, so[kind], f"structured_outputs.{kind}"


def response_format(rf) -> tuple[str, object, str] | None:
    """OpenAI's ``response_format`` (Chat Completions): ``{"type": "text"}`` (free text),
    ``{"type": "json_object"}``, or ``{"type": "json_schema", "json_schema": {"name",
    "schema", "strict", "description"}}``."""
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_object", True, "response_format"
    if kind != "json_schema":
        raise ValueError(("response_format.type", "response_format.type must be text, "
                          f"json_object or json_schema, got {kind!r}"))
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(("response_format.json_schema", "response_format.json_schema must "
                          "be an object with a name and a schema"))
    if not isinstance(spec.get("schema"), dict):
        raise ValueError(("response_format.json_schema.schema", "response_format.json_schema"
                          ".schema must be a JSON schema (an object)"))
    return "json", spec["schema"], "response_format.json_schema.schema"


# The engine's field names, as this API spells them (for the engine check's messages; a chat
# request renames these once more, ``inferlab.serve.chat.client_names``).
API_NAMES = {"max_new_tokens": "max_tokens", "prompt": "prompt"}


def single_prompt(prompt) -> str | list[int]:
    """The one prompt of a request: text or token ids. A batch of prompts is refused."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ValueError("this server takes one prompt per request; send a batch as "
                             "separate requests")
        return prompt[0]
    return prompt


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def completion(cid: str, model: str, text: str, finish_reason: str | None,
               usage: dict | None = None, created: int | None = None,
               usage_field: bool = False) -> dict:
    """A completion object (``stream`` false), or one streamed chunk of one. ``usage`` is
    included when given, or as null with ``usage_field`` (the chunks of a stream whose usage
    comes on a chunk of its own, ``usage_chunk``)."""
    body = {"id": cid, "object": "text_completion", "created": created or int(time.time()),
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": finish_reason}]}
    if usage is not None or usage_field:
        body["usage"] = usage
    return body


def usage_chunk(cid: str, model: str, usage: dict, created: int) -> dict:
    """A stream's last chunk under ``stream_options.include_usage``: no choices, the usage."""
    return {"id": cid, "object": "text_completion", "created": created, "model": model,
            "choices": [], "usage": usage}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def model_list(names: list[str], created: int) -> dict:
    """The body of GET /v1/models."""
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created,
                                        "owned_by": "inferlab"} for n in names]}


class Shape:
    """How a stream of the two legacy shapes runs: nothing before the first token, a chunk per
    token, then a chunk with the finish reason, the usage chunk if asked for, and ``[DONE]``;
    an engine failure is an error object, then ``[DONE]``, as vLLM sends it. (The Responses
    API's typed events are ``inferlab.serve.responses.ResponseShape``.)"""

    def opening(self, cid, model, created) -> list:
        return []

    def closing(self, cid, model, delta, reason, created, usage, usage_field, cached=0) -> list:
        events = [self.chunk(cid, model, delta, reason, created, usage_field)]
        if usage_field:
            events.append(self.usage_chunk(cid, model, usage, created))
        return events + ["[DONE]"]

    def failure(self, cid, model, created, body: dict) -> list:
        return [body, "[DONE]"]

    @staticmethod
    def sse(event):
        """One event as sse-starlette sends it: a data line."""
        return event if isinstance(event, str) else json.dumps(event)


class TextShape(Shape):
    """``/v1/completions``: ``text_completion`` objects."""

    def new_id(self) -> str:
        return completion_id()

    def response(self, cid, model, text, reason, usage, created, cached=0) -> dict:
        return completion(cid, model, text, reason, usage, created)

    def chunk(self, cid, model, delta, reason, created, usage_field) -> dict:
        return completion(cid, model, delta, reason, None, created, usage_field)

    def usage_chunk(self, cid, model, usage, created) -> dict:
        return usage_chunk(cid, model, usage, created)


class ChatShape(Shape):
    """``/v1/chat/completions``: ``chat.completion`` and ``chat.completion.chunk`` objects."""

    def __init__(self):
        self._role_sent = False

    def new_id(self) -> str:
        return f"chatcmpl-{uuid.uuid4().hex}"

    @staticmethod
    def _head(cid, obj, model, created) -> dict:
        return {"id": cid, "object": obj, "created": created or int(time.time()), "model": model}

    def response(self, cid, model, text, reason, usage, created, cached=0) -> dict:
        return {**self._head(cid, "chat.completion", model, created),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": None, "finish_reason": reason}],
                "usage": usage}

    def chunk(self, cid, model, delta, reason, created, usage_field) -> dict:
        d = {} if reason is not None and not delta else {"content": delta}
        if not self._role_sent:  # the first chunk says whose turn this is
            d = {"role": "assistant", **({"content": delta} if reason is None else d)}
            self._role_sent = True
        body = {**self._head(cid, "chat.completion.chunk", model, created),
                "choices": [{"index": 0, "delta": d, "logprobs": None,
                             "finish_reason": reason}]}
        if usage_field:
            body["usage"] = None
        return body

    def usage_chunk(self, cid, model, usage, created) -> dict:
        return {**self._head(cid, "chat.completion.chunk", model, created), "choices": [],
                "usage": usage}


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
