"""The one-command version of Chapter 1's measurements runs and records its provenance."""

import json

from inferlab.benchmarks import roofline


def test_roofline_benchmark_prints_and_records(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("INFERLAB_PROFILE", "cpu")
    out = tmp_path / "roofline.json"
    assert roofline.main(["--json", str(out), "--context", "8"]) == 0
    text = capsys.readouterr().out
    assert "ridge" in text and "of the measured bandwidth" in text
    record = json.loads(out.read_text())
    assert record["benchmark"] == "roofline" and record["device"] == "cpu"
    assert 0 < record["bandwidth_utilisation"] < 2
    assert record["ridge_flop_per_byte"] == record["peak_flops"] / record["bandwidth_bytes_per_s"]
