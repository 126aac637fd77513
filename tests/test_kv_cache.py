"""The reference KV cache, the generation loop around it, GQA conversion and capacity planning."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.analysis import formulas
from inferlab.analysis.capacity import (DEFAULT_ACTIVATION_RESERVE, capacity, plot_capacity,
    show_capacity)
from inferlab.model.generate import decode_one_token, generate, generate_without_cache, prefill
from inferlab.model.gqa import convert_kv_heads, kv_head_options, mean_pool_heads
from inferlab.model.kv_cache import CacheFullError, KVCache, StaticKVCache
from inferlab.model.config import ModelConfig
from inferlab.model.llama import build_model

KIB = 2**10
_MODEL = build_model("tiny", seed=0)  # shared by the property test (hypothesis calls it often)


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", seed=0)


def _tokens(shape, vocab=512, seed=1):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _kv(cache, t, dtype=None, heads=None):
    shape = (cache.batch, heads or cache.n_kv_heads, t, cache.head_dim)
    return torch.zeros(shape, dtype=dtype or cache.dtype), torch.zeros(shape, dtype=dtype or cache.dtype)


# --- correctness against full recomputation ----------------------------------------------

@pytest.mark.parametrize("cache_cls", [KVCache, StaticKVCache])
def test_prefill_then_decode_logits_equal_full_recomputation(tiny, cache_cls):
    tokens = _tokens((2, 20))
    with torch.no_grad():
        full = tiny(tokens)  # (B, T, V), causal, no cache
    cache = cache_cls.for_model(tiny, batch=2, max_len=32)
    last = prefill(tiny, tokens[:, :12], cache)
    torch.testing.assert_close(last, full[:, 11], atol=1e-5, rtol=1e-5)
    for t in range(12, 20):
        logits = decode_one_token(tiny, tokens[:, t], cache)
        torch.testing.assert_close(logits, full[:, t], atol=1e-5, rtol=1e-5)
    assert cache.length == 20


def test_chunked_prefill_equals_one_prefill(tiny):
    tokens = _tokens((1, 24))
    a, b = KVCache.for_model(tiny, 1, 24), KVCache.for_model(tiny, 1, 24)
    whole = prefill(tiny, tokens, a)
    prefill(tiny, tokens[:, :10], b)
    prefill(tiny, tokens[:, 10:17], b)
    torch.testing.assert_close(prefill(tiny, tokens[:, 17:], b), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.k, b.k, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generation_with_and_without_cache_is_identical(tiny, temperature):
    prompt = _tokens((3, 9))
    cached = generate(tiny, prompt, 16, temperature=temperature, seed=4)
    assert torch.equal(cached, generate_without_cache(tiny, prompt, 16, temperature=temperature,
                                                      seed=4))
    static = generate(tiny, prompt, 16, cache=StaticKVCache.for_model(tiny, 3, 40),
                      temperature=temperature, seed=4)
    assert torch.equal(cached, static)


def test_bfloat16_cache_generation_matches_its_own_recomputation():
    model = build_model("tiny", seed=2, dtype="bfloat16")
    prompt = _tokens((1, 8))
    out = generate(model, prompt, 8)
    assert KVCache.for_model(model, 1, 4).dtype == torch.bfloat16
    # bf16 rounds differently in a 1-token and an n-token matmul, so compare the first step only
    assert torch.equal(out[:, :9], generate_without_cache(model, prompt, 1))


# --- the cache refuses mistakes instead of truncating ------------------------------------

def test_writing_past_capacity_raises_cache_full(tiny):
    cache = KVCache.for_model(tiny, 1, max_len=8)
    prefill(tiny, _tokens((1, 8)), cache)
    with pytest.raises(CacheFullError, match="needs 9 slots but the cache holds 8"):
        decode_one_token(tiny, _tokens((1,)), cache)
    assert cache.length == 8  # nothing was written


def test_generate_checks_capacity_and_context_up_front(tiny):
    cache = KVCache.for_model(tiny, 1, max_len=10)
    with pytest.raises(CacheFullError, match="slots"):
        generate(tiny, _tokens((1, 6)), 6, cache=cache)
    assert cache.length == 0  # refused before any work
    assert generate(tiny, _tokens((1, 6)), 5, cache=cache).shape == (1, 11)  # exactly fits
    with pytest.raises(ValueError, match="holds 1 sequences but the prompt has 2"):
        generate(tiny, _tokens((2, 4)), 2, cache=KVCache.for_model(tiny, 1, 8))
    with pytest.raises(ValueError, match="context of 2048"):
        generate_without_cache(tiny, _tokens((1, 2040)), 10)
    with pytest.raises(ValueError, match="positive integer"):
        generate(tiny, _tokens((1, 4)), 0)


def test_wrong_shape_dtype_device_and_positions_are_refused():
    cache = KVCache(n_layers=2, batch=1, n_kv_heads=2, max_len=8, head_dim=4)
    pos = torch.arange(3)
    k, v = _kv(cache, 3)
    with pytest.raises(ValueError, match=r"shape \(1, 3, 3, 4\), expected \(1, 2, 3, 4\)"):
        cache.update(0, pos, *_kv(cache, 3, heads=3))
    with pytest.raises(ValueError, match="shape"):
        cache.update(0, torch.arange(2), k, v)  # 2 positions for 3 tokens
    with pytest.raises(TypeError, match="bfloat16 but the cache holds torch.float32"):
        cache.update(0, pos, *_kv(cache, 3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="on meta"):
        cache.update(0, pos, k.to("meta"), v.to("meta"))
    with pytest.raises(TypeError, match="integer"):
        cache.update(0, pos.float(), k, v)
    with pytest.raises(ValueError, match="consecutive"):
        cache.update(0, torch.tensor([0, 2, 1]), k, v)
    with pytest.raises(ValueError, match="gap"):
        cache.update(0, torch.arange(2, 5), k, v)
    with pytest.raises(IndexError, match="layer 2"):
        cache.update(2, pos, k, v)
    with pytest.raises(ValueError, match="positive integer"):
        KVCache(2, 1, 0, 8, 4)


def test_for_model_refuses_a_cache_longer_than_the_context(tiny):
    with pytest.raises(ValueError, match="exceeds the model's context"):
        KVCache.for_model(tiny, 1, max_len=tiny.config.max_seq_len + 1)


def test_length_advances_only_when_every_layer_has_stored(tiny):
    cache = KVCache(n_layers=2, batch=1, n_kv_heads=2, max_len=8, head_dim=4)
    k, v = _kv(cache, 3)
    cache.update(0, torch.arange(3), k, v)
    assert cache.length == 0
    cache.update(1, torch.arange(3), k, v)
    assert cache.length == 3
    cache.reset()
    assert cache.length == 0 and cache.bytes_used() == 0


# --- bytes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_bytes_match_the_formula(dtype):
    model = build_model("tiny", dtype=dtype)
    cache = KVCache.for_model(model, batch=3, max_len=100)
    per_token = formulas.kv_bytes_per_token(model.config, dtype)
    assert cache.bytes_per_token == per_token
    assert cache.nbytes == formulas.kv_bytes(model.config, 100, dtype, batch=3)
    prefill(model, _tokens((3, 40)), cache)
    assert cache.bytes_used() == 3 * 40 * per_token


@pytest.mark.parametrize("name,kib", [("llama-2-7b", 512), ("llama-2-13b", 800), ("llama-3-8b", 128),
                                      ("llama-2-70b", 320), ("qwen2.5-0.5b", 12)])
def test_kv_bytes_per_token_match_facts(name, kib):
    config = ModelConfig.from_name(name)
    assert formulas.kv_bytes_per_token(config, "bfloat16") == kib * KIB
    assert formulas.kv_bytes(config, 2048, "bfloat16", batch=2) == 2 * 2048 * kib * KIB


def test_opt13b_paged_attention_table1_example():
    """Kwon et al. 2023, Table 1: 12 GB for KV on an A100-40GB is 15.7K slots at 800 KB/token."""
    config = ModelConfig.from_name("llama-2-13b")  # OPT-13B's attention shape
    assert formulas.kv_bytes_per_token(config) == 800 * KIB
    slots = formulas.kv_token_slots(config, 12 * 2**30)  # the paper's GB here are binary
    assert round(slots / 1000, 1) == 15.7
    # 40 GB - 26 GB of weights - 2 GB of activations leaves the same 12 GB
    assert formulas.max_concurrent_requests(config, 40 * 2**30, 1, weights=26 * 2**30,
                                            activation_reserve=2 * 2**30) == slots
    # reserving 2,048 tokens per request (OPT's context) leaves room for only 7 requests
    assert formulas.max_concurrent_requests(config, 40 * 2**30, 2048, weights=26 * 2**30,
                                            activation_reserve=2 * 2**30) == 7


def test_capacity_from_the_tables():
    result = capacity("llama-2-13b", "A100 40GB SXM", 2048, memory_utilization=1.0)
    # the memory nvidia-smi reports for an A100 40GB (40,960 MiB; its driver's reserve is not in
    # the table), not the datasheet's 40 read as decimal GB: the budget is about 14.9 GB, not
    # the 12 GB that a decimal reading (the vLLM paper's Figure 1 split) leaves
    assert result.device_memory == 40960 * 2**20
    assert result.activation_reserve == DEFAULT_ACTIVATION_RESERVE
    assert result.weights == formulas.weight_bytes(ModelConfig.from_name("llama-2-13b"))
    assert result.kv_budget == result.device_memory - result.weights - DEFAULT_ACTIVATION_RESERVE
    assert abs(result.kv_budget - 14.92e9) < 0.01e9
    assert result.token_slots == int(result.kv_budget // (800 * KIB))
    assert result.max_requests == result.token_slots // 2048
    assert "token slots" in str(result)
    too_big = capacity("llama-2-70b", "A100 40GB SXM", 2048)
    assert too_big.max_requests == 0 and too_big.token_slots == 0 and "no room" in str(too_big)
    with pytest.raises(ValueError, match="no memory size"):
        capacity("llama-2-7b", "Apple M4", 2048)


def test_capacity_sizes_the_cache_from_the_engines_share_of_memory():
    """vLLM takes gpu_memory_utilization x the device's memory (0.92 by default) and gives the
    cache what is left of that share after the weights and the activation peak: the untouched
    8% comes off the cache, not the weights, so the cache shrinks by more than 8%."""
    from inferlab.analysis.capacity import VLLM_GPU_MEMORY_UTILIZATION
    assert VLLM_GPU_MEMORY_UTILIZATION == 0.92
    full = capacity("llama-3-8b", "H100 SXM", 8192, memory_utilization=1.0)
    engine = capacity("llama-3-8b", "H100 SXM", 8192)
    assert engine.memory_utilization == 0.92 and engine.usable_memory == 0.92 * full.device_memory
    assert engine.kv_budget == pytest.approx(full.kv_budget - 0.08 * full.device_memory)
    assert engine.max_requests == engine.token_slots // 8192 < full.max_requests
    assert 1 - engine.kv_budget / full.kv_budget > 0.08           # the share falls on the cache
    assert "92% of" in str(engine)
    with pytest.raises(ValueError, match="memory_utilization"):
        capacity("llama-3-8b", "H100 SXM", 8192, memory_utilization=1.5)


def test_capacity_scales_with_kv_heads_and_context():
    mha = ModelConfig.from_name("llama-2-7b")
    gqa = mha.with_kv_heads(8)
    a = formulas.max_concurrent_requests(mha, 80e9, 4096)
    b = formulas.max_concurrent_requests(gqa, 80e9, 4096)
    assert b >= 4 * a - 3  # a quarter of the bytes per token: about four times the requests
    assert formulas.max_concurrent_requests(mha, 80e9, 8192) == \
        formulas.kv_token_slots(mha, formulas.kv_memory_budget(mha, 80e9)) // 8192
    with pytest.raises(ValueError):
        formulas.max_concurrent_requests(mha, 80e9, 0)


def test_attention_intensity_stays_near_one():
    assert formulas.attention_decode_intensity(2, 1) == 1.0
    assert formulas.attention_decode_intensity(2, 4) == 4.0
    assert formulas.attention_decode_intensity(4, 1) == 0.5


def test_capacity_figure_and_fallback(monkeypatch):
    import sys

    import matplotlib
    matplotlib.use("Agg")
    ax = plot_capacity(device="A100 40GB SXM")
    assert len(ax.get_lines()) == 4 and "A100 40GB SXM" in ax.get_title()
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # no ipywidgets: the static figure
    assert hasattr(show_capacity(), "get_lines")


def test_capacity_widget_builds_when_ipywidgets_is_there():
    pytest.importorskip("ipywidgets")
    import matplotlib
    matplotlib.use("Agg")
    from inferlab.analysis.capacity import capacity_widget

    box = capacity_widget()
    assert len(box.children) == 4


# --- GQA / MQA conversion ----------------------------------------------------------------------

def test_kv_head_options():
    assert kv_head_options(8) == [1, 2, 4, 8]
    assert kv_head_options(12) == [1, 2, 3, 4, 6, 12]


def test_mean_pool_averages_consecutive_heads():
    w = torch.arange(4 * 2 * 3, dtype=torch.float32).reshape(4 * 2, 3)  # 4 heads, D=2, d=3
    pooled = mean_pool_heads(w, 4, 2, head_dim=2)
    torch.testing.assert_close(pooled[:2], (w[0:2] + w[2:4]) / 2)
    torch.testing.assert_close(pooled[2:], (w[4:6] + w[6:8]) / 2)
    bias = torch.arange(8, dtype=torch.float32)
    torch.testing.assert_close(mean_pool_heads(bias, 4, 1, head_dim=2), torch.tensor([3.0, 4.0]))
    with pytest.raises(ValueError, match="divide"):
        mean_pool_heads(w, 4, 3, head_dim=2)


def test_conversion_is_exact_when_grouped_heads_are_already_equal(tiny):
    c = tiny.config  # 8 query heads, 4 KV heads
    model = build_model(c, seed=3)
    with torch.no_grad():  # make KV heads (0,1) and (2,3) identical: pooling then loses nothing
        for layer in model.model.layers:
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                w = proj.weight.view(c.n_kv_heads, c.head_dim, c.d_model)
                w[1::2] = w[0::2]
    converted = convert_kv_heads(model, 2)
    assert converted.config.n_kv_heads == 2 and model.config.n_kv_heads == 4
    tokens = _tokens((1, 12))
    with torch.no_grad():
        torch.testing.assert_close(converted(tokens), model(tokens), atol=1e-5, rtol=1e-5)


def test_mqa_conversion_shrinks_the_cache_and_still_generates_consistently(tiny):
    mqa = convert_kv_heads(tiny, 1)
    assert mqa.model.layers[0].self_attn.k_proj.weight.shape == (tiny.config.head_dim, 256)
    assert KVCache.for_model(mqa, 1, 64).nbytes * 4 == KVCache.for_model(tiny, 1, 64).nbytes
    prompt = _tokens((1, 6))
    assert torch.equal(generate(mqa, prompt, 10), generate_without_cache(mqa, prompt, 10))
    assert tiny.model.layers[0].self_attn.k_proj.weight.shape[0] == 4 * tiny.config.head_dim
    with pytest.raises(ValueError, match="cannot grow"):
        convert_kv_heads(mqa, 2)
    with pytest.raises(ValueError, match="already has"):
        convert_kv_heads(tiny, 4)


def test_conversion_keeps_qwen2_biases_and_tied_embeddings():
    cfg = ModelConfig.from_name("qwen2.5-0.5b").scaled(n_layers=1, d_model=64, n_heads=4,
                                                        n_kv_heads=2, head_dim=16, ffn_dim=96,
                                                        vocab_size=100)
    converted = convert_kv_heads(build_model(cfg, seed=1), 1)
    assert converted.model.layers[0].self_attn.k_proj.bias.shape == (16,)
    assert converted.lm_head.weight is converted.model.embed_tokens.weight


@pytest.mark.parametrize("heads,kv_heads,T", [(8, 2, 1), (8, 1, 1), (8, 8, 1), (8, 2, 5)])
def test_grouped_attention_equals_sdpa_with_enable_gqa(heads, kv_heads, T):
    from inferlab.model.kv_cache import grouped_attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, T, 16, generator=gen)
    k, v = torch.randn(2, kv_heads, 9, 16, generator=gen), torch.randn(2, kv_heads, 9, 16, generator=gen)
    mask = torch.arange(9) <= torch.arange(9 - T, 9)[:, None]  # the last T of 9 positions
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                enable_gqa=True)
    torch.testing.assert_close(grouped_attention(q, k, v, mask), expected, atol=1e-5, rtol=1e-5)


@settings(max_examples=15, deadline=None)
@given(chunks=st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=6),
       static=st.booleans())
def test_any_split_into_prefill_chunks_and_steps_equals_recomputation(chunks, static):
    """Property: however a sequence is fed (chunks of any size), every logit equals the uncached one."""
    model = _MODEL
    total = sum(chunks)
    tokens = _tokens((1, total), seed=total)
    with torch.no_grad():
        full = model(tokens)
        cache = (StaticKVCache if static else KVCache).for_model(model, 1, max_len=total)
        start = 0
        for n in chunks:
            got = model(tokens[:, start:start + n], torch.arange(start, start + n), cache)
            torch.testing.assert_close(got, full[:, start:start + n], atol=1e-5, rtol=1e-5)
            start += n
    assert cache.length == total


def test_capacity_takes_a_one_byte_cache_by_name_or_by_bytes():
    from inferlab.analysis import formulas
    from inferlab.analysis.capacity import capacity
    from inferlab.model.config import ModelConfig

    half = capacity("llama-3-8b", "A100 80GB SXM", context=4096)
    by_name = capacity("llama-3-8b", "A100 80GB SXM", context=4096, kv_dtype="float8_e4m3fn")
    by_bytes = capacity("llama-3-8b", "A100 80GB SXM", context=4096, kv_dtype=1)
    assert by_name.max_requests == by_bytes.max_requests
    assert by_name.kv_bytes_per_token * 2 == half.kv_bytes_per_token
    assert by_name.kv_dtype == "float8_e4m3fn" and by_bytes.kv_dtype == "1-byte"
    assert by_name.max_requests == formulas.max_concurrent_requests(
        ModelConfig.from_name("llama-3-8b"), half.usable_memory, 4096, 1,
        half.activation_reserve, weights=half.weights)
    assert half.max_requests < by_name.max_requests <= 2 * half.max_requests + 1
