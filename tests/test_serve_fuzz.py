"""The HTTP server under random traffic (issue 28): hypothesis sends batches of completion
requests at once, ordinary, unusual but well-formed, and malformed in one field, to a server on
127.0.0.1. The properties: the server never stops serving (/health stays 200, the engine loop
lives), every request gets either a completion or a 4xx whose ``param`` names the field that
was wrong, the ordinary and unusual requests' tokens equal offline generation of the same
request alone, and no KV block is left allocated.

Bounded: ``MAX_EXAMPLES`` batches of at most six requests of at most eight tokens each, with
``derandomize=True`` so that every run sends the same traffic.
"""

import asyncio
import json
from functools import lru_cache

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from course_server import NAME, model_and_tokenizer, start
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import serve
from inferlab.serving.request import Request
from inferlab.validation import SEED_MAX, SEED_MIN

MAX_EXAMPLES = 50
PROMPTS = ["def parse(line):", "import os\n", "class Node:", "for i in range(", "x = "]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def server():
    srv, engine = start(ServingConfig(num_blocks=128, max_batch=4), max_waiting=64)
    with srv:
        yield srv, engine
    assert not engine._thread.is_alive()


@lru_cache(maxsize=None)
def offline_text(prompt, max_tokens: int, temperature: float, seed, top_k=0,
                 top_p=1.0) -> str:
    """What the engine generates for the request alone, offline, decoded."""
    model, tok = model_and_tokenizer()
    ids = tok.encode(prompt) if isinstance(prompt, str) else list(prompt)
    request = Request(tuple(ids), max_tokens, eos_token_ids=(tok.eos_token_id,),
                      temperature=temperature, seed=seed, top_k=top_k, top_p=top_p)
    result = serve(model, [request], ServingConfig(num_blocks=64, max_batch=1)).results[0]
    assert result.ok, result.error
    return tok.decode(list(result.tokens))


# -- what a client may send -----------------------------------------------------------------------
prompts = st.one_of(st.sampled_from(PROMPTS),
                    st.lists(st.integers(1, 1023), min_size=1, max_size=12).map(tuple))


@st.composite
def valid_body(draw):
    """A request the server must answer with a completion: ordinary values, or unusual ones in
    range (a temperature of 1e-40 or 2, a seed at the ends of 64 bits, extra fields)."""
    body = {"model": NAME, "prompt": draw(prompts), "max_tokens": draw(st.integers(1, 8)),
            "stream": draw(st.booleans())}
    body["temperature"] = draw(st.one_of(
        st.just(0), st.just(0.0), st.sampled_from([1e-40, 5e-324, 1e-5, 0.7, 2.0, 2]),
        st.floats(0, 2)))
    if draw(st.booleans()):
        body["seed"] = draw(st.one_of(st.integers(SEED_MIN, SEED_MAX),
                                      st.sampled_from([SEED_MIN, SEED_MAX, 0, -1])))
    elif body["temperature"] >= 1e-5:
        body["temperature"] = 0  # unseeded sampling has no offline twin to compare with
    if draw(st.booleans()):
        body["top_p"] = draw(st.one_of(st.floats(0, 1, exclude_min=True), st.just(1)))
    if draw(st.booleans()):
        body["top_k"] = draw(st.integers(-1, 2000))
    if draw(st.booleans()):
        body["user"] = "fuzz"  # accepted and ignored, as OpenAI's field is advisory
    return body


# (field, values that are wrong for it): each malformed request breaks exactly one field
WRONG = {
    "max_tokens": st.one_of(st.integers(max_value=0), st.integers(513, 10**30), st.booleans(),
                            st.text(max_size=3), st.floats(allow_nan=True), st.none()),
    "temperature": st.one_of(st.floats(min_value=2.0, exclude_min=True),
                             st.floats(max_value=0.0, exclude_max=True),
                             st.sampled_from([float("nan"), float("inf"), -float("inf")]),
                             st.booleans(), st.text(max_size=3), st.integers(3, 10**6)),
    "seed": st.one_of(st.integers(SEED_MAX + 1, 2**80), st.integers(-2**80, SEED_MIN - 1),
                      st.floats(), st.booleans(), st.text(max_size=3)),  # 3.0 is no integer
    "prompt": st.one_of(st.just(""), st.just([]), st.lists(st.integers(1024, 10**9),
                                                           min_size=1, max_size=3),
                        st.lists(st.integers(max_value=-1), min_size=1, max_size=3),
                        st.just([[1, 2], [3, 4]]), st.just(["a", "b"]), st.booleans(),
                        st.just({"text": "x"}), st.just([5] * 600)),
    "stop": st.one_of(st.lists(st.just("a"), min_size=5, max_size=6), st.integers(),
                      st.just([1, 2])),
    "stream": st.one_of(st.integers(), st.text(max_size=3)),
    "n": st.integers(2, 5),
    "top_p": st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0, exclude_min=True),
                       st.just(float("nan")), st.booleans(), st.text(max_size=3)),
    "top_k": st.one_of(st.integers(max_value=-2), st.floats(), st.booleans()),
    "logprobs": st.integers(0, 5),
    "echo": st.just(True),
    "model": st.text(max_size=8).filter(lambda m: m != NAME),
}


@st.composite
def malformed_body(draw):
    """An otherwise ordinary request with one field made wrong; the field it broke."""
    field = draw(st.sampled_from(sorted(WRONG)))
    body = {"model": NAME, "prompt": draw(prompts), "max_tokens": 4, "temperature": 0}
    body[field] = draw(WRONG[field])
    return body, field


NOT_JSON_OBJECTS = [b"{not json", b"[1, 2]", b"", b'"text"']


@st.composite
def batches(draw):
    """One to three well-formed requests, up to two malformed ones, now and then a body that
    is not a JSON object, all sent at once in a random order."""
    batch = [(draw(valid_body()), None) for _ in range(draw(st.integers(1, 3)))]
    batch += [draw(malformed_body()) for _ in range(draw(st.integers(0, 2)))]
    if draw(st.integers(0, 9)) == 9:
        batch.append((draw(st.sampled_from(NOT_JSON_OBJECTS)), ""))
    return draw(st.permutations(batch))


# -- sending them -----------------------------------------------------------------------------
async def send(client, body):
    """(status, the JSON error or None, the completion's text)."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if isinstance(body, dict) and body.get("stream") is True:
        async with client.stream("POST", "/v1/completions", content=content,
                                 headers=headers) as r:
            if r.status_code != 200:
                return r.status_code, json.loads(await r.aread())["error"], None
            text = []
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return 500, chunk["error"], None
                    text.append(chunk["choices"][0]["text"])
            return 200, None, "".join(text)
    r = await client.post("/v1/completions", content=content, headers=headers)
    data = r.json()
    return r.status_code, data.get("error"), data["choices"][0]["text"] if r.is_success else None


def ordinary(**changes):
    return {"model": NAME, "prompt": "def parse(line):", "max_tokens": 4, "temperature": 0} | \
        changes


# Every field once, whatever hypothesis draws, with the reproductions among them: a seed
# beyond 64 bits beside an ordinary request, and a temperature of 1e-40.
EVERY_FIELD = [(ordinary(top_p=0), "top_p"), (ordinary(logprobs=2), "logprobs"),
               (ordinary(max_tokens=-3), "max_tokens"), (ordinary(temperature=2.5), "temperature"),
               (ordinary(seed=2**64, temperature=0.7), "seed"), (ordinary(prompt=[5, 99999]),
                                                                 "prompt"),
               (ordinary(stop=["a"] * 5), "stop"), (ordinary(stream="yes"), "stream"),
               (ordinary(n=2), "n"), (ordinary(model="gpt-4"), "model"),
               (ordinary(), None), (ordinary(temperature=1e-40, seed=1, stream=True), None),
               (b"{not json", "")]


@given(batch=batches())
@example(batch=EVERY_FIELD)
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_random_requests_never_stop_the_server(server, batch):
    srv, engine = server

    async def main():
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            return await asyncio.gather(*(send(client, body) for body, _ in batch))

    for (body, field), (status, error, text) in zip(batch, asyncio.run(main())):
        event("well-formed" if field is None else f"wrong {field or 'body'}")
        if field is None:  # well-formed: a completion equal to offline generation
            assert status == 200, (body, error)
            temperature, hot = body["temperature"], body["temperature"] >= 1e-5
            want = offline_text(body["prompt"], body["max_tokens"], temperature,
                                body.get("seed") if hot else None,
                                max(body.get("top_k", 0), 0) if hot else 0,
                                body.get("top_p", 1.0) if hot else 1.0)
            assert text == want, body
        elif field == "":  # not a JSON object
            assert status == 400 and error["param"] is None and error["message"]
        else:  # one field wrong: a 4xx that names it
            assert 400 <= status < 500 and error["param"] == field, (body, status, error)
            assert error["message"] and error["type"]
    assert httpx.get(srv.url + "/health").status_code == 200
    assert engine.alive and engine.wait_idle(30) and engine.blocks_in_use == 0
