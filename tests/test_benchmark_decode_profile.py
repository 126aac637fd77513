"""``python -m inferlab.benchmarks.decode_profile``: the breakdown covers the step's operators."""

from __future__ import annotations

from conftest import tiny_model
from inferlab.benchmarks import decode_profile


def test_the_profile_finds_every_linear_layer_and_the_lm_head():
    model = tiny_model(64, dtype="float32")
    c = model.config
    step = decode_profile.decode_step(model, context=20)
    groups, shapes = decode_profile.breakdown(step, calls=2)
    assert {"linear layers", "attention (K/V store, paged read, softmax)"} <= set(groups)
    assert all(seconds >= 0 for seconds in groups.values())
    calls = sum(n for _, n in shapes.values())
    assert calls == c.n_layers * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    head = [n for key, (_, n) in shapes.items() if (c.d_model, c.vocab_size) in key]
    assert head == [1]


def test_the_gemv_is_timed_over_every_weight_both_ways():
    model = tiny_model(64, dtype="float32")
    rates = decode_profile.gemv_rates(model, min_run_time=0.01)
    assert set(rates) == {"gemv_as_stored", "gemv_in_out_layout"}
    assert all(rate > 0 for rate in rates.values())


def test_the_bare_model_step_decodes_one_token_over_a_contiguous_cache():
    model = tiny_model(64, dtype="float32")
    token = decode_profile.bare_step(model, context=20)()
    assert token.shape == (1,) and 0 <= int(token) < model.config.vocab_size
