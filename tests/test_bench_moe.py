"""The MoE measurement (inferlab.parallel.bench_moe) on small random models: its byte count of a
decode step agrees with the experts it says ran, and its references are analysis.moe's."""

import dataclasses

import pytest
import torch

from inferlab.analysis.moe import expected_experts
from inferlab.model.config import ModelConfig
from inferlab.model.llama import build_model
from inferlab.model.moe import MoEModelConfig, build_moe_model
from inferlab.model.routing import record_routing
from inferlab.parallel import bench_moe

pytest.importorskip("tokenizers")

SMALL = MoEModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn_dim=24,
                       vocab_size=1024, max_seq_len=128, n_experts=4, experts_per_token=2,
                       name="small-moe")


def test_analysis_shape_counts_the_models_parameters():
    model = build_moe_model(SMALL, seed=0)
    shape = bench_moe.analysis_shape(SMALL)
    assert shape.total_params() == sum(p.numel() for p in model.parameters())
    one_expert = sum(p.numel() for p in model.model.layers[0].block_sparse_moe.experts[0].parameters())
    assert shape.expert_params == one_expert


def test_decode_step_runs_the_experts_its_tokens_were_routed_to():
    model = build_moe_model(SMALL, seed=1)
    prompts = torch.randint(0, SMALL.vocab_size, (3, 10), generator=torch.Generator().manual_seed(0))
    ran = bench_moe.decode_step_experts(model, prompts)
    with torch.inference_mode():  # the same step, routed again: distinct experts per layer
        full = torch.cat([prompts, model(prompts)[:, -1].argmax(-1, keepdim=True)], dim=1)
        experts = record_routing(model, full)[:, 10::11]  # (L, 3, k): the last token of each row
    assert ran == sum(int(torch.unique(experts[layer]).numel()) for layer in range(SMALL.n_layers))


def test_measure_reports_both_references(monkeypatch):
    from inferlab.model.weights import checkpoint_path, load_tokenizer

    tokenizer = load_tokenizer(checkpoint_path("course-target"))
    moe = build_moe_model(SMALL, seed=2)
    dense = build_model(ModelConfig(**{k: v for k, v in SMALL.as_dict().items()
                                       if k not in ("n_experts", "experts_per_token")}
                                    | {"ffn_dim": 48, "name": "small-dense"}), seed=2)
    log = [{"model": "small-moe", "step": "10", "val_loss": "3.5"},
           {"model": "small-dense", "step": "10", "val_loss": "3.25"}]
    monkeypatch.setattr(bench_moe, "BATCHES", (1, 4))
    # five held-out files, each cut to its first 4,000 characters (the first is 100,000 long):
    # enough text for the windows and both perplexities, a tenth of the forward passes
    monkeypatch.setattr(bench_moe.corpus, "held_out",
                        lambda split, real=bench_moe.corpus.held_out:
                        [dataclasses.replace(d, text=d.text[:4000]) for d in real(split)[:5]])
    r = bench_moe.measure(moe, dense, tokenizer, log, steps=10, moe_val_loss=3.5, windows=2,
                          window=64, groups=8)
    assert r["val_loss_at_equal_steps"] == {"step": 10, "small-moe": 3.5, "small-dense": 3.25}
    assert set(r["test_perplexity"]) == {"small-moe", "small-dense"}
    assert r["active_params"] == sum(p.numel() for p in dense.parameters()) + 2 * 4 * 32
    for row in r["by_batch"]:
        assert row["expected_experts_uniform"] == expected_experts(row["batch"], 4, 2)
        assert 2 <= min(row["distinct_experts_text"]) and max(row["distinct_experts_text"]) <= 4
    assert r["by_batch"][0]["decode_experts_run_per_layer"] == 2  # batch 1: exactly k experts
    assert r["by_batch"][0]["decode_step_bytes"] == pytest.approx(
        r["by_batch"][0]["predicted_step_bytes_uniform"])
    with pytest.raises(ValueError, match="no validation loss"):
        bench_moe.validation_loss_at(11, log, "small-moe")
