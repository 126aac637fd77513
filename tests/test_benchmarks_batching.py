"""The batching benchmark runs end to end at toy sizes and writes a record the status page reads."""

import json

from inferlab.benchmarks import batching
from inferlab.measurements import results_of


def test_benchmark_runs_and_records(tmp_path, capsys):
    out = tmp_path / "batching.json"
    # the large-GPU code path, dry-run on the CPU with the toy model and a handful of requests
    assert batching.main(["--profile", "large-gpu", "--device", "cpu", "--dtype", "float32",
                          "--model", "tiny", "--requests", "6", "--scale", "0.05",
                          "--max-batch", "4", "--rates", "50", "--min-run-time", "0.01",
                          "--extrapolate-requests", "20", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "continuous / static throughput" in text and "simulator, continuous" in text
    record = json.loads(out.read_text())
    assert record["benchmark"] == "batching" and record["model"] == "tiny"
    assert record["throughput_ratio"] > 0 and record["device"] == "cpu"
    assert {"static", "continuous"} <= set(record["simulator"])
    assert len(record["results"]) == 2  # one rate, two policies
    scalars, rows = results_of(record)
    assert "throughput_ratio" in scalars and rows[0]["policy"] in ("static", "continuous")


def test_sizes_cover_every_profile():
    from inferlab.device import PROFILES
    from inferlab.model.config import ModelConfig

    # every profile carries the serving experiment's sizes, for a model of data/models.csv
    assert {name for name, p in PROFILES.items()
            if ModelConfig.from_name(p.serving.model)} == set(PROFILES)
