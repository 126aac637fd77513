"""inferlab.model.quant and the int8 KV cache: round-trip bounds, the int8 layer against its
dequantized weights, the model swap, and the errors for bad input."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.model import quant
from inferlab.model.generate import generate
from inferlab.model.kv_cache import Int8KVCache, KVCache
from inferlab.model.llama import build_model


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([4, 8]), groups=st.integers(1, 4), group=st.sampled_from([8, 16, 32]),
       rows=st.integers(1, 5), symmetric=st.booleans(), seed=st.integers(0, 2**16),
       spread=st.floats(1e-3, 1e3))
def test_round_trip_error_is_at_most_half_a_step(bits, groups, group, rows, symmetric, seed,
                                                 spread):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, groups * group, generator=gen) * spread
    w[0, 0] += spread * 3  # an outlier
    qt = quant.quantize(w, bits, group, symmetric)
    back = qt.dequantize()
    step = qt.scale.repeat_interleave(group, dim=1)  # (N, K)
    assert back.shape == w.shape
    assert bool(((back - w).abs() <= step / 2 * (1 + 1e-5) + 1e-6 * spread).all())
    codes = qt.q.int()
    lim = 2 ** (bits - 1)
    assert int(codes.min()) >= -lim and int(codes.max()) <= lim - 1
    if symmetric:
        assert int(codes.abs().max()) <= lim - 1


def test_symmetric_keeps_zero_and_per_channel_is_one_group_per_row():
    w = torch.tensor([[0.0, 1.0, -2.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    qt = quant.quantize(w, bits=8)
    assert qt.scale.shape == (2, 1) and qt.group_size == 4
    back = qt.dequantize()
    assert back[0, 0] == 0 and bool((back[1] == 0).all())
    assert torch.allclose(back, w, atol=2 / 127 / 2)


def test_smaller_groups_make_smaller_errors_on_outliers():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=gen)
    w[:, 7] *= 50  # an outlier column, as LLM.int8 describes
    err = {g: float((quant.quantize(w, 4, g).dequantize() - w).pow(2).mean())
           for g in (256, 128, 32)}
    assert err[32] < err[128] < err[256]


def test_bytes_count_packed_codes_and_scales():
    w = torch.randn(16, 128)
    assert quant.quantize(w, 8).nbytes == 16 * 128 + 16 * 4
    assert quant.quantize(w, 4, 32).nbytes == 16 * 128 // 2 + 16 * 4 * 4
    assert quant.quantize(w, 4, 32, symmetric=False).nbytes == 16 * 64 + 2 * 16 * 4 * 4
    assert quant.quantize(w, 4, 32).bytes_per_weight == pytest.approx(0.5 + 4 / 32)


def test_padding_is_explicit():
    w = torch.randn(4, 192)
    with pytest.raises(ValueError, match="does not divide the row length 192.*pad=True"):
        quant.quantize(w, 4, 128)
    qt = quant.quantize(w, 4, 128, pad=True)
    assert qt.q.shape == (4, 256) and qt.scale.shape == (4, 2) and qt.columns == 192
    assert qt.dequantize().shape == (4, 192)


@pytest.mark.parametrize("bits", [2, 3, 16, 0])
def test_unsupported_bits_are_refused(bits):
    with pytest.raises(ValueError, match="not supported.*4 or 8"):
        quant.quantize(torch.randn(2, 8), bits)
    with pytest.raises(ValueError, match="not supported"):
        quant.fake_quantize_(build_model("tiny"), bits)


def test_integer_input_is_refused():
    with pytest.raises(TypeError, match="already quantized"):
        quant.quantize(torch.ones(2, 8, dtype=torch.int8))


def test_int8_linear_matches_its_dequantized_weight_and_reads_a_quarter_of_the_bytes():
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40)
    layer = quant.Int8Linear(linear)
    assert not any(t.is_floating_point() and t.shape == linear.weight.shape
                   for t in layer.buffers())  # no float copy of the weight is kept
    x = torch.randn(3, 5, 96)
    w = quant.quantize(linear.weight.detach(), 8).dequantize()
    expected = x @ w.T + linear.bias.detach()
    got = layer(x)
    assert got.dtype == x.dtype and got.shape == (3, 5, 40)
    assert torch.allclose(got, expected, atol=3e-2, rtol=2e-2)  # bfloat16 activations
    assert layer.nbytes < 0.3 * (linear.weight.numel() * 4)


def test_int8_model_generates_like_the_float_one_and_refuses_a_second_pass():
    model = build_model("tiny", seed=3)
    q = quant.int8_weight_only(copy.deepcopy(model))
    assert all(not isinstance(m, torch.nn.Linear) for m in q.modules())
    assert q.dtype == torch.float32
    tokens = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = model(tokens), q(tokens)
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.999
    assert generate(q, tokens, 4).shape == (1, 16)
    with pytest.raises(ValueError, match="already quantized"):
        quant.int8_weight_only(q)
    with pytest.raises(ValueError, match="already quantized"):
        quant.fake_quantize_(q, 4, 32)
    f = quant.fake_quantize_(copy.deepcopy(model), 4, 32)
    with pytest.raises(ValueError, match="already quantized .*int4 group 32"):
        quant.fake_quantize_(f, 4, 32)


def test_fake_quantize_checks_every_shape_before_changing_anything():
    model = build_model("tiny")  # d_model 256, ffn 704: 128 does not divide 704
    before = model.model.layers[0].self_attn.q_proj.weight.clone()
    with pytest.raises(ValueError, match="does not divide"):
        quant.fake_quantize_(model, 4, 128)
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight, before)
    quant.fake_quantize_(model, 4, 128, pad=True)  # and the model may still be quantized once


def test_weight_bytes():
    model = build_model("tiny")
    f32 = quant.weight_bytes(model)
    assert quant.weight_bytes(model, 8) == pytest.approx(f32 / 4, rel=0.02)
    q = quant.int8_weight_only(copy.deepcopy(model))
    assert quant.weight_bytes(q) == pytest.approx(f32 / 4, rel=0.02)


def test_int8_kv_cache_is_close_to_the_float_cache_and_smaller():
    model = build_model("tiny", seed=5)
    c = model.config
    tokens = torch.randint(0, 512, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens)
        cache = Int8KVCache.for_model(model, batch=2, max_len=24)
        pre = model(tokens[:, :16], torch.arange(16), cache)
        steps = [model(tokens[:, t:t + 1], torch.tensor([t]), cache) for t in range(16, 20)]
    got = torch.cat([pre] + steps, dim=1)
    assert torch.allclose(got, full, atol=2e-2, rtol=0)
    assert cache.length == 20 and cache.dtype == torch.float32
    f32 = KVCache.for_model(model, 2, 24)
    assert cache.bytes_per_token == 2 * c.n_layers * c.n_kv_heads * (c.head_dim + 4)
    assert cache.nbytes < f32.nbytes / 3
    scored = quant.ThroughCache(model, Int8KVCache)
    with torch.no_grad():
        assert torch.allclose(scored(tokens), full, atol=2e-2, rtol=0)
    with pytest.raises(TypeError, match="cache holds torch.float32"):
        cache.update(0, torch.tensor([20]), torch.zeros(2, c.n_kv_heads, 1, c.head_dim,
                                                        dtype=torch.int8),
                     torch.zeros(2, c.n_kv_heads, 1, c.head_dim, dtype=torch.int8))


def test_storage_formats_have_a_size_for_the_byte_formulas():
    from inferlab.analysis import formulas
    from inferlab.device import bytes_per_element
    from inferlab.model.config import ModelConfig

    assert bytes_per_element("int8") == bytes_per_element(torch.float8_e4m3fn) == 1
    llama3 = ModelConfig.from_name("llama-3-8b")
    assert formulas.kv_bytes_per_token(llama3, "int8") * 2 == \
        formulas.kv_bytes_per_token(llama3, "bfloat16")
    with pytest.raises(ValueError):
        bytes_per_element("int3")
