"""The response shapes of the two generation endpoints, for one handler that serves both.

``/v1/completions`` and ``/v1/chat/completions`` run the same request through the same engine;
they differ only in how the text comes back. A *shape* builds the four things the handler sends:
a response (``stream`` false), a streamed chunk, the last chunk's finish reason, and the usage
chunk of ``stream_options.include_usage``. A shape is made per request (a chat stream's first
chunk carries the assistant's role, the later ones do not).

- ``TextShape``: OpenAI's legacy Completions objects (``text_completion``), as
  ``inferlab.serve.protocol`` builds them.
- ``ChatShape``: Chat Completions objects: ``chat.completion`` with a ``message``, and, when
  streaming, ``chat.completion.chunk`` objects whose ``delta`` holds the role (first chunk) and
  the new ``content``; the finishing chunk has an empty delta and the ``finish_reason``, as
  OpenAI's API and vLLM send them.
"""

from __future__ import annotations

import time
import uuid

from inferlab.serve.protocol import completion, completion_id, usage_chunk


class TextShape:
    """``/v1/completions``: ``text_completion`` objects."""

    def new_id(self) -> str:
        return completion_id()

    def response(self, cid, model, text, reason, usage, created) -> dict:
        return completion(cid, model, text, reason, usage, created)

    def chunk(self, cid, model, delta, reason, created, usage_field) -> dict:
        return completion(cid, model, delta, reason, None, created, usage_field)

    def usage_chunk(self, cid, model, usage, created) -> dict:
        return usage_chunk(cid, model, usage, created)


class ChatShape:
    """``/v1/chat/completions``: ``chat.completion`` and ``chat.completion.chunk`` objects."""

    def __init__(self):
        self._role_sent = False

    def new_id(self) -> str:
        return f"chatcmpl-{uuid.uuid4().hex}"

    @staticmethod
    def _head(cid, obj, model, created) -> dict:
        return {"id": cid, "object": obj, "created": created or int(time.time()), "model": model}

    def response(self, cid, model, text, reason, usage, created) -> dict:
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
