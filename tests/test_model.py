"""The Llama-architecture model: names, shapes, causality, GQA, determinism, the cached path."""

import pytest
import torch

from inferlab.model.generate import generate, generate_without_cache
from inferlab.model.kv_cache import KVCache
from inferlab.model.config import ModelConfig, model_presets
from inferlab.model.llama import build_model
from inferlab.analysis.roofline import Roof, attainable_flops


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", seed=0)


def _tokens(shape, vocab=512, seed=1):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def test_parameter_names_follow_the_hugging_face_llama_layout(tiny):
    names = set(tiny.state_dict())
    for expected in ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                     "model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.o_proj.weight",
                     "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                     "model.layers.0.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight",
                     "model.layers.0.post_attention_layernorm.weight"]:
        assert expected in names
    c = tiny.config
    assert tiny.state_dict()["model.layers.0.self_attn.k_proj.weight"].shape == \
        (c.n_kv_heads * c.head_dim, c.d_model)


def test_qwen2_style_config_has_qkv_biases_and_tied_embeddings():
    cfg = ModelConfig.from_name("qwen2.5-0.5b").scaled(n_layers=1, vocab_size=1000, d_model=128,
                                                        n_heads=4, n_kv_heads=2, head_dim=32,
                                                        ffn_dim=256)
    model = build_model(cfg)
    names = set(dict(model.named_parameters()))
    assert "model.layers.0.self_attn.q_proj.bias" in names
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_logits_at_position_t_ignore_later_tokens(tiny):
    tokens = _tokens((2, 24))
    changed = tokens.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % 512
    with torch.no_grad():
        a, b = tiny(tokens), tiny(changed)
    assert torch.equal(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_same_seed_same_model_and_output():
    a, b, c = build_model("tiny", seed=3), build_model("tiny", seed=3), build_model("tiny", seed=4)
    tokens = _tokens((1, 10))
    with torch.no_grad():
        assert torch.equal(a(tokens), b(tokens))
        assert not torch.allclose(a(tokens), c(tokens))


def test_gqa_equals_mha_with_repeated_kv_heads(tiny):
    cfg = tiny.config
    assert cfg.group_size == 2
    mha = build_model(cfg.with_kv_heads(cfg.n_heads), seed=99)
    state = tiny.state_dict()
    for name, value in list(state.items()):
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            heads = value.view(cfg.n_kv_heads, cfg.head_dim, cfg.d_model)
            state[name] = heads.repeat_interleave(cfg.group_size, dim=0).reshape(-1, cfg.d_model)
    mha.load_state_dict(state)
    tokens = _tokens((2, 16))
    with torch.no_grad():
        torch.testing.assert_close(mha(tokens), tiny(tokens), rtol=1e-5, atol=1e-5)


def test_cached_forward_equals_full_forward(tiny):
    tokens = _tokens((2, 20))
    cache = KVCache.for_model(tiny, batch=2, max_len=20)
    with torch.no_grad():
        full = tiny(tokens)
        first = tiny(tokens[:, :12], torch.arange(12), cache)
        steps = [tiny(tokens[:, t:t + 1], torch.arange(t, t + 1), cache) for t in range(12, 20)]
    torch.testing.assert_close(first, full[:, :12], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 12:], rtol=1e-4, atol=1e-4)


def test_greedy_generation_is_identical_with_and_without_cache(tiny):
    prompt = _tokens((3, 9))
    assert torch.equal(generate(tiny, prompt, 12), generate_without_cache(tiny, prompt, 12))


def test_bfloat16_model_runs():
    model = build_model("tiny", dtype=torch.bfloat16)
    assert model(_tokens((1, 5))).dtype == torch.bfloat16


def test_hf_config_round_trip():
    for cfg in model_presets().values():
        back = ModelConfig.from_hf_config(cfg.to_hf_config(), name=cfg.name)
        assert back == cfg


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_layers=0), "n_layers must be a positive integer"),
    (dict(n_heads=8, n_kv_heads=3), "must be a multiple of n_kv_heads"),
    (dict(d_model=250, head_dim=0), "not divisible by n_heads"),
    (dict(head_dim=33), "positive even number"),
])
def test_bad_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_name("tiny", **kwargs)


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(ValueError, match="known models: llama-2-7b, llama-2-13b"):
        ModelConfig.from_name("gpt-5")


def test_bad_inputs_to_the_model_are_refused(tiny):
    with pytest.raises(ValueError, match="shape \\(batch, time\\)"):
        tiny(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="token ids must lie in \\[0, 512\\)"):
        tiny(torch.tensor([[1, 600]]))
    with pytest.raises(ValueError, match="beyond the model's context of 2048"):
        tiny(torch.tensor([[1]]), torch.tensor([5000]))


def test_roof():
    roof = Roof("toy", 100e12, 1e12)
    assert roof.ridge == 100
    assert roof.attainable(10) == pytest.approx(10e12)
    assert roof.attainable(1000) == pytest.approx(100e12)
    assert attainable_flops([1, 1000], 100e12, 1e12).tolist() == [1e12, 100e12]
    with pytest.raises(ValueError, match="no bfloat16 peak for T4"):
        Roof.from_spec("T4", "bfloat16")
    assert Roof.from_spec("T4", "float16").ridge == pytest.approx(203.125)
