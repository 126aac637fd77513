"""What an OpenAI or vLLM user expects of the course server (issue 27, item 13): fields it does
not implement refused by name, errors in the API's field names, ``created`` per response,
``stream_options.include_usage``, token counters in /metrics, a startup banner and stats lines,
and a ``--help`` that documents every flag."""

import json
import logging
import types

import httpx
import pytest

from course_server import NAME, model_and_tokenizer, start
from inferlab.serve import app as app_module
from inferlab.serve.__main__ import parser
from inferlab.serve.app import create_app
from inferlab.serve.background import BackgroundServer
from inferlab.serve.logs import StatsLogger, banner
from inferlab.serve.protocol import NOT_IMPLEMENTED
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import serve
from inferlab.serving.online import OnlineEngine
from inferlab.serving.request import Request

BODY = {"model": NAME, "prompt": "def parse(line):", "max_tokens": 6, "temperature": 0}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def server():
    srv, engine = start(ServingConfig(num_blocks=128, max_batch=4), stats_interval_s=0)
    with srv:
        yield srv, engine


def post(srv, **changes):
    return httpx.post(srv.url + "/v1/completions", json=BODY | changes, timeout=60)


# What a client asks for that the server does not do, and the value that means "off".
ASKED = {"best_of": 2, "echo": True, "frequency_penalty": 0.5, "presence_penalty": -1.0,
         "repetition_penalty": 1.2, "logit_bias": {"5": 10}, "logprobs": 1, "suffix": "}",
         "min_p": 0.1, "min_tokens": 3,
         # vLLM's structured-output fields before v0.12.0 (now structured_outputs)
         "guided_json": {"type": "object"}, "guided_regex": "a+", "guided_choice": ["a", "b"],
         "guided_grammar": 'root ::= "a"'}


@pytest.mark.parametrize("field", sorted(NOT_IMPLEMENTED))
def test_a_field_the_server_does_not_implement_is_refused_by_name(server, field):
    srv, _ = server
    r = post(srv, **{field: ASKED[field]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == field and field in error["message"]
    for off in NOT_IMPLEMENTED[field][0]:  # the value that means "off" is accepted
        assert post(srv, **{field: off}).status_code == 200, (field, off)


def test_top_p_and_top_k_sample_as_offline_serve_does(server):
    srv, _ = server
    model, tok = model_and_tokenizer()
    ids = tuple(tok.encode(BODY["prompt"]))
    for top_p, top_k in [(0.9, None), (None, 20), (0.7, 5), (1, -1)]:
        body = {"temperature": 1.2, "seed": 5, "max_tokens": 12, "ignore_eos": True}
        body |= {k: v for k, v in (("top_p", top_p), ("top_k", top_k)) if v is not None}
        r = post(srv, **body)
        assert r.status_code == 200, r.json()
        want = serve(model, [Request(ids, 12, temperature=1.2, seed=5, top_p=top_p or 1.0,
                                     top_k=max(top_k or 0, 0))],
                     ServingConfig(num_blocks=64, max_batch=1)).results[0].tokens
        assert r.json()["choices"][0]["text"] == tok.decode(list(want)), (top_p, top_k)
    for bad in ({"top_p": 0}, {"top_p": 1.5}, {"top_k": -2}, {"top_k": 2.5}):
        r = post(srv, **bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(bad)), bad


def test_n_and_the_api_field_names_in_errors(server):
    srv, engine = server
    r = post(srv, n=3)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert post(srv, n=1).status_code == 200 and post(srv, n=None).status_code == 200
    r = post(srv, max_tokens=10_000)  # past the context: the engine's check, in API names
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "max_tokens"
    assert "max_tokens" in error["message"] and "max_new_tokens" not in error["message"]
    assert post(srv, max_tokens=None, temperature=None, user="u").status_code == 200  # defaults
    assert engine.wait_idle() and engine.blocks_in_use == 0


def test_created_is_the_time_of_each_response(server, monkeypatch):
    srv, _ = server
    clock = iter(range(2_000_000_000, 2_000_000_100, 7))
    monkeypatch.setattr(app_module, "time", types.SimpleNamespace(time=lambda: next(clock)))
    first, second = post(srv).json()["created"], post(srv).json()["created"]
    assert 2_000_000_000 <= first < second


def stream_chunks(srv, **changes):
    with httpx.stream("POST", srv.url + "/v1/completions", json=BODY | {"stream": True} | changes,
                      timeout=60) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_stream_options_include_usage(server):
    srv, _ = server
    plain = stream_chunks(srv, ignore_eos=True)
    assert all("usage" not in c for c in plain)
    chunks = stream_chunks(srv, ignore_eos=True, stream_options={"include_usage": True})
    *body, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 6
    assert all(c["usage"] is None and c["choices"] for c in body)
    assert "".join(c["choices"][0]["text"] for c in body) == \
        "".join(c["choices"][0]["text"] for c in plain)


def test_stream_options_are_type_checked(server):
    srv, _ = server
    r = post(srv, stream=True, stream_options={"include_usage": "yes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"


def metric(text, name):
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_metrics_count_prompt_and_generated_tokens(server):
    srv, engine = server
    before = httpx.get(srv.url + "/metrics").text
    r = post(srv, ignore_eos=True, max_tokens=5).json()
    after = httpx.get(srv.url + "/metrics").text
    assert metric(after, "inferlab_generation_tokens_total") - \
        metric(before, "inferlab_generation_tokens_total") == 5
    assert metric(after, "inferlab_prompt_tokens_total") - \
        metric(before, "inferlab_prompt_tokens_total") == r["usage"]["prompt_tokens"]
    line = StatsLogger(engine, srv.app.state.metrics).line()
    assert line is not None and "KV blocks in use 0/128" in line and "running 0" in line


def test_the_banner_says_what_the_server_runs(caplog):
    model, tok = model_and_tokenizer()
    engine = OnlineEngine(model, ServingConfig(num_blocks=40, max_batch=4))
    text = banner(engine, NAME)
    assert f"context {model.config.max_seq_len} tokens" in text
    assert "40 blocks x 16 tokens = 640 tokens" in text and NAME in text
    caplog.set_level(logging.INFO, logger="inferlab.serve")
    with BackgroundServer(create_app(engine, tok, NAME, stats_interval_s=0)):
        pass
    assert text in caplog.text


def test_help_documents_every_flag_with_its_default():
    p = parser()
    for action in p._actions:
        assert action.help, f"{action.option_strings} has no help"
    text = p.format_help()
    assert "(default: 32)" in text and "(default: course-target)" in text
    assert "(default: None)" not in text  # a flag without a default says what happens instead
