"""The load generator: its view of the course server nests the engine's own timings request by
request; the command line prints the table and writes the JSON and the plot."""

import json
import math

import pytest

from inferlab.benchmarks.loadgen_agreement import REGIMES, compare, measure
from inferlab.loadgen.__main__ import main
from inferlab.loadgen.client import LoadRequest, make_load, random_lengths, run
from inferlab.loadgen.report import DEFAULT_SLO, detailed, inter_token_latencies, report, table
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


def test_report_and_table_from_known_times():
    class O:
        def __init__(self, sent, times, prompt_len):
            self.sent_s, self.chunk_times_s, self.status = sent, times, 200
            self.request = LoadRequest((1,) * prompt_len, len(times), sent)
        ok = property(lambda self: bool(self.chunk_times_s))
    outs = [O(0.0, [0.1, 0.2, 0.4], 10), O(0.5, [0.6, 0.7], 4), O(1.0, [], 100)]
    row = report(outs, SLO(0.2, 0.12))
    assert row["n_requests"] == 2 and row["failed"] == 1 and row["n_tokens"] == 5
    # as vllm bench serve counts them: the inputs of the requests that finished
    assert row["input_tokens"] == 14 and row["output_tokens"] == 5
    assert row["total_throughput_tok_s"] == pytest.approx(19 / 0.7)
    assert "14 in (prompts)" in table(row) and "total tok/s" in table(row)
    assert row["ttft_mean_s"] == pytest.approx(0.1)
    assert sorted(inter_token_latencies(outs)) == pytest.approx([0.1, 0.1, 0.2])
    assert row["in_slo_req_s"] == pytest.approx(1 / 0.7)  # only the second met TPOT <= 0.12
    assert "TTFT" in table(row) and "within the SLO" in table(row)


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
    assert f"(default {DEFAULT_SLO.ttft_s}, Chapter 9's)" in shown
    assert f"(default {DEFAULT_SLO.tpot_s}, Chapter 9's)" in shown


def test_the_chat_endpoint_streams_every_token_of_every_request(capsys):
    """``--endpoint /v1/chat/completions``: the same load as chat calls, every requested token
    streamed as a timed delta, the server's usage read back."""
    app = build(max_batch=8, num_blocks=128)
    load = make_load("random", 4, input_len=8, output_len=5, seed=1)
    with BackgroundServer(app) as srv:
        outcomes = run(srv.url, "course-target", load, progress=False,
                       endpoint="/v1/chat/completions")
        [row] = main(["--url", srv.url, "--trace", "random", "--random-input-len", "8",
                      "--random-output-len", "5", "--num-requests", "3", "--no-progress",
                      "--endpoint", "/v1/chat/completions"])
    assert all(o.ok and o.status == 200 for o in outcomes)
    assert [len(o.chunk_times_s) for o in outcomes] == [5] * 4
    assert [o.completion_tokens for o in outcomes] == [5] * 4
    assert all(o.response_id.startswith("chatcmpl-") for o in outcomes)
    assert row["n_requests"] == 3 and "E2E latency" in capsys.readouterr().out
    with pytest.raises(ValueError, match="endpoint"):
        run("http://127.0.0.1:9", "m", load, progress=False, endpoint="/v1/responses")
