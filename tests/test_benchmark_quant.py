"""The quantization benchmark's plumbing, at toy sizes (its bars are measured by running it)."""

import json

import torch

from inferlab.benchmarks import quant as bench


def test_speed_rows_and_predicted_bytes():
    s = bench.speed("tiny", context=16, threads=[1], min_run_time=0.02, with_torchao=False)
    assert set(s["threads"][1]) == {"float32", "int8 (Int8Linear)"}
    assert all(t > 0 for t in s["threads"][1].values())
    b = s["bytes_per_step"]
    assert 2.0 < b["float32"] / b["int8 (Int8Linear)"] < 4.0
    assert len(s["load_before"]) == 3


def test_quality_rows_on_one_document():
    rows = bench.quality(docs=1)
    names = [r["format"] for r in rows]
    assert names[0] == "bfloat16 (stored)" and "int8 KV cache" in names
    assert rows[0]["rise"] == 0
    by = {r["format"]: r for r in rows}
    assert by["int4 group 32"]["weight_bytes"] < by["bfloat16 (stored)"]["weight_bytes"] / 3
    assert abs(by["int8 per channel"]["rise"]) < 0.01


def test_main_on_a_cpu_writes_a_record(tmp_path, capsys):
    out = tmp_path / "q.json"
    assert bench.main(["--model", "tiny", "--threads", "1", "--min-run-time", "0.02",
                       "--no-torchao", "--docs", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "speed bar" in text and "quality bar" in text
    record = json.loads(out.read_text())
    assert record["benchmark"] == "quant" and record["quality"] and record["speed"]


def test_cuda_without_a_gpu_says_so(capsys):
    if torch.cuda.is_available():
        return
    assert bench.main(["--device", "cuda"]) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out
