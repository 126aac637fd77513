"""Mixture-of-experts and multi-head latent attention, against the published numbers.

Totals: Mixtral 8x7B has 46.7B parameters and uses 12.9B per token (Mistral AI, "Mixtral of
experts", 2023-12-11; Jiang et al. 2024); DeepSeek-V2 236B with 21B activated (arXiv:2405.04434,
abstract); DeepSeek-V3 671B with 37B activated (arXiv:2412.19437, abstract). MLA caches
(d_c + d_h^R) = 4.5 d_h numbers per token and layer against MHA's 2 n_h d_h (DeepSeek-V2, Table 1).
"""

import random

import pytest

from inferlab.analysis import mla, moe
from inferlab.analysis.formulas import attention_decode_intensity


@pytest.mark.parametrize("name, total, active", [("mixtral-8x7b", 46.7e9, 12.9e9),
                                                 ("deepseek-v2", 236e9, 21e9),
                                                 ("deepseek-v3", 671e9, 37e9),
                                                 # 116.8B and 5.1B as OpenAI's model description
                                                 # gives them (secondary: openrouter's listing)
                                                 ("gpt-oss-120b", 116.8e9, 5.1e9)])
def test_parameter_counts_from_the_shape_match_the_published_totals(name, total, active):
    cfg = moe.MoEConfig.from_name(name)
    assert cfg.total_params() == pytest.approx(total, rel=0.003)
    # Papers differ on whether the input embedding (a lookup) counts as activated. The published
    # figure, which is rounded (to 0.1B for Mixtral, to 1B for DeepSeek), must lie between the
    # count without it and the count with it, within that rounding.
    half_unit = 0.05e9 if name in ("mixtral-8x7b", "gpt-oss-120b") else 0.5e9
    with_lookup = cfg.active_params()
    without = with_lookup - cfg.vocab_size * cfg.d_model
    assert without - half_unit <= active <= with_lookup + half_unit


def test_expected_experts_is_k_at_batch_1_and_tends_to_all_experts():
    assert moe.expected_experts(1, 8, 2) == pytest.approx(2)
    assert moe.expected_experts(1, 256, 8) == pytest.approx(8)
    assert moe.expected_experts(10_000, 256, 8) == pytest.approx(256)
    values = [moe.expected_experts(b, 256, 8) for b in (1, 2, 4, 8, 64, 512)]
    assert values == sorted(values)
    with pytest.raises(ValueError, match="exceeds"):
        moe.expected_experts(4, 8, 9)


@pytest.mark.parametrize("batch, n_experts, k", [(4, 8, 2), (16, 256, 8), (64, 160, 6)])
def test_expected_experts_matches_a_simulation_of_even_routing(batch, n_experts, k):
    rng = random.Random(0)
    trials = 4000
    seen = sum(len(set().union(*(rng.sample(range(n_experts), k) for _ in range(batch))))
               for _ in range(trials)) / trials
    assert seen == pytest.approx(moe.expected_experts(batch, n_experts, k), rel=0.02)


def test_uneven_routing_touches_fewer_experts_than_the_even_formula():
    rng = random.Random(1)
    weights = [2.0] * 2 + [1.0] * 6          # two popular experts out of 8, top-2 routing
    trials, batch = 4000, 3
    seen = 0
    for _ in range(trials):
        touched = set()
        for _ in range(batch):
            pool, w = list(range(8)), list(weights)
            for _ in range(2):
                pick = rng.choices(range(len(pool)), w)[0]
                touched.add(pool.pop(pick))
                w.pop(pick)
        seen += len(touched)
    assert seen / trials < moe.expected_experts(batch, 8, 2)


def test_decode_bytes_grow_from_the_active_to_all_weights():
    cfg = moe.MoEConfig.from_name("mixtral-8x7b")
    lookup = cfg.vocab_size * cfg.d_model * 2
    assert cfg.decode_bytes_per_step(1) == pytest.approx(cfg.active_params() * 2 - lookup)
    assert cfg.decode_bytes_per_step(10_000) == pytest.approx(cfg.total_params() * 2 - lookup)
    # at batch 8, top-2 of 8 experts: 1 - (3/4)^8 = 90% of the experts are read
    frac = moe.expected_experts(8, 8, 2) / 8
    assert frac == pytest.approx(1 - 0.75**8)


def test_mla_caches_4_5_head_dims_per_layer_as_deepseek_v2_table_1():
    for name in ("deepseek-v2", "deepseek-v3"):
        shape = moe.MoEConfig.from_name(name).mla
        assert shape.cached_per_layer == 4.5 * shape.qk_nope_head_dim == 576
        ratio = mla.mha_kv_bytes_per_token(shape) / mla.kv_bytes_per_token(shape)
        assert ratio == pytest.approx(2 * shape.n_heads / 4.5)
    v3 = moe.MoEConfig.from_name("deepseek-v3").mla
    assert mla.kv_bytes_per_token(v3, "bfloat16") == 61 * 576 * 2   # 70,272 B, about 68.6 KiB


def test_mla_decode_attention_is_far_more_intense_than_gqa():
    v3 = moe.MoEConfig.from_name("deepseek-v3").mla
    absorbed = mla.decode_attention_intensity(v3, "bfloat16")
    assert absorbed == pytest.approx(128 * (2 * 576 + 2 * 512) / (576 * 2))
    assert absorbed > 30 * attention_decode_intensity(2, 8)   # Llama-3's group of 8: 8 FLOP/B


def test_mla_attention_parameters_of_deepseek_v3():
    # q_a 7168x1536 + norm, q_b 1536x(128x192), kv_a 7168x576 + norm, kv_b 512x(128x256), o 16384x7168
    v3 = moe.MoEConfig.from_name("deepseek-v3").mla
    expected = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512
                + 512 * 128 * 256 + 128 * 128 * 7168)
    assert mla.attention_params(v3) == expected
