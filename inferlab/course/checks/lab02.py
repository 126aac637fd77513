"""Checks for Lab 2, "The KV cache". Oracles: full recomputation without a cache (the model's
causal forward pass and ``generate_without_cache``), ``inferlab.analysis.formulas`` and ``inferlab.model.gqa``.
"""

from __future__ import annotations

import torch

from inferlab.analysis import formulas
from inferlab.course.checks import (CheckFailed, expect_close, expect_equal, expect_tensor_close,
    lends, run_check)
from inferlab.model.generate import generate, generate_without_cache
from inferlab.model.gqa import mean_pool_heads
from inferlab.model.kv_cache import KVCache
from inferlab.model.config import ModelConfig
from inferlab.model.llama import build_model

# Points per exercise for the grader's score (inferlab.course.grade; an instructor's
# --weights file overrides them): more for the exercises that are more code.
WEIGHTS = {"2.1": 3, "2.2": 1, "2.3": 1, "2.4": 2, "2.5": 1}

KIB, GIB = 2**10, 2**30


def _make_cache(cls, model, batch, max_len):
    c = model.config
    return cls(c.n_layers, batch, c.n_kv_heads, max_len, c.head_dim, model.dtype, model.device)


def kv_cache(cls):
    """Exercise 2.1: a cache class ``cls(n_layers, batch, n_kv_heads, max_len, head_dim, dtype,
    device)`` whose ``attend(layer, q, k, v, positions)`` stores k, v and attends over the cache."""
    def cases(c):
        model = build_model("tiny", seed=11)  # 8 query heads share 4 KV heads (GQA)
        gen = torch.Generator().manual_seed(12)
        tokens = torch.randint(0, model.config.vocab_size, (2, 14), generator=gen)
        with torch.no_grad():
            full = model(tokens)  # (B, T, V): causal attention, no cache
            cache = _make_cache(c, model, batch=2, max_len=16)
            got = model(tokens[:, :10], torch.arange(10), cache)
        expect_tensor_close("prefill logits of a 10-token prompt through your cache", got,
                            full[:, :10], atol=1e-4, rtol=1e-4,
                            hint="in prefill, the query at position p may attend only to keys "
                                 "at positions 0..p: pass a causal mask over the stored keys "
                                 "(position <= query's position). Did you use enable_gqa=True "
                                 "(the model has fewer KV heads than query heads)?")
        with torch.no_grad():
            for t in range(10, 14):
                got = model(tokens[:, t:t + 1], torch.tensor([t]), cache)
                expect_tensor_close(f"decode logits at position {t}", got, full[:, t:t + 1],
                                    atol=1e-4, rtol=1e-4,
                                    hint="a decode step must write the new k, v at its position "
                                         "and attend over ALL stored keys 0..position, not only "
                                         "the new one; check the slice you write to and read from.")
        prompt = tokens[:1, :6]
        out = generate(model, prompt, 12, cache=_make_cache(c, model, batch=1, max_len=18))
        expect_equal("greedy generation of 12 tokens with your cache", out,
                     generate_without_cache(model, prompt, 12),
                     hint="logits matched step by step, so look at what changes between calls: "
                          "does self.length advance after the last layer?")
    return run_check("2.1", "the KV cache (attend)", cls, KVCache, cases,
                     success="prefill and decode logits equal full recomputation, and greedy "
                             "generation is identical token for token.")


def _configs():
    return [ModelConfig.from_name(n) for n in ("tiny", "llama-2-7b", "llama-3-8b")]


def predicted_speedup(fn):
    """Exercise 2.2: ``predicted_speedup(config, context)``: FLOPs to produce the next token
    without a cache (a forward pass over all ``context`` tokens) over FLOPs with one."""
    def cases(f):
        for config in _configs():
            for n in (2, 128, 2048):
                expected = formulas.recompute_flops(config, n) / formulas.flops_per_token(config, n - 1)
                hint = ("without a cache the model runs all n tokens: n x 2 FLOPs per matmul "
                        "weight, plus causal attention over n(n+1)/2 (query, key) pairs, 4 H D "
                        "FLOPs each, per layer; with one it runs one token against n - 1 cached "
                        "ones: formulas.flops_per_token(config, n - 1).")
                expect_close(f"predicted_speedup({config.name}, {n})", f(config, n), expected,
                             rel=1e-6, hint=hint)
    return run_check("2.2", "predicted_speedup", fn,
                     lends(_reference_speedup, formulas.recompute_flops), cases,
                     success="by FLOPs the cache saves a factor of about the context length.")


def _reference_speedup(config, context):
    return formulas.recompute_flops(config, context) / formulas.flops_per_token(config, context - 1)


def cache_bytes(fn):
    """Exercise 2.3: ``cache_bytes(config, tokens, batch, dtype)`` in bytes."""
    def cases(f):
        for config in _configs():
            for tokens, batch, dtype in ((1, 1, "bfloat16"), (4096, 8, "bfloat16"),
                                         (100, 3, "float32")):
                expected = formulas.kv_bytes(config, tokens, dtype, batch)
                expect_close(f"cache_bytes({config.name}, tokens={tokens}, batch={batch}, "
                             f"{dtype})", f(config, tokens, batch, dtype), expected, rel=1e-9,
                             unit=" B",
                             hint="2 (K and V) x layers x KV heads (not query heads) x head_dim "
                                  "x bytes per element, per token per sequence.")
    return run_check("2.3", "cache_bytes", fn,
                     lends(lambda config, tokens, batch, dtype: formulas.kv_bytes(config, tokens,
                                                                                  dtype, batch),
                           formulas.kv_bytes, formulas.kv_bytes_per_token),
                     cases, success="Llama-2-7B holds 512 KiB per token in bf16.")


def pool_kv_heads(fn):
    """Exercise 2.4: ``pool_kv_heads(weight, n_kv_heads, new_kv_heads, head_dim)``."""
    def cases(f):
        gen = torch.Generator().manual_seed(13)
        for heads, new, head_dim, d in ((4, 2, 8, 16), (8, 1, 4, 12), (6, 3, 2, 5)):
            weight = torch.randn(heads * head_dim, d, generator=gen)
            expected = mean_pool_heads(weight, heads, new, head_dim)
            expect_tensor_close(f"pool_kv_heads(weight {tuple(weight.shape)}, {heads} -> {new} "
                                f"heads, head_dim={head_dim})", f(weight, heads, new, head_dim),
                                expected, atol=1e-6, rtol=1e-6,
                                hint="rows [h*D, (h+1)*D) belong to head h; average each run "
                                     "of n_kv_heads/new_kv_heads CONSECUTIVE heads (query head "
                                     "j uses KV head j // group), e.g. reshape to "
                                     "(new, group, D, d) and take the mean over dim 1.")
    return run_check("2.4", "pool_kv_heads", fn, mean_pool_heads, cases,
                     success="this is the conversion Ainslie et al. (2023) start uptraining from.")


def _reference_requests(device_memory, weight_bytes, activation_reserve, kv_bytes_per_token,
                        context):
    slots = max(device_memory - weight_bytes - activation_reserve, 0) // kv_bytes_per_token
    return int(slots // context)


def max_requests(fn):
    """Exercise 2.5: ``max_requests(device_memory, weight_bytes, activation_reserve,
    kv_bytes_per_token, context)``: whole requests that fit, 0 when none does."""
    cases_list = [
        (40 * GIB, 26 * GIB, 2 * GIB, 800 * KIB, 1),      # the paper's 15.7K token slots
        (40 * GIB, 26 * GIB, 2 * GIB, 800 * KIB, 2048),   # Orca-style max-length reservation
        (80e9, 13.5e9, 2e9, 512 * KIB, 4096),
        (80e9, 13.5e9, 2e9, 128 * KIB, 4096),
        (24e9, 26e9, 1e9, 800 * KIB, 512),                # the weights alone do not fit
    ]

    def cases(f):
        for args in cases_list:
            expected = _reference_requests(*args)
            got = f(*args)
            hint = ("free memory = device - weights - reserve; token slots = free // bytes per "
                    "token; requests = slots // context, rounded DOWN (half a request does not "
                    "run), and never negative.")
            expect_close(f"max_requests{tuple(args)}", got, expected, rel=0, abs_tol=0, hint=hint)
            if got != int(got):
                raise CheckFailed(f"max_requests returned {got}, not a whole number.")
    return run_check("2.5", "max_requests", fn, _reference_requests, cases,
                     success="12 GiB at 800 KiB per token is 15,728 slots: the paper's 15.7K.")
