"""Serving metrics: TTFT, TPOT, latency, percentiles, throughput and goodput, on hand-made stamps."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.serving import metrics
from inferlab.serving.metrics import SLO, Percentiles, RequestTiming, summarize


def test_three_latencies_of_one_request():
    t = RequestTiming(arrival_s=1.0, token_times_s=(1.5, 1.6, 1.7, 2.0))
    assert t.ttft == pytest.approx(0.5)             # queueing + prefill
    assert t.tpot == pytest.approx((2.0 - 1.5) / 3)  # gaps after the first token
    assert t.latency == pytest.approx(1.0)
    assert t.n_tokens == 4


def test_one_token_answer_has_no_tpot_and_is_left_out_of_its_percentiles():
    one = RequestTiming(0.0, (0.2,))
    assert math.isnan(one.tpot)
    s = summarize([one, RequestTiming(0.0, (0.1, 0.3))])
    assert s.tpot.p50 == pytest.approx(0.2)  # only the two-token request has a TPOT


def test_bad_stamps_are_refused():
    with pytest.raises(ValueError, match="decrease"):
        RequestTiming(0.0, (1.0, 0.5))
    with pytest.raises(ValueError, match="before the request arrived"):
        RequestTiming(2.0, (1.0,))
    with pytest.raises(ValueError, match="no output tokens"):
        metrics.ttft(0.0, ())


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
       st.floats(0, 100))
@settings(max_examples=200, deadline=None)
def test_percentile_matches_numpy_linear_interpolation(values, q):
    assert metrics.percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-9,
                                                          abs=1e-6)


def test_percentile_edges():
    assert metrics.percentile([3.0, 1.0, 2.0], 0) == 1.0
    assert metrics.percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert metrics.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert math.isnan(metrics.percentile([], 50))
    assert metrics.percentile([math.nan, 5.0], 50) == 5.0
    with pytest.raises(ValueError):
        metrics.percentile([1.0], 101)


def test_p99_sees_the_tail_that_the_mean_hides():
    ttfts = [0.1] * 95 + [10.0] * 5  # one request in twenty waits behind a long prefill
    p = Percentiles.of(ttfts)
    assert p.p50 == pytest.approx(0.1)
    assert p.p99 == pytest.approx(np.percentile(ttfts, 99)) == pytest.approx(10.0)
    assert p.mean < p.p99 / 10


def test_summary_throughput_and_goodput():
    timings = [RequestTiming(0.0, (0.1, 0.2, 0.3)),     # TTFT 0.1, TPOT 0.1
               RequestTiming(0.5, (1.5, 1.6)),          # TTFT 1.0: misses a 0.5 s TTFT SLO
               RequestTiming(1.0, (1.2, 1.8, 2.4))]     # TPOT 0.6: misses a 0.2 s TPOT SLO
    s = summarize(timings, SLO(ttft_s=0.5, tpot_s=0.2))
    assert s.n_requests == 3 and s.n_tokens == 8
    assert s.duration_s == pytest.approx(2.4)            # first arrival to last token
    assert s.throughput == pytest.approx(8 / 2.4)
    assert s.request_rate == pytest.approx(3 / 2.4)
    assert s.slo_attainment == pytest.approx(1 / 3)
    assert s.in_slo_rate == pytest.approx(1 / 2.4)
    row = s.row()
    assert row["throughput_tok_s"] == s.throughput and row["in_slo_req_s"] == s.in_slo_rate
    assert row["ttft_p99_s"] == s.ttft.p99
    assert "tok/s" in str(s) and "within the SLO" in str(s)


def test_summary_without_slo_and_without_tokens():
    s = summarize([RequestTiming(0.0, (1.0,))])
    assert math.isnan(s.in_slo_rate) and "in_slo_req_s" not in s.row()
    with pytest.raises(ValueError, match="nothing to summarise"):
        summarize([RequestTiming(0.0, ())])
    with pytest.raises(ValueError):
        SLO(0.0, 1.0)
