"""The OpenAI-compatible server: the official client, errors, overload, metrics, tenants, and
the bar: 300 streamed requests from 32 concurrent clients, a tenth hanging up mid-stream."""

import asyncio
import json
import socket
import threading

import httpx
import openai
import pytest
import torch

from course_server import NAME, model_and_tokenizer, start
from inferlab.serve.protocol import Detokenizer
from inferlab.serve.tenants import Tenants
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import serve
from inferlab.serving.request import Request



pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def server():
    srv, engine = start()
    with srv:
        yield srv, engine
    assert not engine._thread.is_alive() and not srv.thread.is_alive()


def test_the_official_openai_client_streaming_and_not(server):
    srv, engine = server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    whole = client.completions.create(model=NAME, prompt="def parse(line):", max_tokens=12,
                                      temperature=0)
    parts = list(client.completions.create(model=NAME, prompt="def parse(line):",
                                           max_tokens=12, temperature=0, stream=True))
    assert whole.choices[0].text and "".join(p.choices[0].text for p in parts) == \
        whole.choices[0].text
    assert parts[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert whole.usage.completion_tokens <= 12
    model, tok = model_and_tokenizer()
    ids = tok.encode("def parse(line):")
    offline = serve(model, [Request(ids, 12, eos_token_ids=(tok.eos_token_id,))],
                    ServingConfig(num_blocks=64, max_batch=4)).results[0].tokens
    assert whole.choices[0].text == tok.decode(offline)
    by_ids = client.completions.create(model=NAME, prompt=ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == whole.choices[0].text
    assert [m.id for m in client.models.list().data] == [NAME]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)


def test_responses_leave_at_once_without_nagles_delay(server):
    """The listening socket is TCP (``IPPROTO_TCP``), so asyncio sets TCP_NODELAY on every
    connection: a response's headers and body, written separately, leave at once. A plain
    ``socket()`` (protocol 0) did not, and each body then waited for the client's delayed ACK,
    40 ms a response."""
    srv, _ = server
    assert srv._sock.proto == socket.IPPROTO_TCP
    with httpx.Client(base_url=srv.url) as client:      # keeps its connection open
        assert client.get("/v1/models").status_code == 200
        # what decides the 40 ms is the option on the server's end of the connection, so the
        # test reads it there rather than timing responses (a verdict load could flip)
        sockets = [p.transport.get_extra_info("socket")
                   for p in srv.server.server_state.connections]
        assert sockets, "no open connection on the server's side"
        assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)


BAD = [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"prompt": "x"}).encode(), 400, "model"),
    (json.dumps({"model": NAME, "prompt": "x", "max_tokens": -3}).encode(), 400, "max_tokens"),
    (json.dumps({"model": NAME, "prompt": "x", "max_tokens": "many"}).encode(), 400,
     "max_tokens"),
    (json.dumps({"model": NAME, "prompt": "x", "temperature": "hot"}).encode(), 400,
     "temperature"),
    (json.dumps({"model": NAME, "prompt": [5] * 600}).encode(), 400, "prompt"),
    (json.dumps({"model": NAME, "prompt": [5, 99999]}).encode(), 400, "prompt"),
    (json.dumps({"model": NAME, "prompt": ["a", "b"]}).encode(), 400, "prompt"),
    (json.dumps({"model": NAME, "prompt": "x", "n": 2}).encode(), 400, "n"),
    (json.dumps({"model": "other", "prompt": "x"}).encode(), 404, "model"),
]


def test_bad_requests_get_openai_error_bodies(server):
    srv, engine = server
    for body, status, param in BAD:
        r = httpx.post(srv.url + "/v1/completions", content=body,
                       headers={"content-type": "application/json"})
        assert r.status_code == status, body
        err = r.json()["error"]
        assert err["message"] and err["type"] and err["param"] == param, (body, err)
    assert httpx.get(srv.url + "/nowhere").json()["error"]["message"]
    assert engine.wait_idle() and engine.blocks_in_use == 0


def test_stop_strings_cut_the_text_and_free_the_blocks(server):
    srv, engine = server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    full = client.completions.create(model=NAME, prompt="def parse(line):", max_tokens=30,
                                     temperature=0).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    for stream in (False, True):
        r = client.completions.create(model=NAME, prompt="def parse(line):", max_tokens=30,
                                      temperature=0, stop=[stop], stream=stream)
        text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
        assert text == full[:full.find(stop)]
    assert engine.wait_idle() and engine.blocks_in_use == 0


def test_detokenizer_holds_back_a_possible_stop_string():
    _, tok = model_and_tokenizer()
    ids = tok.encode("alpha beta gamma delta")
    d = Detokenizer(tok, ["gamma"])
    out = "".join(d.push(t) for t in ids) + d.flush()
    assert out == "alpha beta " and d.stopped


def test_overload_answers_429_with_retry_after_and_health_stays_up():
    srv, engine = start(ServingConfig(num_blocks=256, max_batch=2), max_waiting=4)

    async def burst():
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            return await asyncio.gather(*(c.post("/v1/completions", json={
                "model": NAME, "prompt": "x" * 40, "max_tokens": 40, "temperature": 0})
                for _ in range(24)))
    with srv:
        answers = asyncio.run(burst())
        codes = [a.status_code for a in answers]
        # at least the queue's worth is served (more if the loop admits some to the running
        # batch before the burst ends); the rest are refused at once
        assert codes.count(200) >= 4 and codes.count(429) >= 1, codes
        assert set(codes) <= {200, 429}
        refused = next(a for a in answers if a.status_code == 429)
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert httpx.get(srv.url + "/health").status_code == 200
        assert 'finish_reason="rejected"' in httpx.get(srv.url + "/metrics").text


def test_shutdown_drains_requests_in_flight():
    srv, engine = start(ServingConfig(num_blocks=256, max_batch=4))
    srv.start()
    got = {}

    def call():
        got["r"] = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "model": NAME, "prompt": "def", "max_tokens": 60, "temperature": 0})
    t = threading.Thread(target=call)
    t.start()
    while engine.num_running == 0 and t.is_alive():
        pass
    srv.stop()
    t.join()
    assert got["r"].status_code == 200 and got["r"].json()["usage"]["completion_tokens"] > 0
    assert not engine.alive


def test_tenants_keys_and_per_tenant_limits():
    tenants = Tenants({"ka": "alice", "kb": "bob"}, max_in_flight=2)
    srv, engine = start(tenants=tenants)
    body = {"model": NAME, "prompt": "def", "max_tokens": 30, "temperature": 0}

    async def burst():
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            alice = [c.post("/v1/completions", json=body, headers={"Authorization": "Bearer ka"})
                     for _ in range(6)]
            bob = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer kb"})
            return await asyncio.gather(*alice, bob)
    with srv:
        assert httpx.post(srv.url + "/v1/completions", json=body).status_code == 401
        assert httpx.post(srv.url + "/v1/completions", json=body,
                          headers={"Authorization": "Bearer nope"}).status_code == 401
        *alice, bob = asyncio.run(burst())
        assert bob.status_code == 200
        codes = [a.status_code for a in alice]
        assert codes.count(429) >= 1 and codes.count(200) >= 2, codes
        assert tenants.in_flight["alice"] == 0 and tenants.in_flight["bob"] == 0
        assert 'tenant="alice"' in httpx.get(srv.url + "/metrics").text


def test_prefix_cache_salted_per_tenant_gives_the_same_tokens():
    config = ServingConfig(num_blocks=256, max_batch=8, token_budget=128, policy="chunked")
    for salted in (False, True):
        srv, engine = start(config, prefix_cache=True,
                            tenants=Tenants({"ka": "a", "kb": "b"}, salted=salted))
        body = {"model": NAME, "prompt": "def parse(line):\n" * 20, "max_tokens": 8,
                "temperature": 0}
        with srv:
            texts = [httpx.post(srv.url + "/v1/completions", json=body, timeout=60,
                                headers={"Authorization": f"Bearer {k}"}).json()
                     for k in ("ka", "kb", "ka")]
            hits = engine.cache.memory.cache.hits
        assert texts[0]["choices"] == texts[1]["choices"] == texts[2]["choices"]
        prompt_blocks = (texts[0]["usage"]["prompt_tokens"] - 1) // 16
        # shared: b and a's second request hit a's blocks; salted: only a's second request
        assert hits == (2 if not salted else 1) * prompt_blocks


def test_cache_salt_is_a_secret_per_tenant_not_the_name():
    """A client who knows a tenant's name cannot compute its salt: the salt is an HMAC of the
    name under the server's secret, stable per tenant, distinct across tenants and secrets."""
    keys = {"ka": "alice", "kb": "bob"}
    one, other = Tenants(keys, salted=True), Tenants(keys, salted=True)
    assert Tenants(keys).cache_salt("alice") is None          # unsalted: the shared namespace
    salt = one.cache_salt("alice")
    assert salt == one.cache_salt("alice") != one.cache_salt("bob")
    assert "alice" not in salt and len(bytes.fromhex(salt)) == 32   # 256 bits, not the name
    assert other.cache_salt("alice") != salt                  # another server's secret
    fixed = Tenants(keys, salted=True, salt_secret=b"k" * 32)
    assert fixed.cache_salt("alice") == Tenants(keys, salted=True,
                                                salt_secret=b"k" * 32).cache_salt("alice")


def test_300_streams_32_clients_a_tenth_hang_up(server):
    """The bar: every completed stream equals offline serve; aborted ones leak no block."""
    srv, engine = server
    model, tok = model_and_tokenizer()
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(4, 48, (300,), generator=g).tolist()
    news = torch.randint(4, 24, (300,), generator=g).tolist()
    prompts = [torch.randint(1, model.config.vocab_size, (n,), generator=g).tolist()
               for n in lens]
    hang_up = set(range(5, 300, 10))  # a tenth of the clients leave after two chunks

    async def client(c, i, results, sem):
        async with sem:
            body = {"model": NAME, "prompt": prompts[i], "max_tokens": news[i],
                    "temperature": 0, "stream": True}
            async with c.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                text, chunks = [], 0
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    text.append(json.loads(line[6:])["choices"][0]["text"])
                    chunks += 1
                    if i in hang_up and chunks == 2:
                        return  # closing the response drops the connection
                results[i] = "".join(text)

    async def run():
        results, sem = {}, asyncio.Semaphore(32)
        async with httpx.AsyncClient(base_url=srv.url, timeout=120,
                                     limits=httpx.Limits(max_connections=32)) as c:
            await asyncio.gather(*(client(c, i, results, sem) for i in range(300)))
        return results
    results = asyncio.run(run())
    keep = [i for i in range(300) if i not in hang_up]
    assert sorted(results) == keep
    offline = serve(model, [Request(prompts[i], news[i], eos_token_ids=(tok.eos_token_id,))
                            for i in keep], ServingConfig(num_blocks=256, max_batch=32))
    for i, res in zip(keep, offline.results):
        assert results[i] == tok.decode(res.tokens), i
    assert engine.wait_idle() and engine.blocks_in_use == 0  # the last aborts reach the loop
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
    counts = {line.split("{")[1].split(",")[0]: float(line.split()[-1])
              for line in httpx.get(srv.url + "/metrics").text.splitlines()
              if line.startswith("inferlab_requests_total{")}
    assert counts['finish_reason="abort"'] >= 10  # hang-ups that the engine saw mid-request
    assert sum(counts.values()) == 300
