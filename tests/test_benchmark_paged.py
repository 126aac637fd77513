"""Smoke test of ``python -m inferlab.benchmarks.paged`` at small sizes."""

from __future__ import annotations

import json

import torch

from inferlab.analysis.capacity import paper_pool_slots
from inferlab.benchmarks import paged as bench
from inferlab.benchmarks.attention_paths import kernel_inputs


def test_pool_matches_the_paper():
    assert paper_pool_slots() == 15728  # "15.7K token slots" (Kwon et al. 2023, Sec. 3)


def test_kernel_paths_agree_and_are_timed():
    x = kernel_inputs(batch=3, context=40, n_heads=4, n_kv_heads=2, head_dim=16)
    times = bench.time_kernels(x, min_run_time=0.01)
    assert {"contiguous", "gather_then_attend"} <= set(times)
    assert times["contiguous"]["vs_contiguous"] == 1.0
    assert all(t["median_s"] > 0 for t in times.values())


def test_main_prints_and_writes(tmp_path, capsys):
    out = tmp_path / "paged.json"
    assert bench.main(["--requests", "60", "--batch", "2", "--context", "32", "--heads", "2",
                       "--head-dim", "8", "--min-run-time", "0.01", "--device", "cpu",
                       "--dtype", "float32", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "paged" in text and "prefix caching" in text and "gather_then_attend" in text
    record = json.loads(out.read_text())
    assert record["benchmark"] == "paged" and record["device"] == "cpu"
    assert set(record["memory"]["sharegpt_like"]["policies"]) == {"max_length", "power_of_two",
                                                                  "exact", "paged"}
    assert torch.__version__ == record["torch"]
