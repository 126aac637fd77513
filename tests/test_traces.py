"""Tests of the synthetic request traces and Poisson arrivals."""

from __future__ import annotations

import numpy as np
import pytest

from inferlab.sim import traces, workloads
from inferlab.data import data_path


def test_committed_traces_match_the_published_means():
    for load, (mean_in, mean_out) in ((traces.sharegpt_like, (161.31, 337.99)),
                                      (traces.alpaca_like, (19.31, 58.45))):
        rows = load()
        assert len(rows) == traces.DEFAULT_ROWS
        got_in, got_out = traces.mean_lengths(rows)
        assert got_in == pytest.approx(mean_in, abs=0.05)
        assert got_out == pytest.approx(mean_out, abs=0.05)
        assert all(1 <= r.prompt_len and 1 <= r.output_len for r in rows)
        assert max(r.total_len for r in rows) <= traces.DEFAULT_MAX_LEN


def test_committed_file_is_what_the_generator_writes(tmp_path):
    traces.write_traces(tmp_path)
    for name in traces.WORKLOADS:
        assert (tmp_path / f"{name}.csv").read_bytes() == \
            data_path("traces", f"{name}.csv").read_bytes()


def test_clipped_lognormal_mean_solver():
    rng = np.random.default_rng(0)
    mu = traces.solve_mu(300.0, 0.8, 1024)
    x = np.minimum(rng.lognormal(mu, 0.8, 400_000), 1024)
    assert traces._clipped_lognormal_mean(mu, 0.8, 1024) == pytest.approx(300.0, rel=1e-9)
    assert x.mean() == pytest.approx(300.0, rel=0.01)
    with pytest.raises(ValueError):
        traces.solve_mu(2000.0, 0.8, 1024)


def test_loaders_subset_and_scale():
    first = traces.sharegpt_like(5)
    assert [r.request_id for r in first] == [0, 1, 2, 3, 4]
    a, b = traces.sharegpt_like(50, seed=1), traces.sharegpt_like(50, seed=1)
    assert a == b and a != traces.sharegpt_like(50, seed=2)
    small = traces.scale_lengths(first, 1 / 8, max_len=128)
    for r, s in zip(first, small):
        assert s.prompt_len == max(1, round(r.prompt_len / 8))
        assert s.total_len <= 128 and s.output_len >= 1
    with pytest.raises(ValueError):
        traces.sharegpt_like(0)


def test_poisson_arrivals():
    t = workloads.poisson_arrivals(20_000, rate_per_s=4.0, seed=0)
    assert len(t) == 20_000 and all(x < y for x, y in zip(t, t[1:]))
    assert t[-1] / len(t) == pytest.approx(0.25, rel=0.03)  # mean gap 1 / rate
    assert t == workloads.poisson_arrivals(20_000, 4.0, seed=0)
    with pytest.raises(ValueError):
        workloads.poisson_arrivals(3, 0.0)
