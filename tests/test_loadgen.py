"""The load generator: its view of the course server nests the engine's own timings request by
request; prompts have the lengths the server counts; the options a vllm bench serve user looks
for do what they say; the command line prints the table and writes the JSON and the plot."""

import json
import math

import numpy as np
import pytest

from inferlab.benchmarks.loadgen_agreement import REGIMES, compare, measure
from inferlab.loadgen.__main__ import main, parser
from inferlab.loadgen.client import (CHAT, LoadRequest, Outcome, ServerUnreachable, make_load,
                                     random_lengths, request_body, run, wait_until_ready)
from inferlab.loadgen.dataset import PromptTokenizer, arrival_times
from inferlab.loadgen.report import (DEFAULT_SLO, arrivals_text, detailed, inter_token_latencies,
                                     report, table)
from inferlab.serve.__main__ import build
from inferlab.serve.background import BackgroundServer
from inferlab.serving.metrics import SLO

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_make_load_follows_the_trace_and_the_rate():
    load = make_load("sharegpt_like", 200, rate=10.0, scale=0.125, max_len=512, seed=1)
    assert len(load) == 200 and all(len(r.prompt) + r.max_tokens <= 512 for r in load)
    gaps = [b.send_at_s - a.send_at_s for a, b in zip(load, load[1:])]
    assert min(gaps) >= 0 and 0.07 < sum(gaps) / len(gaps) < 0.13
    assert all(r.send_at_s == 0 for r in make_load("alpaca_like", 5))
    with pytest.raises(ValueError, match="unknown trace"):
        make_load("nope", 5)


def _the_clocks_nest(views, n):
    """What holds whatever the load: every request matched by id, and request by request the
    client's clock contains the engine's (it starts before the handler runs and stops after the
    chunk arrives) and the server's hand-over is part of the client's extra time. How close the
    two views come (the agreement the chapter prints) depends on the machine's load, so it is
    reported by ``python -m inferlab.benchmarks.loadgen_agreement``, not asserted here."""
    assert views["failed"] == 0 and views["n_requests"] == n
    assert views["http_path_s"]["min"] >= 0 and views["e2e_path_s"]["min"] >= 0, views
    assert views["handover_s"]["min"] >= 0 and views["trips_s"]["min"] >= 0, views
    for metric in ("ttft", "tpot", "latency", "throughput"):
        assert math.isfinite(views[metric]["difference"]), (metric, views[metric])


def test_loadgen_agrees_with_the_engine_under_chapter_nines_load():
    """In-process, at Chapter 9's load: TPOT, E2E and throughput within 10%; TTFT differs by the
    HTTP path, a few milliseconds per request (a prefill here is about as short)."""
    app = build(max_batch=16, num_blocks=256)
    load = make_load("sharegpt_like", 32, rate=8.0, scale=0.125, max_len=512, seed=0)
    with BackgroundServer(app) as srv:
        outcomes = run(srv.url, "course-target", load, progress=False)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    # one chunk per token, and every request ran to max_tokens (ignore_eos)
    assert [len(o.chunk_times_s) for o in outcomes] == [r.max_tokens for r in load]
    assert [o.completion_tokens for o in outcomes] == [r.max_tokens for r in load]
    views = compare(detailed(outcomes), app.state.records)
    _the_clocks_nest(views, len(load))


def test_loadgen_command_agrees_with_the_engine_when_requests_queue():
    """The load generator's command in a process of its own, as a user runs it, against a
    server whose batch of 2 makes requests wait: TTFT is mostly queueing the engine sees, and all
    four metrics agree within 10% (python -m inferlab.benchmarks.loadgen_agreement)."""
    result = measure(REGIMES["queued"])
    _the_clocks_nest(result, REGIMES["queued"].num_requests)


def test_compare_matches_requests_by_id():
    requests = [{"id": "a", "sent_s": 0.0, "chunk_times_s": [0.3, 0.4], "error": None},
                {"id": "b", "sent_s": 1.0, "chunk_times_s": [1.2, 1.3, 1.4], "error": None},
                {"id": None, "sent_s": 2.0, "chunk_times_s": [], "error": "HTTP 429"}]
    records = [{"id": "b", "arrival_s": 10.01, "token_times_s": [10.19, 10.29, 10.39]},
               {"id": "a", "arrival_s": 5.02, "token_times_s": [5.3, 5.4]}]
    v = compare(requests, records)
    assert v["n_requests"] == 2 and v["failed"] == 1
    assert v["ttft"]["loadgen_s"] == pytest.approx(0.25)
    assert v["ttft"]["engine_s"] == pytest.approx((0.28 + 0.18) / 2)
    assert v["http_path_s"]["min"] == pytest.approx(0.02)
    assert v["tpot"]["difference"] == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="no engine record"):
        compare(requests, records[:1])


def _outcome(sent, times, prompt_len, status=200, error=None, prompt_tokens=None):
    o = Outcome(LoadRequest((1,) * prompt_len, len(times), sent), sent, list(times),
                status=status, error=error, prompt_tokens=prompt_tokens)
    o.completion_tokens = len(times) if times else None
    return o


def test_report_and_table_from_known_times():
    outs = [_outcome(0.0, [0.1, 0.2, 0.4], 10), _outcome(0.5, [0.6, 0.7], 4),
            _outcome(1.0, [], 100, status=429, error="queue full")]
    row = report(outs, SLO(0.2, 0.12))
    assert row["n_requests"] == 2 and row["failed"] == 1 and row["n_tokens"] == 5
    # as vllm bench serve counts them: the inputs of the requests that finished
    assert row["input_tokens"] == 14 and row["output_tokens"] == 5
    assert row["input_counted_by"] == "client"  # no usage from the server here
    assert row["total_throughput_tok_s"] == pytest.approx(19 / 0.7)
    assert "14 in (as sent)" in table(row) and "total tok/s" in table(row)
    assert row["ttft_mean_s"] == pytest.approx(0.1)
    assert row["ttft_std_s"] == pytest.approx(0.0, abs=1e-12)
    assert row["latency_std_s"] == pytest.approx(np.std([0.4, 0.2]))
    assert sorted(inter_token_latencies(outs)) == pytest.approx([0.1, 0.1, 0.2])
    # only the second met TPOT <= 0.12; the refused one counts against the share
    assert row["in_slo_req_s"] == pytest.approx(1 / 0.7)
    assert row["slo_attainment"] == pytest.approx(1 / 3)
    text = table(row)
    assert "TTFT" in text and "in-SLO rate (vLLM's request goodput) 1.43 req/s" in text and "std" in text.splitlines()[0]
    assert "1 failed (HTTP 429 Too Many Requests x 1)" in text


def test_input_tokens_are_the_server_s_count_when_it_gives_one():
    outs = [_outcome(0.0, [0.1, 0.2], 10, prompt_tokens=16),
            _outcome(0.0, [0.1, 0.3], 20, prompt_tokens=26)]
    row = report(outs)
    assert row["input_tokens"] == 42 and row["input_counted_by"] == "server"
    assert row["prompt_tokens_sent"] == 30 and "42 in (the server's count)" in table(row)


def test_goodput_bounds_ttft_tpot_and_e2e_as_vllm_counts_them():
    outs = [_outcome(0.0, [0.1, 0.2, 0.3], 4),   # TTFT 0.1, TPOT 0.1, E2E 0.3
            _outcome(0.0, [0.3], 4),             # one token: no TPOT, which then counts as met
            _outcome(0.0, [0.1, 0.5], 4)]        # TPOT 0.4, E2E 0.5
    assert report(outs, {"ttft": 0.35})["slo_attainment"] == pytest.approx(1.0)
    assert report(outs, {"tpot": 0.1})["slo_attainment"] == pytest.approx(2 / 3)
    assert report(outs, {"e2el": 0.3})["slo_attainment"] == pytest.approx(2 / 3)
    both = report(outs, {"ttft": 0.2, "e2el": 0.4})
    assert both["slo_attainment"] == pytest.approx(1 / 3)
    assert both["in_slo_req_s"] == pytest.approx(1 / 0.5)  # one good request in 0.5 s
    assert "TTFT <= 200 ms, E2E <= 400 ms" in table(both)
    with pytest.raises(ValueError, match="objectives"):
        report(outs, {"itl": 0.1})


def test_percentiles_are_configurable_and_match_numpy():
    outs = [_outcome(0.0, [t, t + 0.05], 4) for t in (0.1, 0.2, 0.3, 0.4, 0.9)]
    row = report(outs, percentiles=(25, 90, 99.9))
    for q in (25, 90, 99.9):
        assert row[f"ttft_p{q:g}_s"] == pytest.approx(np.percentile([0.1, 0.2, 0.3, 0.4, 0.9], q))
    assert "ttft_p50_s" not in row
    head = table(row, ["ttft", "latency"]).splitlines()
    assert head[0].split()[:6] == ["metric", "mean", "std", "p25", "p90", "p99.9"]
    assert [line.split()[0] for line in head[1:3]] == ["TTFT", "E2E"]


def test_failures_are_named_by_kind():
    outs = [_outcome(0.0, [0.1], 4)] + [_outcome(0.0, [], 4, status=429, error="full")] * 3 + [
        _outcome(0.0, [], 4, status=None, error="ConnectError: refused"),
        _outcome(0.0, [], 4, status=200)]
    row = report(outs)
    assert row["failed"] == 5
    assert row["failures"] == {"HTTP 429": 3, "ConnectError": 1, "no tokens streamed": 1}
    assert ("5 failed (HTTP 429 Too Many Requests x 3, ConnectError x 1, no tokens streamed x 1)"
            in table(row))


def test_request_bodies_carry_only_the_sampling_parameters_given():
    req = LoadRequest((5, 6, 7), 4, 0.0, text="abc")
    plain = request_body("m", req)
    assert plain["prompt"] == [5, 6, 7] and plain["max_tokens"] == 4
    assert plain["ignore_eos"] is True and "temperature" not in plain
    assert plain["stream_options"] == {"include_usage": True}
    tuned = request_body("m", req, ignore_eos=False, sampling={"temperature": 0.7, "top_k": 5})
    assert "ignore_eos" not in tuned and tuned["temperature"] == 0.7 and tuned["top_k"] == 5
    chat = request_body("m", req, CHAT)
    assert chat["messages"] == [{"role": "user", "content": "abc"}]
    assert chat["max_completion_tokens"] == 4 and "prompt" not in chat
    with pytest.raises(ValueError, match="chat request sends text"):
        request_body("m", LoadRequest((1,), 1, 0.0), CHAT)


def test_command_line_writes_json_and_plot(tmp_path, capsys):
    app = build(max_batch=8, num_blocks=128)
    out = tmp_path / "load.json"
    with BackgroundServer(app) as srv:
        rows = main(["--url", srv.url, "--trace", "alpaca_like", "--rate", "inf,20",
                     "--num-requests", "8", "--scale", "0.25", "--out", str(out),
                     "--no-progress"])
    assert len(rows) == 2 and rows[0]["rate_req_s"] is None and rows[1]["rate_req_s"] == 20
    saved = json.loads(out.read_text())
    assert saved["meta"]["model"] == "course-target" and len(saved["runs"]) == 2
    assert (tmp_path / "load.png").stat().st_size > 0
    assert "E2E latency" in capsys.readouterr().out
    assert not math.isnan(rows[0]["throughput_tok_s"])


def test_command_line_replays_given_arrival_times(tmp_path):
    app = build(max_batch=8, num_blocks=128)
    times = tmp_path / "arrivals.txt"
    times.write_text("0.0\n0.05\n0.3\n")
    with BackgroundServer(app) as srv:
        [row] = main(["--url", srv.url, "--trace", "alpaca_like", "--arrivals-file", str(times),
                      "--scale", "0.25", "--no-progress"])
    assert row["n_requests"] == 3 and row["rate_req_s"] is None
    assert row["duration_s"] > 0.3  # the last one was sent 0.3 s after the first


def test_random_dataset_has_the_given_lengths():
    load = make_load("random", 20, input_len=64, output_len=16, seed=3)
    assert {len(r.prompt) for r in load} == {64} and {r.max_tokens for r in load} == {16}
    rows = random_lengths(500, 100, 10, range_ratio=0.5, seed=0)
    assert {r.prompt_len for r in rows} <= set(range(50, 151)) and \
        {r.output_len for r in rows} <= set(range(5, 16))
    assert len({r.prompt_len for r in rows}) > 50  # drawn, not fixed
    assert rows == random_lengths(500, 100, 10, range_ratio=0.5, seed=0)
    with pytest.raises(ValueError, match="range_ratio"):
        random_lengths(5, 10, 10, range_ratio=1.0)


def test_max_concurrency_caps_the_requests_in_flight():
    app = build(max_batch=8, num_blocks=128)
    load = make_load("random", 6, input_len=8, output_len=6, seed=0)  # all sent at once
    with BackgroundServer(app) as srv:
        outcomes = run(srv.url, "course-target", load, progress=False, max_concurrency=2)
    assert all(o.ok for o in outcomes)
    spans = [(o.sent_s, o.chunk_times_s[-1]) for o in outcomes]
    # at each send, the requests sent earlier and not yet done (their last chunk after it)
    in_flight = [sum(s < t <= e for s, e in spans) + 1 for t, _ in spans]
    assert max(in_flight) <= 2, spans


def test_an_unreachable_server_gets_a_message_not_a_traceback(capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SystemExit) as stop:
        main(["--url", f"http://127.0.0.1:{port}", "--no-progress"])
    assert "cannot reach a server at" in str(stop.value.code)
    assert "python -m inferlab.serve" in str(stop.value.code)


def test_the_default_slo_is_chapter_nines(root, capsys):
    from inferlab.course import catalog  # Chapter 9 is split into pages: read them all

    chapter = "\n".join((root / f"{page}.md").read_text()
                         for page in catalog.chapters(root)["book/ch09_serving"])
    assert "report(outcomes, DEFAULT_SLO" in chapter  # the chapter measures against it
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert (f"(default ttft:{DEFAULT_SLO.ttft_s * 1e3:g} tpot:{DEFAULT_SLO.tpot_s * 1e3:g}, "
            "Chapter 9's SLO)") in shown


def test_every_option_says_its_default_in_plain_text(capsys):
    p = parser()
    for action in p._actions:
        if action.dest != "help":
            assert "default" in (action.help or ""), action.option_strings
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    assert not any(markup in shown for markup in ("``", ":func:", ":class:", "%(default"))


def test_arrivals_are_described_in_words_not_as_rate_inf():
    assert arrivals_text(math.inf) == "all sent at once"
    assert arrivals_text(8.0) == "Poisson arrivals at 8 req/s"
    assert arrivals_text(8.0, 0.5) == "gamma, burstiness 0.5, arrivals at 8 req/s"
    assert arrivals_text(math.nan, given="times.txt") == "send times from times.txt"


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_keep_the_rate_and_shape_the_gaps(burstiness):
    times = arrival_times(4000, 10.0, burstiness, seed=1)
    gaps = np.diff([0.0, *times])
    assert gaps.mean() == pytest.approx(0.1, rel=0.1)  # the rate is the rate
    # a gamma distribution of shape k has a coefficient of variation of 1 / sqrt(k)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.1)
    assert arrival_times(5, 10.0, math.inf) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert arrival_times(3, math.inf, burstiness) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="burstiness"):
        arrival_times(3, 1.0, 0.0)


def test_text_prompts_have_exactly_the_tokens_the_tokenizer_counts():
    tok = PromptTokenizer.load("course-target")
    # byte-level BPE does not round-trip random ids: decoding and encoding again drifts
    rng = np.random.default_rng(0)
    drifted = sum(len(tok.encode(tok.decode(tok.draw(rng, 64)))) != 64 for _ in range(20))
    assert drifted > 0
    load = make_load("random", 40, input_len=64, output_len=4, range_ratio=0.9, seed=2,
                     tokenizer=tok, text=True)
    assert [len(tok.encode(r.text)) for r in load] == [len(r.prompt) for r in load]
    assert [len(r.prompt) for r in load] == [w.prompt_len for w in
                                             random_lengths(40, 64, 4, 0.9, seed=2)]
    assert all(r.text == r.text.strip() for r in load)
    assert 0 not in {t for r in load for t in r.prompt}  # no special token (<|endoftext|> is 0)


def test_a_shared_prefix_starts_every_prompt():
    tok = PromptTokenizer.load("course-target")
    ids = make_load("random", 6, input_len=20, output_len=2, prefix_len=32, seed=1)
    assert {len(r.prompt) for r in ids} == {52} and len({r.prompt[:32] for r in ids}) == 1
    assert len({r.prompt[32:] for r in ids}) == 6
    text = make_load("random", 6, input_len=20, output_len=2, prefix_len=32, seed=1,
                     tokenizer=tok, text=True)
    assert {len(r.prompt) for r in text} == {52} and len({r.prompt[:32] for r in text}) == 1
    with pytest.raises(ValueError, match="shared prefix"):
        make_load("sharegpt_like", 3, prefix_len=8)


def test_a_shared_prefix_is_computed_once_by_a_prefix_cache():
    """64 shared tokens are four 16-token blocks: sent one after another, every request after
    the first finds those four blocks in the engine's prefix cache, and no more."""
    app = build(max_batch=8, num_blocks=256, token_budget=512, prefix_cache=True)
    load = make_load("random", 5, input_len=24, output_len=2, prefix_len=64, seed=3)
    with BackgroundServer(app) as srv:
        outcomes = run(srv.url, "course-target", load, progress=False, max_concurrency=1)
        hits = app.state.engine.cache.memory.cache.hits
    assert all(o.ok for o in outcomes)
    assert hits == 4 * (len(load) - 1)


def test_chat_prompts_are_as_long_as_asked_plus_the_template(tmp_path):
    """--endpoint /v1/chat/completions: a 64-token prompt reaches the server as 64 tokens and
    the chat template's few; 128 is not four times 128 (each id sent as a word used to be)."""
    tok = PromptTokenizer.load("course-target")
    app = build(max_batch=8, num_blocks=256)
    out = tmp_path / "chat.json"
    with BackgroundServer(app) as srv:
        load = make_load("random", 4, input_len=64, output_len=3, seed=1, tokenizer=tok,
                         text=True)
        short = run(srv.url, "course-target", load, progress=False, endpoint=CHAT)
        [row] = main(["--url", srv.url, "--trace", "random", "--random-input-len", "128",
                      "--random-output-len", "3", "--num-requests", "4", "--no-progress",
                      "--endpoint", CHAT, "--detailed", "--out", str(out)])
    assert all(o.ok for o in short) and [len(o.request.prompt) for o in short] == [64] * 4
    # the template's own tokens ("# user:" ... "# assistant:"), counted around a one-token text
    from inferlab.model.chat_template import load_chat_template, render_chat
    from inferlab.model.weights import checkpoint_path

    wrapped = render_chat(load_chat_template(checkpoint_path("course-target")),
                          [{"role": "user", "content": "x"}])
    overhead = len(tok.encode(wrapped)) - len(tok.encode("x"))
    assert [o.prompt_tokens for o in short] == [64 + overhead] * 4
    sent = [r["server_prompt_tokens"] for r in row["requests"]]
    assert sent == [128 + overhead] * 4  # not 501
    assert row["input_tokens"] == sum(sent) and row["input_counted_by"] == "server"
    assert json.loads(out.read_text())["meta"]["tokenizer"] == "course-target"


def test_the_chat_endpoint_streams_every_token_of_every_request(capsys):
    """``--endpoint /v1/chat/completions``: the same load as chat calls, every requested token
    streamed as a timed delta, the server's usage read back."""
    tok = PromptTokenizer.load("course-target")
    app = build(max_batch=8, num_blocks=128)
    load = make_load("random", 4, input_len=8, output_len=5, seed=1, tokenizer=tok, text=True)
    with BackgroundServer(app) as srv:
        outcomes = run(srv.url, "course-target", load, progress=False, endpoint=CHAT)
    assert all(o.ok and o.status == 200 for o in outcomes)
    assert [len(o.chunk_times_s) for o in outcomes] == [5] * 4
    assert [o.completion_tokens for o in outcomes] == [5] * 4
    assert all(o.response_id.startswith("chatcmpl-") for o in outcomes)
    with pytest.raises(ValueError, match="endpoint"):
        run("http://127.0.0.1:9", "m", load, progress=False, endpoint="/v1/responses")


def test_warmups_go_first_and_are_not_counted():
    app = build(max_batch=8, num_blocks=128)
    load = make_load("random", 3, input_len=8, output_len=2, seed=0)
    with BackgroundServer(app) as srv:
        outcomes = run(srv.url, "course-target", load, progress=False, warmups=2)
        served = len(app.state.records)
    assert len(outcomes) == 3 and all(o.ok for o in outcomes)
    assert served == 5  # two warm-ups, then the three measured


def test_the_ready_check_asks_again_until_the_server_answers(monkeypatch):
    from inferlab.loadgen import client

    answers = iter([ServerUnreachable("starting"), ServerUnreachable("starting"), "m"])

    def served(url, key=None):
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a
    monkeypatch.setattr(client, "served_model", served)
    assert wait_until_ready("http://x", timeout_s=10, poll_s=0.0) == "m"
    monkeypatch.setattr(client, "served_model", lambda url, key=None: (_ for _ in ()).throw(
        ServerUnreachable("down")))
    with pytest.raises(ServerUnreachable):
        wait_until_ready("http://x", timeout_s=0)


def test_refused_requests_are_reported_as_429s_with_the_header_and_metadata(tmp_path, capsys):
    """A server that refuses every other request with 429: the report names them, the header
    says how requests were sent, the JSON keeps the label and the metadata."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    count = {"n": 0}

    async def completions(request):
        count["n"] += 1
        if count["n"] % 2 == 0:
            return JSONResponse({"error": {"message": "too many waiting"}}, status_code=429)

        async def stream():
            for i in range(3):
                yield f'data: {{"id": "c{count["n"]}", "choices": [{{"text": "x", ' \
                      f'"finish_reason": null}}]}}\n\n'
            yield ('data: {"choices": [{"text": "", "finish_reason": "length"}], "usage": '
                   '{"prompt_tokens": 9, "completion_tokens": 3}}\n\n')
            yield "data: [DONE]\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream")

    async def models(request):
        return JSONResponse({"data": [{"id": "fake"}]})
    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/models", models)])
    out = tmp_path / "r.json"
    with BackgroundServer(app) as srv:
        [row] = main(["--url", srv.url, "--trace", "random", "--random-input-len", "9",
                      "--random-output-len", "3", "--num-requests", "6", "--no-progress",
                      "--max-concurrency", "1", "--label", "night-run", "--metadata",
                      "gpu=none", "tp=1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert row["failed"] == 3 and row["failures"] == {"HTTP 429": 3}
    assert "3 failed (HTTP 429 Too Many Requests x 3)" in printed
    assert "night-run: fake at" in printed and "all sent at once" in printed
    assert "inf/s" not in printed
    meta = json.loads(out.read_text())["meta"]
    assert meta["label"] == "night-run" and meta["metadata"] == {"gpu": "none", "tp": "1"}
    assert "client" not in meta and meta["command"].startswith("python -m inferlab.loadgen")
    assert row["input_tokens"] == 27 and row["input_counted_by"] == "server"
