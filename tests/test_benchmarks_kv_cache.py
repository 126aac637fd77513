"""The Chapter 2 benchmarks run end to end (timings are not asserted: CI's CPU is shared)."""

import json

import pytest
import torch

from inferlab.analysis import formulas
from inferlab.benchmarks import decode_gpu, kv_cache
from inferlab.model.config import ModelConfig
from inferlab.model.llama import build_model


def test_kv_cache_benchmark_prints_every_context_and_writes_json(tmp_path, capsys):
    out = tmp_path / "kv.json"
    assert kv_cache.main(["--contexts", "8", "32", "--min-run-time", "0.01", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "speed-up" in text and "\n      32 " in text
    record = json.loads(out.read_text())
    assert [r["context"] for r in record["results"]] == [8, 32]
    assert all(r["cached_s"] > 0 and r["recomputed_s"] > 0 for r in record["results"])
    assert record["device"] == "cpu" and record["torch"] == torch.__version__


def test_flop_ratio_grows_about_linearly_with_context():
    config = ModelConfig.from_name("tiny")
    ratios = [formulas.recompute_flops(config, n) / formulas.flops_per_token(config, n - 1)
              for n in (128, 512, 2048)]
    assert ratios[0] < ratios[1] < ratios[2]
    assert 0.5 * 2048 < ratios[2] < 2048  # attention's n^2 term makes it a little below n
    with pytest.raises(ValueError):
        formulas.recompute_flops(config, 0)


def test_decode_gpu_refuses_politely_without_cuda(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert decode_gpu.main(["--out", str(tmp_path / "x.json")]) == 0
    assert "no" in capsys.readouterr().out.lower()
    assert not (tmp_path / "x.json").exists()


def test_decode_gpu_run_works_eagerly_on_any_device():
    model = build_model(ModelConfig.from_name("tiny").scaled(n_layers=2))
    result = decode_gpu.run(model, prompt_len=4, new_tokens=4, compile=False, min_run_time=0.01)
    assert result["tokens_per_s"] > 0
    assert result["weight_bytes_per_step"] == formulas.decode_bytes_per_step(model.config, "float32")


def test_decode_step_matches_the_model_forward():
    from inferlab.model.kv_cache import StaticKVCache

    model = build_model("tiny", seed=1)
    tokens = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(0))
    cache = StaticKVCache.for_model(model, 1, 16)
    cache.checks = False
    with torch.no_grad():
        full = model(tokens)
        model(tokens[:, :8], torch.arange(8), cache)
        logits = decode_gpu.decode_step(model, tokens[:, 8:], torch.tensor([8]), cache)
    torch.testing.assert_close(logits, full[:, -1], atol=1e-5, rtol=1e-5)


def test_decode_gpu_main_records_a_readable_run_dry_run_on_cpu(monkeypatch, tmp_path, capsys):
    """The GPU path end to end with the device calls pointed at the CPU and a tiny model."""
    from inferlab.analysis import hardware
    from inferlab.measurements import results_of

    real_run = decode_gpu.run

    def fake_run(model, prompt_len, new_tokens, compile, min_run_time):
        if compile:  # the compiled mode failing must not lose the eager row
            raise RuntimeError("no compiler here")
        return real_run(model, prompt_len, new_tokens, compile=False, min_run_time=0.01)

    monkeypatch.setattr(decode_gpu.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(decode_gpu, "check_dtype", lambda dtype, device: torch.float32)
    monkeypatch.setattr(decode_gpu, "detect_device", lambda device: hardware.detect_device("cpu"))
    monkeypatch.setattr(decode_gpu, "build_model", lambda name, **kw: build_model("tiny"))
    monkeypatch.setattr(decode_gpu, "measure_bandwidth",
                        lambda device: hardware.measure_bandwidth("cpu", n_bytes=2**24,
                                                                  min_run_time=0.01))
    monkeypatch.setattr(decode_gpu, "run", fake_run)
    out = tmp_path / "decode.json"
    assert decode_gpu.main(["--prompt-len", "4", "--new-tokens", "4", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["benchmark"] == "decode_gpu" and record["best_mode"] == "eager"
    assert "compiled (CUDA graphs)" in record["errors"]
    assert record["results"][0]["tokens_per_s"] > 0 and "torch" in record and "date" in record
    scalars, rows = results_of(record)
    assert rows and "best_tokens_per_s" in scalars
    assert "failed" in capsys.readouterr().out
