"""inferlab.timing: threads chosen and stated, minimum and median, a warning when busy, and
interleaved comparisons (what is asserted never depends on how fast this machine is)."""

import pytest
import torch

from inferlab import timing
from inferlab.analysis.hardware import cache_bytes, measure_bandwidth


def test_a_timing_records_threads_minimum_and_median():
    x = torch.randn(128, 128)
    t = timing.time_fn(lambda: x @ x, min_run_time=0.05, num_threads=1, label="mm")
    assert t.threads == 1 and 0 < t.min_s <= t.median_s and t.runs >= 1
    assert "1 thread," not in str(t) and "1 thread" in str(t) and "min" in str(t)
    assert timing.time_fn(lambda: x @ x, min_run_time=0.05).threads == torch.get_num_threads()


def test_busy_is_decided_by_the_spread_and_warned_once(capsys):
    quiet = timing.Timing(median_s=1.0, iqr_s=0.02, runs=10, min_s=0.99, threads=2)
    busy = timing.Timing(median_s=1.0, iqr_s=0.4, runs=10, label="B=8", min_s=0.7, threads=2)
    assert not quiet.busy and busy.busy and busy.spread == pytest.approx(0.4)
    assert timing.warn_if_busy([quiet]) is False and capsys.readouterr().out == ""
    assert timing.warn_if_busy([quiet, busy, busy], "the sweep") is True
    out = capsys.readouterr().out
    assert out.count("warning:") == 1 and "40%" in out and "B=8" in out and "the sweep" in out


def test_thread_choice_stays_within_the_cores_and_is_explained():
    assert 0 <= timing.idle_cores(0.02) <= timing.usable_cores()
    threads = timing.choose_threads("cpu")
    assert 1 <= threads <= torch.get_num_threads()
    assert str(threads) in timing.threads_note(threads)
    assert "of" in timing.threads_note(1) or timing.usable_cores() == 1


def test_compare_interleaves_and_keeps_each_candidates_best_round():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    best = timing.compare(fns, rounds=3, min_run_time=0.01, num_threads=1)
    assert set(best) == {"a", "b"} and all(t.threads == 1 for t in best.values())
    # A B A B A B: each round times every candidate before the next round starts.
    switches = sum(1 for x, y in zip(calls, calls[1:]) if x != y)
    assert switches >= 5
    with pytest.raises(ValueError):
        timing.compare(fns, rounds=0)


def test_the_bandwidth_probe_outgrows_the_cache_and_names_the_faster_stream():
    assert cache_bytes("cpu") >= 0
    bw = measure_bandwidth("cpu", n_bytes=16 * 2**20, min_run_time=0.05, num_threads=1)
    assert bw.what.startswith(("memory bandwidth (copy;", "memory bandwidth (read;"))
    assert bw.timing.threads == 1 and bw.value == pytest.approx(
        bw.size * (2 if "(copy" in bw.what else 1) / bw.timing.min_s)
