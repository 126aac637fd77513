"""KV bytes of mixed attention layouts agree with Chapter 2's formula where they coincide, stop
growing where a window or a recurrent state says so, and read less than they store where
attention is sparse."""

import pytest

from inferlab.analysis import formulas
from inferlab.analysis.attention_layouts import AttentionLayout, layouts
from inferlab.model.config import ModelConfig


def test_every_row_loads_and_names_its_source():
    names = {L.name for L in layouts()}
    assert {"gpt-oss-120b", "qwen3-next-80b-a3b", "deepseek-v3.2"} <= names
    assert all(L.source for L in layouts())


def test_a_full_attention_model_is_chapter_twos_formula():
    L = AttentionLayout.from_name("llama-3-8b")
    per_token = formulas.kv_bytes_per_token(ModelConfig.from_name("llama-3-8b"), "bfloat16")
    for tokens in (1, 100, 8192):
        assert L.stored_bytes(tokens) == tokens * per_token == L.read_bytes(tokens)


def test_sliding_layers_stop_growing_at_their_window():
    L = AttentionLayout.from_name("gpt-oss-120b")
    all_full = 2 * L.n_layers * L.n_kv_heads * L.head_dim * 2  # every layer full, bf16
    assert L.stored_bytes(L.window) == L.window * all_full       # inside the window: all grow
    extra = L.stored_bytes(L.window + 1000) - L.stored_bytes(L.window)
    assert extra == 1000 * L.growth_bytes_per_token() == 1000 * all_full / 2  # half the layers


def test_a_linear_hybrid_keeps_a_fixed_state_and_grows_only_in_its_attention_layers():
    L = AttentionLayout.from_name("qwen3-next-80b-a3b")
    state = L.stored_bytes(0)
    assert state == L.linear_layers * L.state_elements() * 2 > 0
    assert L.stored_bytes(0, state_bytes=4) == 2 * state            # float32 state
    growth = L.stored_bytes(10_001) - L.stored_bytes(1)
    assert growth == 10_000 * 2 * L.full_layers * L.n_kv_heads * L.head_dim * 2


def test_sparse_attention_stores_every_token_but_reads_topk_latents():
    L = AttentionLayout.from_name("deepseek-v3.2")
    short, long = L.index_topk // 2, 16 * L.index_topk
    assert L.read_bytes(short) == L.stored_bytes(short)              # below top-k: reads all
    assert L.read_bytes(long) < L.stored_bytes(long) / 3
    # reading grows only by the indexer keys once past top-k
    assert L.read_bytes(long + 1) - L.read_bytes(long) == L.n_layers * L.index_dim * 2


def test_layer_counts_must_add_up():
    with pytest.raises(ValueError, match="layers"):
        AttentionLayout("bad", n_layers=4, full_layers=2, window_layers=1)


def test_the_engines_fp8_record_of_deepseek_v32_is_656_plus_132_bytes():
    """FlashMLA's "FP8 with scale" token (README: 512 FP8 values, 4 float32 scales, 64 bf16
    rotary values = 656 bytes) plus the indexer key in FP8 with one float32 scale (132 bytes):
    788 bytes per token and layer where bf16 takes (576 + 128) x 2 = 1,408, about 1.8 times more."""
    L = AttentionLayout.from_name("deepseek-v3.2")
    assert (L.latent_dim, L.latent_rope_dim, L.index_dim) == (576, 64, 128)
    assert L.fp8_token_bytes() == 656 + 132 == 788
    bf16 = L.stored_bytes(1000)
    assert bf16 == 1000 * L.n_layers * 1408
    assert L.stored_bytes_fp8(1000) == 1000 * L.n_layers * 788
    assert bf16 / L.stored_bytes_fp8(1000) == pytest.approx(1.79, abs=0.01)
    with pytest.raises(ValueError, match="latent"):
        AttentionLayout.from_name("llama-3-8b").fp8_token_bytes()
