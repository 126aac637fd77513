"""The formulas against the published numbers in FACTS.md, and their refusals of bad input."""

import math

import pytest

from inferlab.analysis import formulas as f
from inferlab.analysis.hardware import get_device_spec
from inferlab.model.config import ModelConfig

KIB = 1024


def test_ridge_point_h100_sxm_is_about_295():
    h100 = get_device_spec("H100 SXM")
    assert f.ridge_point(h100.peak_flops("bfloat16"), h100.bandwidth) == pytest.approx(295, abs=0.5)
    assert h100.ridge_point() == pytest.approx(295.2, abs=0.1)


def test_70b_fp16_decode_floor_is_about_42_ms():
    # FACTS.md / issue 2: 70B parameters x 2 bytes = 140 GB per token, on 3.35 TB/s.
    assert f.decode_time_floor(70e9 * 2, 3.35e12) == pytest.approx(0.0418, abs=0.0002)
    # the real Llama-2-70B shape has slightly fewer parameters (about 69B)
    llama70 = ModelConfig.from_name("llama-2-70b")
    floor = f.decode_time_floor(f.weight_bytes(llama70, "float16"), 3.35e12)
    assert 0.040 < floor < 0.043


@pytest.mark.parametrize("name, billions", [("llama-2-7b", 6.74), ("llama-2-13b", 13.02),
                                            ("llama-2-70b", 68.98), ("llama-3-8b", 8.03),
                                            ("mistral-7b", 7.24), ("qwen2.5-0.5b", 0.494),
                                            ("qwen2.5-7b", 7.62)])
def test_param_counts_match_published_sizes(name, billions):
    assert f.param_count(ModelConfig.from_name(name)) / 1e9 == pytest.approx(billions, rel=0.005)


@pytest.mark.parametrize("name, kib", [("llama-2-7b", 512), ("llama-2-13b", 800),
                                       ("llama-2-70b", 320), ("llama-3-8b", 128),
                                       ("llama-3-70b", 320), ("mistral-7b", 128),
                                       ("qwen2.5-0.5b", 12), ("qwen2.5-7b", 56)])
def test_kv_bytes_per_token_match_facts(name, kib):
    assert f.kv_bytes_per_token(ModelConfig.from_name(name), "bfloat16") == kib * KIB


def test_llama2_7b_decode_ceiling_on_a100_80gb_is_about_153_tokens_per_second():
    # FACTS.md: non-embedding bf16 weights of about 13.3 GB at 2,039 GB/s: at most ~153 tok/s.
    cfg = ModelConfig.from_name("llama-2-7b")
    non_embedding = f.weight_bytes(cfg, "bfloat16", include_embeddings=False)
    assert non_embedding / 1e9 == pytest.approx(12.9, abs=0.1)
    a100 = get_device_spec("A100 80GB SXM")
    per_step = f.decode_bytes_per_step(cfg, "bfloat16")  # adds lm_head: about 13.2 GB
    assert per_step / 1e9 == pytest.approx(13.2, abs=0.1)
    assert 1 / f.decode_time_floor(13.3e9, a100.bandwidth) == pytest.approx(153, abs=1)


def test_gpt_fast_bandwidth_utilisation_of_72_percent():
    # FACTS.md: 7B fp16 at 107 tok/s against 2 TB/s is about 72% (13.5 GB of weights).
    assert f.bandwidth_utilisation(13.5e9, 1 / 107, 2.0e12) == pytest.approx(0.72, abs=0.01)


def test_matmul_intensity():
    assert f.matmul_flops(2, 3, 4) == 48
    assert f.matmul_bytes(2, 3, 4, 2) == (8 + 12 + 6) * 2
    # a matrix-vector product in 16-bit does about 1 FLOP per byte
    assert f.matmul_intensity(1, 4096, 4096, 2) == pytest.approx(1.0, abs=0.001)
    # a big square matmul: 2 n^3 / (3 n^2 b) = 2n / 3b
    assert f.matmul_intensity(4096, 4096, 4096, 2) == pytest.approx(2 * 4096 / 6)


def test_decode_intensity_and_critical_batch():
    assert f.decode_intensity(1, 2) == 1.0
    assert f.decode_intensity(64, 2) == 64.0
    assert f.decode_intensity(8, 1) == 16.0  # int8 weights double the intensity
    h100 = get_device_spec("H100 SXM")
    b = f.critical_batch_size(h100.peak_bf16, h100.bandwidth, 2)
    assert b == pytest.approx(295, abs=1)
    assert f.decode_intensity(b, 2) == pytest.approx(h100.ridge_point())


def test_flops_per_token_is_about_twice_the_parameters():
    cfg = ModelConfig.from_name("llama-2-7b")
    assert f.flops_per_token(cfg) / (2 * f.param_count(cfg)) == pytest.approx(1.0, abs=0.02)
    # attention adds 4 L H D FLOPs per past token
    extra = f.flops_per_token(cfg, context=1000) - f.flops_per_token(cfg)
    assert extra == 4 * 32 * 32 * 128 * 1000


def test_tied_embeddings_are_counted_once():
    cfg = ModelConfig.from_name("qwen2.5-0.5b")
    untied = cfg.scaled(tie_embeddings=False)
    assert f.param_count(untied) - f.param_count(cfg) == cfg.vocab_size * cfg.d_model
    assert f.decode_bytes_per_step(cfg, "bfloat16") == f.weight_bytes(cfg, "bfloat16")


@pytest.mark.parametrize("call", [
    lambda: f.ridge_point(0, 1e12), lambda: f.ridge_point(1e12, -1),
    lambda: f.decode_time_floor(1e9, 0), lambda: f.matmul_intensity(0, 4, 4, 2),
    lambda: f.decode_intensity(0), lambda: f.bandwidth_utilisation(1e9, 0, 1e12),
    lambda: f.flops_per_token(ModelConfig.from_name("tiny"), context=-1),
])
def test_non_positive_inputs_are_refused_with_a_message(call):
    with pytest.raises(ValueError, match="must be"):
        call()


def test_weight_bytes_refuses_unknown_dtypes():
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        f.weight_bytes(ModelConfig.from_name("tiny"), "fp8")
    assert math.isclose(f.weight_bytes(ModelConfig.from_name("tiny"), "float32"),
                        2 * f.weight_bytes(ModelConfig.from_name("tiny"), "bfloat16"))


def test_group_scales_cost_16_over_g_bits_and_double_with_each_halving():
    """Issue 24 item 16: a 16-bit scale per group of G weights adds 16 / G bits per weight."""
    extra = {g: 8 * (f.quantized_bytes_per_weight(4, g) - 0.5) for g in (128, 64, 32)}
    assert extra == {128: 0.125, 64: 0.25, 32: 0.5}
    assert extra[64] - extra[128] == 0.125 and extra[32] - extra[64] == 0.25
    # the course's quantizer keeps float32 scales: groups of 32 then cost a whole bit
    assert 8 * f.quantized_bytes_per_weight(4, 32, scale_bytes=4) == 5.0
    # gpt-fast int4: groups of 32, a bf16 scale and a bf16 zero point -> 5 bits, 3.2x over bf16
    gptfast = f.quantized_bytes_per_weight(4, 32, scale_bytes=2, zero_point=True)
    assert 8 * gptfast == 5.0 and 2 / gptfast == pytest.approx(3.2)
    with pytest.raises(ValueError):
        f.quantized_bytes_per_weight(4, 0)


def test_the_course_quantizer_reads_what_the_formula_says():
    import torch
    from inferlab.model import quant
    w = torch.randn(8, 128, generator=torch.Generator().manual_seed(0))
    for g in (128, 64, 32):
        qt = quant.quantize(w, bits=4, group_size=g)
        assert qt.bytes_per_weight == pytest.approx(
            f.quantized_bytes_per_weight(4, g, scale_bytes=qt.scale.element_size()))


def test_a_whole_decode_step_cannot_pass_its_context_bound():
    # Weights are read once for the batch, caches once per sequence: the step's intensity
    # rises with the batch towards 2N / (n s_kv) + 2G/b and never past it.
    cfg, ridge = ModelConfig.from_name("llama-3-8b"), 295.2
    n_max = f.compute_bound_context(cfg, ridge)
    assert 300 < n_max < 500            # Llama-3-8B, bf16, 128 KiB a token, G = 4
    at = [f.decode_step_intensity(cfg, b, 2048) for b in (1, 16, 256, 10**6)]
    assert at == sorted(at) and at[-1] < ridge / 4   # at 2,048 tokens, far below the ridge
    assert f.decode_step_intensity(cfg, 10**9, round(n_max)) == pytest.approx(ridge, rel=1e-3)
    # multi-head attention (G = 1) has the least room; more query heads per KV head, more
    assert f.compute_bound_context(ModelConfig.from_name("llama-2-7b"), ridge) < n_max
    # attention alone at the ridge: any context will do
    assert f.compute_bound_context(cfg, 3.9) == math.inf
