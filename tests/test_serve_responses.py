"""``/v1/responses`` on the course server: the official ``openai`` client's ``responses.create``,
streaming and not, equals offline generation of the rendered conversation; the typed events in
order; stored responses continue a conversation and expire oldest first; what it refuses, by
field name."""

import httpx
import openai
import pytest

from course_server import NAME, model_and_tokenizer, start
from inferlab.model.chat_template import CHAT_TEMPLATE, render_chat
from inferlab.serve.responses import ResponseStore, completion_body, input_turns
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import serve
from inferlab.serving.request import Request

pytestmark = pytest.mark.usefixtures("one_torch_thread")

INSTRUCTIONS = "You write Python."
QUESTION = "Parse a line of a CSV file."
EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
          "response.content_part.added"]


@pytest.fixture(scope="module")
def server():
    srv, engine = start(ServingConfig(num_blocks=128, max_batch=4), stats_interval_s=0)
    with srv:
        yield srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def offline(turns: list[dict], max_tokens: int) -> tuple[int, str, bool]:
    """Prompt length, text and whether it hit the limit, generated without the server."""
    model, tok = model_and_tokenizer()
    ids = tok.encode(render_chat(CHAT_TEMPLATE, turns))
    out = serve(model, [Request(ids, max_tokens, eos_token_ids=(tok.eos_token_id,))],
                ServingConfig(num_blocks=64, max_batch=4)).results[0].tokens
    return len(ids), tok.decode(out), len(out) == max_tokens


def test_the_official_client_streaming_and_not_equals_offline_generation(server):
    _, client = server
    whole = client.responses.create(model=NAME, input=QUESTION, instructions=INSTRUCTIONS,
                                    max_output_tokens=12, temperature=0)
    n_prompt, text, cut = offline([{"role": "system", "content": INSTRUCTIONS},
                                   {"role": "user", "content": QUESTION}], 12)
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.output_text == text and whole.usage.input_tokens == n_prompt
    assert whole.status == ("incomplete" if cut else "completed")
    assert (whole.incomplete_details is not None) == cut
    message = whole.output[0]
    assert message.type == "message" and message.role == "assistant"

    events = list(client.responses.create(model=NAME, input=QUESTION, max_output_tokens=12,
                                          instructions=INSTRUCTIONS, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == EVENTS
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", f"response.{whole.status}"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == text == events[-4].text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_a_stored_response_continues_the_conversation_without_its_instructions(server):
    _, client = server
    first = client.responses.create(model=NAME, input=QUESTION, instructions=INSTRUCTIONS,
                                    max_output_tokens=6, temperature=0)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    second = client.responses.create(model=NAME, input="Now in two lines.", temperature=0,
                                     previous_response_id=first.id, max_output_tokens=6)
    turns = [{"role": "user", "content": QUESTION},
             {"role": "assistant", "content": first.output_text},
             {"role": "user", "content": "Now in two lines."}]
    n_prompt, text, _ = offline(turns, 6)
    assert second.usage.input_tokens == n_prompt and second.output_text == text
    assert second.previous_response_id == first.id


def test_an_unstored_or_unknown_response_is_a_404_naming_the_field(server):
    srv, client = server
    r = client.responses.create(model=NAME, input=QUESTION, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    answer = httpx.post(srv.url + "/v1/responses", timeout=60, json={
        "model": NAME, "input": "x", "previous_response_id": r.id})
    assert answer.status_code == 404
    assert answer.json()["error"]["param"] == "previous_response_id"


def test_the_store_forgets_the_oldest_first():
    store = ResponseStore(capacity=2)
    for i in range(3):
        store.put({"id": f"resp_{i}", "output": []}, [])
    assert store.get("resp_0") is None and store.get("resp_1") and store.get("resp_2")
    assert len(store) == 2


def test_message_inputs_with_text_parts_render_like_chat_messages():
    _, tok = model_and_tokenizer()
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Parse "},
                                          {"type": "input_text", "text": "a line."}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "def f(): ..."}]},
             {"role": "user", "content": "Shorter."}]
    assert input_turns(items) == [{"role": "user", "content": "Parse a line."},
                                  {"role": "assistant", "content": "def f(): ..."},
                                  {"role": "user", "content": "Shorter."}]
    body, turns = completion_body({"model": NAME, "input": items}, CHAT_TEMPLATE, tok, 512,
                                  ResponseStore())
    assert body["prompt"] == render_chat(CHAT_TEMPLATE, turns)
    assert body["max_tokens"] == 512 - len(tok.encode(body["prompt"])) + 1


@pytest.mark.parametrize("change, param", [
    ({"tools": [{"type": "function", "name": "f"}]}, "tools"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"background": True}, "background"),
    ({"text": {"format": {"type": "python"}}}, "text.format.type"),
    ({"input": []}, "input"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0]"),
    ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0]"),
    ({"instructions": 3}, "instructions"),
    ({"max_output_tokens": 0}, "max_output_tokens"),  # the field as the client sent it
    ({"max_output_tokens": "many"}, "max_output_tokens"),
    ({"temperature": 3.0}, "temperature"),
    ({"input": "many words " * 600}, "input"),
])
def test_what_it_cannot_serve_is_refused_by_name(server, change, param):
    srv, _ = server
    body = {"model": NAME, "input": QUESTION, "max_output_tokens": 4} | change
    r = httpx.post(srv.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_usage_counts_the_prompt_tokens_a_prefix_cache_held():
    config = ServingConfig(num_blocks=128, max_batch=4, token_budget=64, policy="chunked")
    srv, engine = start(config, prefix_cache=True, stats_interval_s=0)
    with srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        ask = dict(model=NAME, input=QUESTION * 4, max_output_tokens=2, temperature=0)
        cold, warm = client.responses.create(**ask), client.responses.create(**ask)
    size = engine.cache.block_size
    assert cold.usage.input_tokens_details.cached_tokens == 0
    # every whole block of the prompt but the one holding its last token is reused
    n = warm.usage.input_tokens
    assert warm.usage.input_tokens_details.cached_tokens == (n - 1) // size * size
