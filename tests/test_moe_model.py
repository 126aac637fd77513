"""The Mixtral-style MoE model (inferlab.model.moe) and its router statistics (routing)."""

import itertools
import json
from fractions import Fraction
from math import comb

import pytest
import torch

from inferlab.analysis.moe import expected_experts
from inferlab.model.generate import generate
from inferlab.model.llama import build_model
from inferlab.model.config import ModelConfig
from inferlab.model.moe import MoEModelConfig, build_moe_model, route
from inferlab.model.weights import load_moe_checkpoint
from inferlab.model.routing import (distinct_experts, distinct_experts_by_batch, expert_load,
                                    imbalance, record_routing)
from inferlab.model.weights import save_checkpoint

TINY = MoEModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn_dim=48, vocab_size=97,
                      max_seq_len=64, n_experts=4, experts_per_token=2, name="tiny-moe")


def test_route_matches_a_softmax_over_the_selected_logits():
    logits = torch.randn(10, 6, generator=torch.Generator().manual_seed(0))
    weights, experts = route(logits, 2)
    assert torch.equal(experts, logits.topk(2, dim=-1).indices)
    expected = torch.softmax(logits.gather(1, experts), dim=-1)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(weights.sum(-1), torch.ones(10))


def test_checkpoint_round_trip_in_the_mixtral_layout(tmp_path):
    model = build_moe_model(TINY, seed=1)
    save_checkpoint(model, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["MixtralForCausalLM"]
    assert (hf["num_local_experts"], hf["num_experts_per_tok"], hf["intermediate_size"]) == (4, 2, 48)
    from safetensors import safe_open
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert "model.layers.1.block_sparse_moe.gate.weight" in names
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in names
    assert not any(".mlp." in n for n in names)
    loaded = load_moe_checkpoint(tmp_path)
    assert loaded.config.scaled(name=TINY.name) == TINY
    tokens = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)
        assert torch.equal(generate(loaded, tokens, 5), generate(model, tokens, 5))


def test_a_checkpoint_of_another_shape_is_refused(tmp_path):
    save_checkpoint(build_moe_model(TINY, seed=1), tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf | {"num_local_experts": 8}))
    with pytest.raises(ValueError, match="missing"):
        load_moe_checkpoint(tmp_path)


def test_one_expert_top_one_equals_the_dense_model():
    dense_config = ModelConfig(**{k: v for k, v in TINY.as_dict().items()
                                  if k not in ("n_experts", "experts_per_token")})
    dense = build_model(dense_config, seed=3)
    moe = build_moe_model(TINY.scaled(n_experts=1, experts_per_token=1), seed=0)
    state = {}
    for name, t in dense.state_dict().items():
        for ours, theirs in (("mlp.gate_proj", "block_sparse_moe.experts.0.w1"),
                             ("mlp.up_proj", "block_sparse_moe.experts.0.w3"),
                             ("mlp.down_proj", "block_sparse_moe.experts.0.w2")):
            name = name.replace(ours, theirs)
        state[name] = t
    for i in range(TINY.n_layers):  # the router of one expert: any weights give weight 1
        state[f"model.layers.{i}.block_sparse_moe.gate.weight"] = torch.randn(1, TINY.d_model)
    moe.load_state_dict(state)
    tokens = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        torch.testing.assert_close(moe(tokens), dense(tokens), rtol=1e-6, atol=1e-6)


def test_transformers_loads_the_checkpoint_with_the_same_logits(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a local directory: never reach the Hub
    transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                       "here; the test never installs or downloads it")
    model = build_moe_model(TINY, seed=4)
    save_checkpoint(model, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    tokens = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        torch.testing.assert_close(theirs(tokens).logits, model(tokens), rtol=1e-4, atol=1e-4)


def test_routing_record_and_load():
    model = build_moe_model(TINY, seed=5)
    tokens = torch.randint(0, TINY.vocab_size, (3, 8), generator=torch.Generator().manual_seed(4))
    experts = record_routing(model, tokens)
    assert experts.shape == (TINY.n_layers, 24, TINY.experts_per_token)
    assert all(len(set(row.tolist())) == TINY.experts_per_token for row in experts.reshape(-1, 2))
    load = expert_load(experts, TINY.n_experts)
    assert load.shape == (TINY.n_layers, TINY.n_experts)
    assert load.sum(-1).tolist() == [24 * TINY.experts_per_token] * TINY.n_layers
    assert torch.all(imbalance(load) >= 1.0)


def test_imbalance_and_distinct_counts_on_known_routings():
    experts = torch.tensor([[0, 1], [0, 2], [0, 1], [3, 0]])  # expert 0 in every token
    load = expert_load(experts, 4)
    assert load.tolist() == [4, 2, 1, 1]
    assert float(imbalance(load)) == 2.0  # max 4 over mean 2
    assert float(imbalance(torch.tensor([3, 3, 3]))) == 1.0
    assert distinct_experts(experts) == 4
    assert distinct_experts_by_batch(experts, 2).tolist() == [3, 3]


@pytest.mark.parametrize("n_experts,k,batch", [(4, 2, 3), (5, 1, 4), (6, 3, 2)])
def test_uniform_routing_touches_the_expected_number_of_experts(n_experts, k, batch):
    """Average distinct_experts over every equally likely uniform routing of a batch (each token
    a k-subset of the experts), computed exactly, equals analysis.moe's E [1 - (1 - k/E)^B]."""
    subsets = [torch.tensor(s) for s in itertools.combinations(range(n_experts), k)]
    total = Fraction(0)
    for choice in itertools.product(subsets, repeat=batch):
        total += distinct_experts(torch.stack(choice))
    mean = total / comb(n_experts, k) ** batch
    assert float(mean) == pytest.approx(expected_experts(batch, n_experts, k), rel=1e-12)


def test_balancing_loss_is_one_when_uniform_and_e_over_k_when_collapsed():
    from inferlab.model.moe import load_balancing_loss

    E, k, N = 4, 2, 8
    # every token ranks the experts differently, cyclically: each is chosen equally often
    uniform = torch.stack([torch.roll(torch.tensor([3.0, 2.0, 1.0, 0.0]), i) for i in range(N)])
    assert float(load_balancing_loss([uniform * 1e-6], k)) == pytest.approx(1.0, rel=1e-5)
    collapsed = torch.tensor([[50.0, 50.0, -50.0, -50.0]]).repeat(N, 1)
    assert float(load_balancing_loss([collapsed], k)) == pytest.approx(E / k, rel=1e-5)
    lopsided = torch.tensor([[5.0, 4.0, 0.0, 0.0]]).repeat(N, 1)
    assert 1.0 < float(load_balancing_loss([uniform * 1e-6, lopsided], k)) < E / k


def test_transformers_loads_the_course_moe_with_the_same_logits(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                       "here; the test never installs or downloads it")
    from inferlab.model.weights import checkpoint_path, load_checkpoint

    path = checkpoint_path("course-moe")
    ours = load_checkpoint(path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    tokens = torch.randint(1, 1024, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(theirs.eval()(tokens).logits, ours(tokens), rtol=1e-4,
                                   atol=1e-4)
