"""``POST /v1/chat/completions``: a conversation in, the assistant's next turn out.

OpenAI calls its Completions API legacy, and engines serve Chat Completions first (vLLM's
OpenAI-compatible server, SGLang's). A chat request is a completion request whose prompt is a
list of ``messages``; the server renders them into one text with the tokenizer's chat template
(``inferlab.model.chat_template``), appending the opening of the assistant's turn, and from
there runs exactly what ``/v1/completions`` runs (``inferlab.serve.app``: both routes share one
parse, one path through the engine and one error mapping), answering in the chat shape
(``inferlab.serve.protocol.ChatShape``): a ``chat.completion`` with a ``message``, or a stream
of ``chat.completion.chunk`` deltas, then, with ``stream_options.include_usage``, a last chunk
with the token counts, then ``[DONE]``.

The body: ``model``, ``messages`` (each ``{"role", "content"}``; roles ``system``,
``developer``, ``user``, ``assistant``; content a string or a list of ``{"type": "text",
"text"}`` parts), ``max_completion_tokens`` or the older ``max_tokens`` (default: the rest of
the model's context), and every sampling field ``/v1/completions`` takes, checked by the same
code with the same messages. An error names the field as the client sent it
(``client_names``): ``messages`` for the prompt, ``max_completion_tokens`` when that is the
limit it gave. ``response_format`` (a JSON schema, or any JSON object) passes through to the
completion body, which enforces it as structured output (``inferlab.serve.protocol``'s
``CompletionRequest.constraint``). Tool calls (``tools``, ``tool_choice``) and log
probabilities are refused with a 400 that names the field, rather than silently ignored.
"""

from __future__ import annotations

from inferlab.model.chat_template import TemplateError, render_chat

ROLES = ("system", "developer", "user", "assistant")

# Chat fields this server does not implement, accepted only at their "off" value.
CHAT_NOT_IMPLEMENTED = {
    "tools": ((None, []), "tool calling is not implemented"),
    "tool_choice": ((None, "none"), "tool calling is not implemented"),
    "logprobs": ((None, False), "log probabilities are not returned"),
    "top_logprobs": ((None, 0), "log probabilities are not returned"),
}


def message_text(message, i: int) -> dict:
    """One message as ``{"role", "content"}`` with string content; ValueError says what is
    wrong with it, naming ``messages[i]``."""
    if not isinstance(message, dict):
        raise ValueError(f"messages[{i}] must be an object with a role and a content")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
    if isinstance(content, list):  # content parts: only text ones
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise ValueError(f"messages[{i}].content: only text parts "
                             '({"type": "text", "text": ...}) are supported')
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
    return {"role": role, "content": content}


def completion_body(data: dict, template: str, tokenizer, max_context: int) -> dict:
    """The ``/v1/completions`` body that a chat request ``data`` stands for: its messages
    rendered into ``prompt`` and its token limit as ``max_tokens``. Raises ``ValueError`` with
    ``(param, message)`` as args for a body it cannot serve."""
    body = dict(data)
    messages = body.pop("messages", None)
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages", "messages must be a non-empty list of messages")
    try:
        turns = [message_text(m, i) for i, m in enumerate(messages)]
    except ValueError as e:
        raise ValueError("messages", str(e)) from None
    for field, (off, why) in CHAT_NOT_IMPLEMENTED.items():
        value = body.pop(field, None)
        if value not in off:
            raise ValueError(field, f"{field}={value!r} is not supported by this server: {why}; "
                                    "leave it out")
    try:
        prompt = render_chat(template, turns, add_generation_prompt=True)
    except TemplateError as e:
        raise ValueError("messages", str(e)) from None
    limit = body.pop("max_completion_tokens", None)
    limit = body.get("max_tokens") if limit is None else limit
    if limit is None:  # OpenAI's default: as much as the context leaves
        limit = max(1, max_context - len(tokenizer.encode(prompt)) + 1)
    body.update(prompt=prompt, max_tokens=limit)
    return body


def client_names(data: dict) -> dict[str, str]:
    """The completion body's field names as the chat request ``data`` spelled them."""
    limit = "max_completion_tokens" if data.get("max_completion_tokens") is not None \
        else "max_tokens"
    return {"prompt": "messages", "max_tokens": limit}
