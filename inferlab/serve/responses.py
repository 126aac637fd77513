"""``POST /v1/responses``: OpenAI's Responses API over the same path as the other endpoints.

OpenAI recommends the Responses API for new projects, and vLLM serves it beside Chat
Completions. For a text model it is a chat request in other words: ``input`` is a string (one
user turn) or a list of messages, ``instructions`` a system turn put first, and
``max_output_tokens`` the limit; the server renders the turns with the chat template, as
``inferlab.serve.chat`` does, and runs the same ``generate`` as ``/v1/completions``
(``inferlab.serve.app``). What differs is the answer (``ResponseShape``): a ``response`` object
whose ``output`` is a list of items (here one assistant ``message`` with one ``output_text``
part), a ``status`` (``completed``, or ``incomplete`` with ``incomplete_details.reason``
``max_output_tokens`` when the limit cut it), ``usage`` in ``input_tokens``/``output_tokens``;
and, streamed, typed Server-Sent Events, each with its ``type`` as the event name and a
``sequence_number``: ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, one
``response.output_text.delta`` per token, then the ``.done`` events of the text, the part and
the item, and ``response.completed`` (or ``response.incomplete``; ``response.failed`` if the
engine failed). There is no ``[DONE]``.

Conversations. With ``store`` (true by default, as in OpenAI's API) the server keeps the
response and the turns that led to it (``ResponseStore``), so a later request can continue it
with ``previous_response_id``: its prompt is the earlier turns, the earlier reply, then the new
input (the earlier ``instructions`` are not carried over, as OpenAI documents). The store keeps
the newest ``capacity`` responses in memory and forgets the oldest, so an id can expire: a
request naming an id it does not hold gets a 404 naming ``previous_response_id``.
``GET /v1/responses/{id}`` returns a stored response. vLLM, by contrast, ignores ``store``
unless its server was started with ``VLLM_ENABLE_RESPONSES_API_STORE=1``, and its store never
forgets.

Refused with a 400 naming the field, rather than ignored: tools, reasoning, background mode,
``include``, log probabilities, stored prompt templates, conversation objects, and truncation
other than ``disabled``. ``text.format`` may be plain text, ``json_object`` or ``json_schema``
(``{"type": "json_schema", "name", "schema", "strict"}``, flat where Chat Completions nests it
under ``json_schema``); the JSON kinds become the completion body's ``structured_outputs``
(``text_format``), and an error in them names ``text.format`` or ``text.format.schema``.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict

import json

from inferlab.model.chat_template import TemplateError, render_chat
from inferlab.serve.chat import ROLES

# Responses fields this server does not implement, accepted only at their "off" value.
NOT_IMPLEMENTED = {
    "tools": ((None, []), "tool calling is not implemented"),
    "tool_choice": ((None, "none", "auto"), "tool calling is not implemented"),
    "reasoning": ((None,), "the model has no separate reasoning"),
    "background": ((None, False), "responses are generated while the request waits"),
    "include": ((None, []), "no extra output is returned"),
    "top_logprobs": ((None, 0), "log probabilities are not returned"),
    "prompt": ((None,), "stored prompt templates are not implemented"),
    "conversation": ((None,), "conversation objects are not implemented; use "
                              "previous_response_id"),
    "truncation": ((None, "disabled"), "the input is never truncated"),
    "max_tool_calls": ((None,), "tool calling is not implemented"),
}
# What the Responses API and the completion body call the same thing (client names).
NAMES = {"prompt": "input", "max_tokens": "max_output_tokens",
         "structured_outputs.json": "text.format.schema",
         "structured_outputs.json_object": "text.format"}
# The text parts a message's content may hold, by role.
TEXT_PARTS = {"assistant": ("output_text",), "user": ("input_text",),
              "system": ("input_text",), "developer": ("input_text",)}


class ResponseStore:
    """The newest ``capacity`` stored responses, each with the turns that produced it and its
    reply; the oldest is forgotten first."""

    def __init__(self, capacity: int = 1024):
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[list[dict], dict]] = OrderedDict()

    def put(self, response: dict, turns: list[dict]) -> None:
        self._items[response["id"]] = (turns, response)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, rid: str) -> tuple[list[dict], dict] | None:
        return self._items.get(rid)

    def __len__(self) -> int:
        return len(self._items)


def input_turns(value) -> list[dict]:
    """``input`` as chat turns (``{"role", "content"}`` with string content); ValueError with
    ``(param, message)`` names what is wrong."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ValueError("input", "input must be a string or a non-empty list of messages")
    turns = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            raise ValueError(where, f"{where} must be a message (a role and a content); other "
                                    "input items (tool calls, files, images) are not supported")
        role, content = item.get("role"), item.get("content")
        if role not in ROLES:
            raise ValueError(where, f"{where}.role must be one of {', '.join(ROLES)}, "
                                    f"got {role!r}")
        if isinstance(content, list):
            kinds = TEXT_PARTS[role]
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") in kinds
                        and isinstance(part.get("text"), str)):
                    raise ValueError(where, f"{where}.content[{j}]: a {role} message takes "
                                            f"only {' or '.join(kinds)} parts with a text")
            content = "".join(part["text"] for part in content)
        if not isinstance(content, str):
            raise ValueError(where, f"{where}.content must be a string or a list of text parts")
        turns.append({"role": role, "content": content})
    return turns


def completion_body(data: dict, template: str, tokenizer, max_context: int,
                    store: ResponseStore) -> tuple[dict, list[dict]]:
    """The ``/v1/completions`` body a Responses request ``data`` stands for, and the turns it
    adds to the conversation (earlier ones, from ``previous_response_id``, included; its
    ``instructions`` not). Raises ``ValueError`` with ``(param, message)`` as args, or
    ``LookupError`` for a ``previous_response_id`` the store does not hold."""
    for name, (off, why) in NOT_IMPLEMENTED.items():
        if data.get(name) not in off:
            raise ValueError(name, f"{name}={data.get(name)!r} is not supported by this "
                                   f"server: {why}; leave it out")
    structured = text_format(data.get("text"))
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ValueError("instructions", "instructions must be a string")
    earlier: list[dict] = []
    previous = data.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str):
            raise ValueError("previous_response_id", "previous_response_id must be a string")
        stored = store.get(previous)
        if stored is None:
            raise LookupError(previous)
        turns, response = stored
        earlier = turns + [{"role": "assistant", "content": output_text(response)}]
    turns = earlier + input_turns(data.get("input"))
    system = [{"role": "system", "content": instructions}] if instructions else []
    try:
        prompt = render_chat(template, system + turns, add_generation_prompt=True)
    except TemplateError as e:
        raise ValueError("input", str(e)) from None
    limit = data.get("max_output_tokens")
    if limit is None:  # as much as the context leaves
        limit = max(1, max_context - len(tokenizer.encode(prompt)) + 1)
    body = {"model": data.get("model"), "prompt": prompt, "max_tokens": limit,
            "stream": data.get("stream")}
    for name in ("temperature", "top_p", "top_k", "seed", "user"):  # seed, top_k: vLLM's
        if name in data:
            body[name] = data[name]
    if structured is not None:
        body["structured_outputs"] = structured
    return body, turns


def text_format(text) -> dict | None:
    """``text.format`` as the completion body's ``structured_outputs`` (None: plain text);
    ValueError with ``(param, message)`` for one it cannot serve."""
    if text is None or text == {}:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or set(text) - {"format", "verbosity"}:
        raise ValueError("text.format", "text must be {\"format\": {...}}")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind != "json_schema":
        raise ValueError("text.format.type", "text.format.type must be text, json_object or "
                                             f"json_schema, got {kind!r}")
    if not isinstance(fmt.get("name"), str):
        raise ValueError("text.format.name", "a json_schema format needs a name")
    if not isinstance(fmt.get("schema"), dict):
        raise ValueError("text.format.schema", "text.format.schema must be a JSON schema (an "
                                               "object)")
    return {"json": fmt["schema"]}


def output_text(response: dict) -> str:
    """The text of a response's output messages, joined (what the client's ``output_text``
    property gives)."""
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


class ResponseShape:
    """The Responses API's objects for one request: the ``response`` object, and the typed
    events of its stream. ``on_done(response)`` is called with the finished response (the
    store keeps it)."""

    def __init__(self, data: dict, on_done=None):
        self.data, self.on_done = data, on_done
        self.msg_id = f"msg_{uuid.uuid4().hex}"
        self.seq = 0  # the stream's sequence_number
        self.text = ""

    def new_id(self) -> str:
        return f"resp_{uuid.uuid4().hex}"

    def _response(self, rid, model, created, status, text=None, reason=None, usage=None,
                  error=None) -> dict:
        d = self.data
        output = [] if text is None else [self._message(text, "completed" if status ==
                                                        "completed" else "incomplete")]
        limit = d.get("max_output_tokens")
        return {
            "id": rid, "object": "response", "created_at": created, "status": status,
            "model": model, "output": output, "error": error,
            "incomplete_details": ({"reason": "max_output_tokens"} if reason == "length"
                                   else None),
            "instructions": d.get("instructions"), "max_output_tokens": limit,
            "previous_response_id": d.get("previous_response_id"),
            "temperature": d.get("temperature", 1.0), "top_p": d.get("top_p", 1.0),
            "parallel_tool_calls": False, "tool_choice": "none", "tools": [],
            "text": d.get("text") or {"format": {"type": "text"}}, "truncation": "disabled",
            "store": d.get("store", True) is not False, "metadata": d.get("metadata") or {},
            "usage": usage,
        }

    def _message(self, text: str, status: str) -> dict:
        content = [] if text is None else [{"type": "output_text", "text": text,
                                            "annotations": []}]
        return {"type": "message", "id": self.msg_id, "role": "assistant", "status": status,
                "content": content}

    @staticmethod
    def _usage(usage: dict, cached: int) -> dict:
        return {"input_tokens": usage["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": usage["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["total_tokens"]}

    def response(self, rid, model, text, reason, usage, created, cached=0) -> dict:
        status = "incomplete" if reason == "length" else "completed"
        out = self._response(rid, model, created, status, text, reason,
                             self._usage(usage, cached))
        out["completed_at"] = int(time.time()) if status == "completed" else None
        if self.on_done is not None:
            self.on_done(out)
        return out

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def opening(self, rid, model, created) -> list[dict]:
        """The events before the first token: the response, its message and its text part."""
        started = self._response(rid, model, created, "in_progress")
        where = {"item_id": self.msg_id, "output_index": 0, "content_index": 0}
        return [self._event("response.created", response=started),
                self._event("response.in_progress", response=started),
                self._event("response.output_item.added", output_index=0,
                            item=self._message(None, "in_progress")),
                self._event("response.content_part.added", **where,
                            part={"type": "output_text", "text": "", "annotations": []})]

    def chunk(self, rid, model, delta, reason, created, usage_field) -> dict:
        """One token's text (the legacy shapes' signature; the reason comes in ``closing``)."""
        self.text += delta
        return self._event("response.output_text.delta", item_id=self.msg_id, output_index=0,
                           content_index=0, delta=delta, logprobs=[])

    def closing(self, rid, model, delta, reason, created, usage, usage_field,
                cached=0) -> list[dict]:
        """The events after the last token: the rest of the text, the .done events, and the
        finished response (which always carries its usage)."""
        events = [self.chunk(rid, model, delta, None, created, False)] if delta else []
        where = {"item_id": self.msg_id, "output_index": 0, "content_index": 0}
        part = {"type": "output_text", "text": self.text, "annotations": []}
        final = self.response(rid, model, self.text, reason, usage, created, cached)
        events += [self._event("response.output_text.done", **where, text=self.text,
                               logprobs=[]),
                   self._event("response.content_part.done", **where, part=part),
                   self._event("response.output_item.done", output_index=0,
                               item=final["output"][0]),
                   self._event(f"response.{final['status']}", response=final)]
        return events

    def failure(self, rid, model, created, body: dict) -> list[dict]:
        failed = self._response(rid, model, created, "failed",
                                error={"code": "server_error",
                                       "message": body["error"]["message"]})
        return [self._event("response.failed", response=failed)]

    @staticmethod
    def sse(event: dict) -> dict:
        """One event as sse-starlette sends it: its type as the event name, then the data."""
        return {"event": event["type"], "data": json.dumps(event)}
