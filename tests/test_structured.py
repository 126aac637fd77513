"""Structured outputs on the course server and in its engine: XGrammar's bitmask, through the
official ``openai`` client.

A JSON schema's output parses and validates against the schema (``jsonschema``, which nbformat
brings), a regex is matched whole, a choice is one of the choices, a grammar's sentence is one;
the Responses API's ``text.format`` and a stream do the same; free requests served beside
constrained ones get the text they get alone; the engine gives a constrained request the same
tokens under continuous and chunked batching; what is malformed is refused with a 400 naming
the field. The tokenizer's vocabulary is read from the checkpoint: nothing is downloaded.
"""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
import torch

from course_server import NAME, model_and_tokenizer, start
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import serve
from inferlab.serving.request import Request
from inferlab.serving.structured import Grammars, apply_grammars, unpack

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MESSAGES = [{"role": "user", "content": "Where does the function start? Answer as JSON."}]
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "line": {"type": "integer", "minimum": 0, "maximum": 9999},
                         "public": {"type": "boolean"}},
          "required": ["name", "line", "public"], "additionalProperties": False}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
PROMPT = "# where the function starts, as JSON\nrecord = "


@pytest.fixture(scope="module")
def server():
    srv, engine = start(ServingConfig(num_blocks=256, max_batch=8), stats_interval_s=0)
    with srv:
        yield srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def grammars():
    model, tok = model_and_tokenizer()
    return Grammars(tok, model.config.vocab_size, (tok.eos_token_id,))


def test_a_json_schema_through_chat_completions_parses_and_validates(server):
    _, client = server
    fmt = {"type": "json_schema", "json_schema": {"name": "where", "schema": SCHEMA,
                                                  "strict": True}}
    for temperature, seed in ((0, None), (1.0, 7), (1.0, 8)):
        reply = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=80,
                                               temperature=temperature, seed=seed,
                                               response_format=fmt)
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_a_streamed_json_object_parses(server):
    _, client = server
    chunks = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=120,
                                            temperature=0, stream=True,
                                            response_format={"type": "json_object"})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict)


def test_the_responses_api_text_format_is_enforced(server):
    _, client = server
    out = client.responses.create(model=NAME, input=MESSAGES[0]["content"], temperature=0,
                                  max_output_tokens=80,
                                  text={"format": {"type": "json_schema", "name": "where",
                                                   "schema": SCHEMA, "strict": True}})
    assert out.status == "completed"
    jsonschema.validate(json.loads(out.output_text), SCHEMA)
    assert out.text.format.type == "json_schema"  # echoed back


def test_vllm_s_structured_outputs_regex_choice_and_grammar(server):
    _, client = server
    done = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=20, temperature=0,
                                     extra_body={"structured_outputs": {"regex": REGEX}})
    assert re.fullmatch(REGEX, done.choices[0].text) and done.choices[0].finish_reason == "stop"
    choices = ["yes", "no", "maybe later"]
    for seed in range(3):
        got = client.chat.completions.create(
            model=NAME, messages=MESSAGES, max_tokens=10, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"choice": choices}})
        assert got.choices[0].message.content in choices
    ebnf = 'root ::= "x = " [1-9] [0-9]? ";"'
    said = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=10, temperature=0,
                                     extra_body={"structured_outputs": {"grammar": ebnf}})
    assert re.fullmatch(r"x = [1-9][0-9]?;", said.choices[0].text)


def test_free_requests_beside_constrained_ones_get_the_text_they_get_alone(server):
    srv, client = server
    prompts = ["def parse(line):\n    ", "import os\n", "class Node:\n    def "]

    def free(prompt):
        return client.completions.create(model=NAME, prompt=prompt, max_tokens=16,
                                         temperature=0).choices[0].text

    def held(i):
        return client.completions.create(model=NAME, prompt=PROMPT, max_tokens=24,
                                         temperature=0, extra_body={"structured_outputs": {
                                             "regex": REGEX if i % 2 else r"[a-z_]{1,20}"}})

    alone = [free(p) for p in prompts]
    with ThreadPoolExecutor(8) as pool:
        constrained = [pool.submit(held, i) for i in range(5)]
        mixed = list(pool.map(free, prompts))
        outs = [c.result().choices[0].text for c in constrained]
    assert mixed == alone
    assert all(re.fullmatch(REGEX if i % 2 else r"[a-z_]{1,20}", t) for i, t in enumerate(outs))


@pytest.mark.parametrize("change, param", [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objectx"}}}}, "response_format.json_schema.schema"),
    ({"response_format": "json"}, "response_format"),
    ({"structured_outputs": {"regex": "([a-"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["a", 3]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"json": {"type": "object"}, "structural_tag": "x"}},
     "structured_outputs.structural_tag"),
    ({"structured_outputs": {"regex": "a+", "backend": "x"}}, "structured_outputs.backend"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object"),
    ({"structured_outputs": {"regex": "a+"}, "response_format": {"type": "json_object"}},
     "response_format"),
    ({"structured_outputs": {"regex": "a+"}, "ignore_eos": True}, "ignore_eos"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"guided_regex": "a+"}, "guided_regex"),
])
def test_malformed_structured_outputs_are_refused_by_name(server, change, param):
    srv, _ = server
    body = {"model": NAME, "messages": MESSAGES, "max_tokens": 4} | change
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("text, param", [
    ({"format": {"type": "json_schema", "name": "x", "schema": {"type": "objectx"}}},
     "text.format.schema"),
    ({"format": {"type": "json_schema", "name": "x"}}, "text.format.schema"),
    ({"format": {"type": "yaml"}}, "text.format.type"),
    ({"formats": {}}, "text.format"),
])
def test_the_responses_api_names_text_format(server, text, param):
    srv, _ = server
    r = httpx.post(srv.url + "/v1/responses", timeout=60,
                   json={"model": NAME, "input": "hi", "max_output_tokens": 4, "text": text})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_the_engine_constrains_alike_under_continuous_and_chunked_batching(grammars):
    model, tok = model_and_tokenizer()
    eos = (tok.eos_token_id,)
    prompt = tok.encode(PROMPT)
    reqs = [Request(prompt, 60, eos_token_ids=eos, grammar=grammars.compile("json", SCHEMA)),
            Request(tok.encode("def main():\n" * 20), 12, eos_token_ids=eos),
            Request(prompt, 20, eos_token_ids=eos, grammar=grammars.compile("regex", REGEX),
                    temperature=1.0, seed=3)]
    runs = [serve(model, reqs, ServingConfig(num_blocks=128, max_batch=4)),
            serve(model, reqs, ServingConfig(num_blocks=128, max_batch=4, token_budget=16))]
    a, b = ([r.tokens for r in run.results] for run in runs)
    assert a == b
    jsonschema.validate(json.loads(tok.decode(a[0][:-1])), SCHEMA)  # the last is EOS
    assert re.fullmatch(REGEX, tok.decode(a[2][:-1]))
    free = serve(model, reqs[1:2], ServingConfig(num_blocks=128, max_batch=4)).results[0]
    assert a[1] == free.tokens  # the free row untouched


def test_the_mask_keeps_exactly_the_allowed_tokens_and_lifts_minus_infinity(grammars):
    """The bitmask's allowed set, applied: masked logits at the dtype's lowest finite value (the
    sampler reads infinities as faults), allowed ones unchanged, rows without a grammar
    untouched, a row that keeps no token untouched."""
    import xgrammar as xgr

    model, tok = model_and_tokenizer()
    grammar = grammars.compile("choice", ["yes", "no"])

    class Seq:
        output: list = []
        request = Request((1,), 4, grammar=grammar)

    class Free:
        output: list = []
        request = Request((1,), 4)

    Row = type("Row", (), {})
    rows = []
    for seq, emits in ((Seq(), True), (Free(), True), (Seq(), False)):
        r = Row()
        r.seq, r.emits = seq, emits
        r.start, r.new = 0, 1  # the prompt's one token: nothing generated yet
        rows.append(r)
    V = model.config.vocab_size
    logits = torch.randn(3, V)
    before = logits.clone()
    from inferlab.serving.structured import Matchers

    out = apply_grammars(rows, logits, Matchers())
    bits = xgr.allocate_token_bitmask(1, V)
    xgr.GrammarMatcher(grammar).fill_next_token_bitmask(bits, 0)
    allowed = unpack(bits, V)[0]
    assert 0 < int(allowed.sum()) < V
    assert torch.isfinite(out).all()
    assert torch.equal(out[0][allowed], before[0][allowed])
    assert (out[0][~allowed] == torch.finfo(torch.float32).min).all()
    assert torch.equal(out[1:], before[1:])
    assert all(tok.decode([t]) and ("yes".startswith(tok.decode([t]))
                                    or "no".startswith(tok.decode([t])))
               for t in torch.nonzero(allowed).flatten().tolist())
