"""``/v1/chat/completions`` on the course server: the official ``openai`` client, streaming and
not; the chat template renders the roles into the prompt; the chunk format, usage with
``stream_options``; what it refuses, by field name."""

import json

import httpx
import openai
import pytest

from course_server import NAME, model_and_tokenizer, start
from inferlab.model.chat_template import (CHAT_TEMPLATE, TemplateError, load_chat_template,
                                          render_chat)
from inferlab.serve.chat import completion_body
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import serve
from inferlab.serving.request import Request

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MESSAGES = [{"role": "system", "content": "You write Python."},
            {"role": "user", "content": "Parse a line of a CSV file."}]


@pytest.fixture(scope="module")
def server():
    srv, engine = start(ServingConfig(num_blocks=128, max_batch=4), stats_interval_s=0)
    with srv:
        yield srv, engine


def test_the_course_tokenizer_ships_its_chat_template():
    _, tok = model_and_tokenizer()
    assert load_chat_template(tok.path) == CHAT_TEMPLATE
    text = render_chat(CHAT_TEMPLATE, MESSAGES)
    assert text == ("# system:\nYou write Python.\n# user:\nParse a line of a CSV file.\n"
                    "# assistant:\n")
    assert not render_chat(CHAT_TEMPLATE, MESSAGES, add_generation_prompt=False) \
        .endswith("# assistant:\n")


def test_a_template_that_refuses_a_conversation_raises_template_error():
    strict = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}"
              "{% endif %}{{ messages[0]['content'] }}")
    assert render_chat(strict, [{"role": "user", "content": "hi"}]) == "hi"
    with pytest.raises(TemplateError, match="user first"):
        render_chat(strict, MESSAGES)


def test_the_template_runs_in_jinjas_sandbox():
    with pytest.raises(TemplateError):
        render_chat("{{ messages.__class__.__mro__[1].__subclasses__() }}", MESSAGES)


def test_the_official_client_streaming_and_not_equals_offline_generation(server):
    srv, _ = server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    whole = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=12,
                                           temperature=0)
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    reply = whole.choices[0].message
    assert reply.role == "assistant" and reply.content
    parts = list(client.chat.completions.create(
        model=NAME, messages=MESSAGES, max_completion_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert all(p.object == "chat.completion.chunk" for p in parts)
    assert parts[0].choices[0].delta.role == "assistant"
    assert all(p.choices[0].delta.role is None for p in parts[1:-1])
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == reply.content
    *body, last = parts
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert body[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    # the rendered conversation is the prompt: the same tokens as offline generation from it
    model, tok = model_and_tokenizer()
    ids = tok.encode(render_chat(CHAT_TEMPLATE, MESSAGES))
    assert whole.usage.prompt_tokens == len(ids)
    offline = serve(model, [Request(ids, 12, eos_token_ids=(tok.eos_token_id,))],
                    ServingConfig(num_blocks=64, max_batch=4)).results[0].tokens
    assert reply.content == tok.decode(offline)


def test_roles_change_the_prompt(server):
    srv, _ = server
    a = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "model": NAME, "messages": MESSAGES, "max_tokens": 4, "temperature": 0}).json()
    b = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "model": NAME, "messages": MESSAGES[1:], "max_tokens": 4, "temperature": 0}).json()
    assert a["usage"]["prompt_tokens"] > b["usage"]["prompt_tokens"]


@pytest.mark.parametrize("change, param", [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"response_format": {"type": "grammar"}}, "response_format.type"),
    ({"logprobs": True}, "logprobs"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ({"prompt": "x"}, "prompt"),
    ({"temperature": 3.0}, "temperature"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),  # the field as it was sent
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_completion_tokens": "many"}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "many words " * 600}]}, "messages"),
])
def test_what_it_cannot_serve_is_refused_by_name(server, change, param):
    srv, _ = server
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 4} | change
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_text_parts_are_joined_and_the_default_limit_is_the_rest_of_the_context():
    _, tok = model_and_tokenizer()
    parts = [{"role": "user", "content": [{"type": "text", "text": "Parse "},
                                          {"type": "text", "text": "a line."}]}]
    body = completion_body({"model": NAME, "messages": parts}, CHAT_TEMPLATE, tok, 512)
    assert body["prompt"] == "# user:\nParse a line.\n# assistant:\n"
    assert body["max_tokens"] == 512 - len(tok.encode(body["prompt"])) + 1
    capped = completion_body({"model": NAME, "messages": parts, "max_tokens": 9,
                              "max_completion_tokens": 5}, CHAT_TEMPLATE, tok, 512)
    assert capped["max_tokens"] == 5  # the newer field wins


def test_a_stream_without_usage_has_no_usage_field(server):
    srv, _ = server
    with httpx.stream("POST", srv.url + "/v1/chat/completions", timeout=60, json={
            "model": NAME, "messages": MESSAGES, "max_tokens": 3, "stream": True,
            "temperature": 0, "ignore_eos": True}) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content") is not None) >= 3
