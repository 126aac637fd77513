"""The wire format of ``/v1/completions``: what a client sends and what it gets back.

The bodies follow OpenAI's legacy Completions API, the one vLLM and SGLang also serve, so the
official ``openai`` client and any load generator written for those engines work unchanged:
``prompt`` (text, or token ids), ``max_tokens`` (default 16), ``temperature`` (default 1, at
most 2; a temperature below 1e-5, ``inferlab.serving.sampling.GREEDY_BELOW``, decodes greedily,
as 0 does), ``stop`` (a string or a list of up to four), ``stream`` (Server-Sent Events, one
chunk per token, then ``data: [DONE]``), ``seed`` (a 64-bit signed integer: the same seed and
prompt give the same tokens whatever else the server is running), and vLLM's ``ignore_eos``
(generate exactly ``max_tokens``, as a load generator wants). Fields the engine does not implement are accepted and
ignored when they ask for the default (``n=1``), refused otherwise.

Errors carry OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``, with a 4xx
status for a bad request and 429/503 for overload.
"""

from __future__ import annotations

import time
import uuid

from pydantic import BaseModel, ConfigDict, Field, field_validator


class CompletionRequest(BaseModel):
    """The body of POST /v1/completions. Unknown fields are allowed (clients send extras).

    Strict, as JSON's types are: ``true`` is not a number, ``"5"`` not an integer (an integer
    is a number, though).
    """

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    # Types are checked here; ranges by the engine's own check (``validate_request``, with
    # ``API_NAMES``), the one every front door runs: max_tokens >= 1 and within the context,
    # temperature in [0, 2] (below 1e-5: greedy), seed a 64-bit signed integer.
    max_tokens: int = 16
    temperature: float = 1.0
    stop: str | list[str] | None = None
    stream: bool = False
    seed: int | None = None
    n: int = Field(1, ge=1, le=1)  # one completion per request
    user: str | None = None
    ignore_eos: bool = False  # vLLM's extension: run to max_tokens (load generators use it)

    @field_validator("stop")
    @classmethod
    def _at_most_four(cls, stop):
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences")
        return stop

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop or [] if s]


# The engine's field names, as this API spells them (for the engine check's messages).
API_NAMES = {"max_new_tokens": "max_tokens"}


def single_prompt(prompt) -> str | list[int]:
    """The one prompt of a request: text or token ids. A batch of prompts is refused."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ValueError("this server takes one prompt per request; send a batch as "
                             "separate requests")
        return prompt[0]
    return prompt


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def completion(cid: str, model: str, text: str, finish_reason: str | None,
               usage: dict | None = None, created: int | None = None) -> dict:
    """A completion object (``stream`` false), or one streamed chunk of one (no usage)."""
    body = {"id": cid, "object": "text_completion", "created": created or int(time.time()),
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": finish_reason}]}
    if usage is not None:
        body["usage"] = usage
    return body


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def model_list(names: list[str], created: int) -> dict:
    """The body of GET /v1/models."""
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created,
                                        "owned_by": "inferlab"} for n in names]}
