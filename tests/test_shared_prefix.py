"""Shared-prefix (cascade) attention equals per-sequence attention, and reads the prefix once."""

import torch
from hypothesis import given, settings, strategies as st

from inferlab.serving.shared_prefix import (attention_with_lse, bytes_read, merge,
                                            per_sequence_decode, shared_prefix_decode)


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 6), kv_heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 4]),
       prefix=st.integers(1, 40), suffix=st.integers(1, 24), seed=st.integers(0, 2**16),
       ragged=st.booleans())
def test_splitting_off_the_prefix_changes_no_output(batch, kv_heads, group, prefix, suffix,
                                                    seed, ragged):
    g = torch.Generator().manual_seed(seed)
    D, H = 16, kv_heads * group
    q = torch.randn(batch, H, D, generator=g, dtype=torch.float64)
    kp, vp = (torch.randn(kv_heads, prefix, D, generator=g, dtype=torch.float64) for _ in "kv")
    ks, vs = (torch.randn(batch, kv_heads, suffix, D, generator=g, dtype=torch.float64) * 3
              for _ in "kv")
    mask = None
    if ragged:  # each row its own suffix length, 0 included (only the prefix)
        lengths = torch.randint(0, suffix + 1, (batch,), generator=g)
        mask = torch.arange(suffix)[None, :] < lengths[:, None]
    split = shared_prefix_decode(q, kp, vp, ks, vs, mask)
    assert torch.allclose(split, per_sequence_decode(q, kp, vp, ks, vs, mask), atol=1e-10)


def test_the_merge_is_exact_and_an_empty_part_adds_nothing():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    whole, lse = attention_with_lse(q, k, v)
    a, la = attention_with_lse(q, k[:, :2], v[:, :2])
    b, lb = attention_with_lse(q, k[:, 2:], v[:, 2:])
    out, l_out = merge(a, la, b, lb)
    assert torch.allclose(out, whole) and torch.allclose(l_out, lse)
    none = torch.zeros(3, 5, 2, dtype=torch.bool)
    e, le = attention_with_lse(q, k[:, :2], v[:, :2], none)
    assert torch.isneginf(le).all()
    out, _ = merge(whole, lse, e, le)
    assert torch.allclose(out, whole)


def test_scores_large_enough_to_overflow_exp_still_merge():
    q = torch.full((1, 1, 4), 7.0)
    k = torch.full((1, 3, 4), 7.0)  # scores of 98: exp overflows float32 (above about 88.7)
    v = torch.arange(12.0).view(1, 3, 4)
    out, lse = attention_with_lse(q, k, v)
    a, la = attention_with_lse(q, k[:, :1], v[:, :1])
    b, lb = attention_with_lse(q, k[:, 1:], v[:, 1:])
    merged, _ = merge(a, la, b, lb)
    assert torch.isfinite(merged).all() and torch.allclose(merged, out, rtol=1e-4)


def test_the_prefix_is_read_once_instead_of_once_per_sequence():
    r = bytes_read(batch=8, prefix=1000, suffix=100, kv_bytes_per_token=4096)
    assert r["per_sequence"] == 8 * 1100 * 4096 and r["shared_prefix"] == 1800 * 4096
    assert r["saved"] == 7 * 1000 * 4096
    assert bytes_read(1, 1000, 100, 4096)["saved"] == 0  # one sequence: nothing to share


def engine_run(shared_prefix_attention: bool, prefix: list[int], suffixes: list[list[int]]):
    from course_server import model_and_tokenizer
    from inferlab.serving.config import ServingConfig
    from inferlab.serving.engine import Engine
    from inferlab.serving.request import Request

    model, _ = model_and_tokenizer()
    config = ServingConfig(num_blocks=96, max_batch=8, token_budget=256, policy="chunked",
                           shared_prefix_attention=shared_prefix_attention)
    engine = Engine(model, config, prefix_cache=True)
    # the first request fills the prefix cache; the rest arrive together and hit it
    requests = [Request(tuple(prefix + s), 6, arrival_s=0.0 if i == 0 else 1.0)
                for i, s in enumerate(suffixes)]
    run = engine.run(requests)
    return [r.tokens for r in run.results], engine.cache


def test_the_engine_gives_the_same_tokens_with_the_prefix_attended_once():
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, 1000, (70,), generator=g).tolist()  # 4 whole blocks and 6 tokens
    suffixes = [torch.randint(3, 1000, (int(n),), generator=g).tolist()
                for n in torch.randint(1, 20, (6,), generator=g)]
    split, cache = engine_run(True, prefix, suffixes)
    whole, plain = engine_run(False, prefix, suffixes)
    assert split == whole
    assert cache.shared_prefix_rows > 0 and plain.shared_prefix_rows == 0
    assert cache.shared_prefix_tokens >= 4 * 16 * 2  # at least two rows shared 4 blocks
