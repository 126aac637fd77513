"""Request-level roofline bounds (prefill, decode, their crossover; recompute against swap) and
prefill attention's memory traffic with and without IO-aware tiling."""

import pytest

from inferlab.analysis import attention_io as aio
from inferlab.analysis import formulas
from inferlab.analysis import request_time as rt
from inferlab.analysis.hardware import get_device_spec
from inferlab.model.config import ModelConfig

H100 = get_device_spec("H100 SXM")
PEAK, BW = H100.peak_flops("bfloat16"), H100.bandwidth


def test_a_long_prefill_is_compute_bound_and_a_decode_step_memory_bound():
    cfg = ModelConfig.from_name("llama-3-8b")
    linear = formulas.param_count(cfg, include_embeddings=False)
    head = cfg.vocab_size * cfg.d_model
    # a prefill: the matmuls and attention compute-bound, the LM head (one position) a read
    pairs = formulas.causal_pairs(4096)
    by_hand = (2 * linear * 4096 + 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * pairs) / PEAK \
        + 2 * head / BW
    assert rt.prefill_time(cfg, 4096, PEAK, BW) == pytest.approx(by_hand)
    # a decode step: every kernel reads; the cache read includes the new token, then written
    step = rt.decode_step_time(cfg, 100, PEAK, BW)
    assert step == pytest.approx((formulas.decode_bytes_per_step(cfg)
                                  + formulas.kv_bytes(cfg, 102)) / BW)


def test_request_phases_sum_the_decode_steps_one_by_one():
    cfg = ModelConfig.from_name("llama-2-7b")
    prefill, decode = rt.request_phases(cfg, 300, 40, PEAK, BW)
    assert prefill == rt.prefill_time(cfg, 300, PEAK, BW)
    by_hand = sum(rt.decode_step_time(cfg, 300 + k, PEAK, BW) for k in range(39))
    assert decode == pytest.approx(by_hand, rel=1e-12)
    assert rt.request_phases(cfg, 300, 1, PEAK, BW)[1] == 0.0
    with pytest.raises(ValueError, match=">= 1 token"):
        rt.request_phases(cfg, 0, 5, PEAK, BW)


def test_sliding_window_caps_what_a_decode_step_reads():
    mistral = ModelConfig.from_name("mistral-7b")
    assert mistral.sliding_window == 4096
    assert rt.decode_step_time(mistral, 30_000, PEAK, BW) == rt.decode_step_time(
        mistral, 4096, PEAK, BW)
    assert formulas.kv_bytes(mistral, 32768) == formulas.kv_bytes(mistral, 4096)
    assert formulas.causal_pairs(10, 4) == 10 + 6 * 4 and formulas.causal_pairs(4) == 10


@pytest.mark.parametrize("prompt", [128, 2048, 32768])
def test_crossover_is_the_first_answer_whose_decode_outlasts_the_prefill(prompt):
    cfg = ModelConfig.from_name("qwen2.5-7b")
    n = rt.crossover_output_tokens(cfg, prompt, PEAK, BW)
    prefill, decode = rt.request_phases(cfg, prompt, n, PEAK, BW)
    assert decode >= prefill
    assert rt.request_phases(cfg, prompt, n - 1, PEAK, BW)[1] < prefill
    assert rt.decode_share(cfg, prompt, n, PEAK, BW) >= 0.5


def test_the_crossover_grows_with_the_prompt_past_linear():
    cfg = ModelConfig.from_name("qwen2.5-7b")
    short, long = (rt.crossover_output_tokens(cfg, p, PEAK, BW) for p in (1024, 131072))
    assert long > 100 * short    # 128 x the prompt; attention's quadratic term adds the rest


def test_swap_moves_the_cache_and_recompute_is_a_prefill():
    links = rt.link_bandwidths()
    # 16 GT/s x 16 lanes x 128/130 / 8 bits per byte = 31.5 GB/s each way
    assert links["PCIe Gen4 x16"] == pytest.approx(16e9 * 16 * 128 / 130 / 8, rel=0.001)
    assert links["PCIe Gen5 x16"] == pytest.approx(2 * links["PCIe Gen4 x16"], rel=0.001)
    llama7 = ModelConfig.from_name("llama-2-7b")
    assert rt.swap_time(llama7, 1000, links["PCIe Gen4 x16"]) == pytest.approx(
        1000 * 512 * 1024 / 31.5e9)
    assert rt.recompute_time(llama7, 1000, PEAK, BW) == rt.prefill_time(llama7, 1000, PEAK, BW)
    # grouped-query attention shrinks the bytes to swap by its group size, not the prefill
    llama3 = ModelConfig.from_name("llama-3-8b")
    assert (rt.swap_time(llama7, 1000, 1e9) / rt.swap_time(llama3, 1000, 1e9)) == 4


def test_standard_prefill_attention_moves_the_score_matrix():
    t, h, k, d = 8192, 32, 8, 128
    nbytes = aio.standard_attention_bytes(t, h, k, d, 2)
    assert nbytes == pytest.approx(((2 * h + 2 * k) * t * d + 4 * h * t * t) * 2)
    assert 4 * h * t * t * 2 / nbytes > 0.98          # the T x T matrices are nearly all of it
    # intensity about D / (2 b) for causal attention, whatever T: memory-bound on an H100
    for tokens in (2048, 8192, 32768):
        i = aio.prefill_attention_intensity(tokens, h, k, d, 2, "standard")
        assert i == pytest.approx(d / 4, rel=0.05) and i < H100.ridge_point()


def test_tiling_removes_the_score_matrix_from_hbm():
    t, h, k, d = 8192, 32, 8, 128
    on_chip = aio.tiled_attention_bytes(t, h, k, d, 2, kv_reuse=True)
    assert on_chip == (2 * h + 2 * k) * t * d * 2
    rereads = aio.prefill_attention_intensity(t, h, k, d, 2, "tiled", query_tile=128)
    assert rereads == pytest.approx(2 * 128 / 2, rel=0.05)     # about 2 x tile / b
    assert aio.prefill_attention_intensity(t, h, k, d, 2, "tiled, K/V on chip") > H100.ridge_point()
    assert aio.tiled_attention_bytes(t, h, k, d, 2) < aio.standard_attention_bytes(t, h, k, d, 2)
    with pytest.raises(ValueError, match="kernel must be"):
        aio.prefill_attention_intensity(t, h, k, d, 2, "flash")
