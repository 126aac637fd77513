"""The load generator: its metrics against the course server agree with the engine's own
timings; the command line prints the table and writes the JSON and the plot."""

import json
import math

import pytest
import torch

from inferlab.loadgen.__main__ import main
from inferlab.loadgen.client import make_load, run
from inferlab.loadgen.report import inter_token_latencies, report, table, timings
from inferlab.serve.__main__ import build
from inferlab.serve.background import BackgroundServer
from inferlab.serving.metrics import SLO, RequestTiming, summarize


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_make_load_follows_the_trace_and_the_rate():
    load = make_load("sharegpt_like", 200, rate=10.0, scale=0.125, max_len=512, seed=1)
    assert len(load) == 200 and all(len(r.prompt) + r.max_tokens <= 512 for r in load)
    gaps = [b.send_at_s - a.send_at_s for a, b in zip(load, load[1:])]
    assert min(gaps) >= 0 and 0.07 < sum(gaps) / len(gaps) < 0.13
    assert all(r.send_at_s == 0 for r in make_load("alpaca_like", 5))
    with pytest.raises(ValueError, match="unknown trace"):
        make_load("nope", 5)


def test_loadgen_agrees_with_the_engine_within_ten_percent():
    app = build(max_batch=16, num_blocks=256)
    load = make_load("sharegpt_like", 32, rate=8.0, scale=0.125, max_len=512, seed=0)
    with BackgroundServer(app) as srv:
        outcomes = run(srv.url, "course-target", load, progress=False)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    # one chunk per token, and every request ran to max_tokens (ignore_eos)
    assert [len(o.chunk_times_s) for o in outcomes] == [r.max_tokens for r in load]
    assert [o.completion_tokens for o in outcomes] == [r.max_tokens for r in load]
    engine = {rec["id"]: RequestTiming(rec["arrival_s"], rec["token_times_s"])
              for rec in app.state.records}
    ours = summarize(timings(outcomes))
    theirs = summarize([engine[o.response_id] for o in outcomes])
    for metric in ("tpot", "latency"):
        a, b = getattr(ours, metric).mean, getattr(theirs, metric).mean
        assert abs(a - b) <= 0.10 * b, (metric, a, b)
    assert ours.throughput == pytest.approx(theirs.throughput, rel=0.10)
    # TTFT: the client also sees the HTTP path (connect, parse, the first chunk's trip), a
    # roughly fixed cost that the engine's clock, started when the handler ran, does not
    ttft_client = [o.chunk_times_s[0] - o.sent_s for o in outcomes]
    ttft_engine = [engine[o.response_id].ttft for o in outcomes]
    assert all(c >= e for c, e in zip(ttft_client, ttft_engine))
    assert ours.ttft.mean - theirs.ttft.mean < 0.05


def test_report_and_table_from_known_times():
    class O:
        def __init__(self, sent, times):
            self.sent_s, self.chunk_times_s, self.status = sent, times, 200
        ok = property(lambda self: bool(self.chunk_times_s))
    outs = [O(0.0, [0.1, 0.2, 0.4]), O(0.5, [0.6, 0.7]), O(1.0, [])]
    row = report(outs, SLO(0.2, 0.12))
    assert row["n_requests"] == 2 and row["failed"] == 1 and row["n_tokens"] == 5
    assert row["ttft_mean_s"] == pytest.approx(0.1)
    assert sorted(inter_token_latencies(outs)) == pytest.approx([0.1, 0.1, 0.2])
    assert row["goodput_req_s"] == pytest.approx(1 / 0.7)  # only the second met TPOT <= 0.12
    assert "TTFT" in table(row) and "goodput" in table(row)


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
