"""Speculative decoding: exactness of greedy and sampled verification, prompt lookup, KV rollback
in the contiguous and the paged cache, and the formulas of ``inferlab.analysis.speculation``."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferlab.analysis import speculation
from inferlab.analysis.roofline import Roof
from inferlab.course.checks.lab06 import FALSE_ALARM, chi_square
from inferlab.model.config import ModelConfig
from inferlab.model.generate import generate
from inferlab.model.llama import build_model
from inferlab.model.speculative import (ModelDrafter, PagedTarget, PromptLookup, SpecStats,
    greedy_verify, prompt_lookup, rollback, sampling_verify, speculative_generate)
from inferlab.serving.paged_cache import BlockAllocator, BlockTable, PagedKVCache, blocks_for
from inferlab.serving.config import ServingConfig


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair():
    from inferlab.model.weights import checkpoint_path, load_checkpoint

    # float64: no rounding difference between a 1-token and a (k+1)-token pass can flip a choice
    return (load_checkpoint(checkpoint_path("course-target")).to(torch.float64),
            load_checkpoint(checkpoint_path("course-draft")).to(torch.float64))


@pytest.fixture(scope="module")
def prompt():
    from inferlab.model.corpus import held_out
    from inferlab.model.weights import checkpoint_path, load_tokenizer

    text = held_out("test")[1].text  # the draft is rejected often here
    return load_tokenizer(checkpoint_path("course-target")).encode(text[:300])[:20]


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 6, 9])
def test_greedy_speculation_equals_plain_greedy(pair, prompt, k):
    target, draft = pair
    want = generate(target, torch.tensor(prompt), 40)[0].tolist()
    got, stats = speculative_generate(target, ModelDrafter(draft), prompt, 40, k=k)
    assert got == want
    assert stats.emitted == 40
    assert all(0 <= a <= d for a, d in zip(stats.accepted, stats.drafted))
    lookup, _ = speculative_generate(target, PromptLookup(), prompt, 40, k=k)
    assert lookup == want


def test_random_draft_still_exact():
    """A draft that knows nothing (another random model) is rejected often; the output stays exact."""
    config = ModelConfig.from_name("tiny").scaled(n_layers=2, max_seq_len=128)
    target = build_model(config, seed=1).to(torch.float64)
    draft = build_model(config.scaled(n_layers=1), seed=2).to(torch.float64)
    prompt = torch.randint(0, config.vocab_size, (7,), generator=torch.Generator().manual_seed(0))
    want = generate(target, prompt, 30)[0].tolist()
    for k in (1, 3, 5):
        got, stats = speculative_generate(target, ModelDrafter(draft), prompt, 30, k=k)
        assert got == want
        assert stats.acceptance_rate < 0.5


def test_paged_rollback_is_exact_and_leaks_nothing(pair, prompt):
    target, draft = pair
    cache = PagedKVCache.for_model(target, ServingConfig(num_blocks=20, block_size=4))
    runner = PagedTarget(target, cache)
    got, stats = speculative_generate(target, ModelDrafter(draft), prompt, 40, k=5,
                                      target_cache=runner)
    assert got == generate(target, torch.tensor(prompt), 40)[0].tolist()
    assert any(a < d for a, d in zip(stats.accepted, stats.drafted))  # some were rolled back
    assert len(runner.table.blocks) == blocks_for(runner.table.num_tokens, 4)
    assert runner.table.num_tokens == len(got) - 1
    runner.table.free()
    assert cache.allocator.num_free == cache.allocator.num_blocks


def test_eos_stops_generation(pair, prompt):
    target, draft = pair
    plain = generate(target, torch.tensor(prompt), 30)[0].tolist()
    eos = plain[len(prompt) + 5]  # pretend the sixth generated token ends the sequence
    got, _ = speculative_generate(target, ModelDrafter(draft), prompt, 30, k=4, eos_token_id=eos)
    stop = plain.index(eos, len(prompt))
    assert got == plain[:stop + 1]


def test_first_token_distribution_matches_the_target(pair, prompt):
    """Sampled speculation's first token follows the target's distribution: a chi-square test
    at the stated false-alarm rate, on seeded trials, so the verdict is deterministic."""
    target, draft = pair
    temperature = 1.5  # flatter than the model, so that drafts are often rejected
    with torch.inference_mode():
        p = torch.softmax(target(torch.tensor([prompt]))[0, -1] / temperature, dim=-1)
    counts = torch.zeros_like(p)
    rejected = 0
    for seed in range(300):
        out, stats = speculative_generate(target, ModelDrafter(draft), prompt, 3, k=2,
                                          temperature=temperature, seed=seed)
        counts[out[len(prompt)]] += 1
        rejected += stats.accepted[0] == 0
    _, _, p_value = chi_square(counts, p)
    assert p_value >= FALSE_ALARM
    assert rejected > 20  # the residual distribution was exercised


def test_sampling_verify_matches_p_and_the_buggy_rule_does_not():
    p = torch.tensor([[0.1, 0.6, 0.3], [0.3, 0.3, 0.4]], dtype=torch.float64)
    q = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    good = torch.zeros(3)
    naive = torch.zeros(3)  # keeping every draft gives q, not p
    for _ in range(3000):
        d = torch.multinomial(q, 1, generator=gen).squeeze(-1)
        good[sampling_verify(p, q, d, gen)[0]] += 1
        naive[int(d)] += 1
    assert chi_square(good, p[0])[2] >= FALSE_ALARM
    assert chi_square(naive, p[0])[2] < FALSE_ALARM


def test_greedy_verify_rows():
    logits = torch.nn.functional.one_hot(torch.tensor([2, 0, 1]), 4).double()
    assert greedy_verify(logits, torch.tensor([2, 0])) == [2, 0, 1]
    assert greedy_verify(logits, torch.tensor([2, 3])) == [2, 0]
    assert greedy_verify(logits[:1], torch.tensor([], dtype=torch.long)) == [2]


def test_prompt_lookup():
    assert prompt_lookup([1, 2, 3, 9, 1, 2, 3], 3) == [9, 1, 2]
    assert prompt_lookup([4, 4, 4], 4) == [4, 4, 4, 4]
    assert prompt_lookup([1, 2, 3], 4) == []
    assert prompt_lookup([5, 6, 1, 5, 6, 2, 5, 6], 1) == [2]
    assert prompt_lookup([1], 3) == []


def test_stats():
    s = SpecStats(drafted=[4, 4, 4, 2], accepted=[4, 1, 0, 2])
    assert s.emitted == 7 + 4
    assert s.tested == 4 + 2 + 1 + 2
    assert s.acceptance_rate == pytest.approx(7 / 9)
    assert s.tokens_per_verification(4) == pytest.approx((5 + 2 + 1) / 3)


def test_rollback_contiguous_cache_refuses_growth():
    from inferlab.model.kv_cache import KVCache

    cache = KVCache(1, 1, 1, 8, 2)
    cache.length = 5
    rollback(cache, 3)
    assert cache.length == 3
    with pytest.raises(ValueError):
        rollback(cache, 4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 8), st.integers(0, 8)),
                min_size=1, max_size=120),
       st.sampled_from([1, 2, 4, 16]))
def test_truncate_after_many_rejections_leaks_no_block(rounds, block_size):
    """Random verifications on several tables (two share blocks by a fork): after each, every
    table holds exactly the blocks of its tokens and the allocator's counts match the tables."""
    alloc = BlockAllocator(4096)
    tables = [BlockTable(alloc, block_size) for _ in range(3)]
    tables[0].append(5)
    tables.append(tables[0].fork())
    for which, k, kept in rounds:
        t = tables[which]
        before = t.num_tokens
        t.append(k + 1)
        t.truncate(before + min(kept, k) + 1)
        assert t.num_tokens == before + min(kept, k) + 1
        assert len(t.blocks) == blocks_for(t.num_tokens, block_size)
        assert sum(alloc.refcount(b) for b in range(alloc.num_blocks)) == \
            sum(len(x.blocks) for x in tables)
    for t in tables:
        t.free()
    assert alloc.num_free == alloc.num_blocks


def test_truncate_refuses_growth():
    t = BlockTable(BlockAllocator(4), 2)
    t.append(3)
    with pytest.raises(ValueError):
        t.truncate(4)


# The formulas


@pytest.mark.parametrize("a, k", [(0.0, 3), (0.3, 1), (0.6, 4), (0.9, 10), (1.0, 6)])
def test_expected_tokens_is_the_geometric_sum(a, k):
    assert speculation.expected_tokens(a, k) == pytest.approx(sum(a ** i for i in range(k + 1)))


def test_expected_tokens_by_simulation():
    """Drafts accepted independently with probability a, up to the first rejection."""
    gen = torch.Generator().manual_seed(0)
    a, k, n = 0.7, 4, 20000
    kept = (torch.rand(n, k, generator=gen) < a).int().cumprod(dim=1).sum(dim=1)
    assert float((kept + 1).double().mean()) == pytest.approx(speculation.expected_tokens(a, k),
                                                              rel=0.02)


def test_speedup_and_best_k():
    # Leviathan et al.'s Theorem 3.8 at a = 0.8, c = 0.05, k = 5 (their Figure 3 area).
    assert speculation.speedup(0.8, 5, 0.05) == pytest.approx((1 - 0.8 ** 6) / 0.2 / 1.25)
    assert speculation.speedup(0.5, 0, 0.3) == 1.0
    assert speculation.best_k(0.0, 0.1) == 0  # nothing is ever accepted
    assert speculation.best_k(0.9, 0.01) > speculation.best_k(0.6, 0.01) > 0
    k = speculation.best_k(0.8, 0.1)
    assert all(speculation.speedup(0.8, k, 0.1) >= speculation.speedup(0.8, j, 0.1)
               for j in range(20))


def test_acceptance_needed_inverts_speedup():
    a = speculation.acceptance_needed(1.5, 3, 0.3)
    assert speculation.speedup(a, 3, 0.3) == pytest.approx(1.5, rel=1e-9)
    assert speculation.acceptance_needed(10, 3, 0.3) == math.inf


def test_batched_speedup_falls_to_a_crossover_near_the_critical_batch():
    from inferlab.analysis import formulas
    from inferlab.analysis.step_time import StepModel

    config = ModelConfig.from_name("llama-2-7b")
    roof = Roof("H100", 989e12, 3.35e12)
    target = StepModel.for_roof(config, roof.peak_flops, roof.bandwidth)
    a, k, c = 0.8, 4, 0.05
    assert speculation.batched_speedup(target, 1, a, k, c) == \
        pytest.approx(speculation.speedup(a, k, c), rel=1e-3)
    b = speculation.crossover_batch(target, a, k, c)
    critical = formulas.critical_batch_size(roof.peak_flops, roof.bandwidth)
    assert critical / (k + 1) < b < critical  # verification turns compute-bound first
    assert speculation.batched_speedup(target, b, a, k, c) <= 1 < \
        speculation.batched_speedup(target, b - 1, a, k, c)


def test_long_contexts_keep_speculation_paying_at_batch():
    """The cache reads batching cannot share keep a large batch memory-bound (MagicDec's
    regime): at 4,000 tokens of context the crossover moves far past the short-context one."""
    from inferlab.analysis.step_time import StepModel

    target = StepModel.for_device(ModelConfig.from_name("llama-2-7b"), "H100 SXM")
    short = speculation.crossover_batch(target, 0.8, 4, 0.05)
    long = speculation.crossover_batch(target, 0.8, 4, 0.05, context=4000)
    assert long is None or long > 4 * short
    assert speculation.batched_speedup(target, 256, 0.8, 4, 0.05, context=4000) > 1


def test_speculation_at_batch_depends_on_the_attention_layout():
    """Chapter 6's per-layout conclusion, counted kernel by kernel. Under MHA and GQA a
    verification reads each sequence's cache once for its k + 1 tokens (attention stays
    memory-bound and costs what the plain step's does), so at a long context speculation still
    pays at a batch far past B*/(k + 1). Under MLA with DeepSeek-V3's 128 heads over a shared
    latent, k + 1 queries make attention compute-bound, it costs several times the plain step's,
    and the gain is gone at a smaller batch the longer the context."""
    from dataclasses import replace

    from inferlab.analysis import mla
    from inferlab.analysis.moe import moe_presets
    from inferlab.analysis.step_time import StepModel

    cfg = ModelConfig.from_name("llama-2-7b")
    latent = replace(moe_presets()["deepseek-v3"].mla, n_layers=cfg.n_layers, d_model=cfg.d_model)
    mha = StepModel.for_device(cfg, "H100 SXM")
    gqa = StepModel.for_device(cfg.with_kv_heads(8), "H100 SXM")
    mla_model = StepModel.for_device(cfg, "H100 SXM", attention=mla.attention_cost(latent))
    for model in (mha, gqa):
        plain = speculation.pass_kernels(model, 1, 2000, 48)["attention"]
        verify = speculation.pass_kernels(model, 5, 2000, 48)["attention"]
        assert verify.bound == plain.bound == "memory"
        assert verify.seconds == pytest.approx(plain.seconds, rel=0.01)
        assert speculation.crossover_batch(model, 0.8, 4, 0.05, 2000, max_batch=200) is None
    plain = speculation.pass_kernels(mla_model, 1, 2000, 48)["attention"]
    verify = speculation.pass_kernels(mla_model, 5, 2000, 48)["attention"]
    assert verify.bound == "compute" and verify.seconds > 3 * plain.seconds
    stops = [speculation.crossover_batch(mla_model, 0.8, 4, 0.05, ctx) for ctx in (500, 8000)]
    assert stops[1] < stops[0] < speculation.crossover_batch(mha, 0.8, 4, 0.05)


def test_the_speculating_batch_is_bound_by_both_caches_at_their_peak():
    """max_batch counts context + k + 1 slots of the target's and the draft's K/V in the
    engine's share of memory, beside both models' weights: one more sequence would not fit."""
    from inferlab.analysis import formulas

    cfg = ModelConfig.from_name("llama-2-7b")
    memory, weights, kv = 80e9, formulas.weight_bytes(cfg), formulas.kv_bytes_per_token(cfg)
    for context in (100, 2000):
        b = speculation.max_batch(memory, weights, kv, context, 4, draft=0.05, utilization=0.92)
        used = lambda n: 1.05 * weights + n * (context + 5) * 1.05 * kv  # noqa: E731
        assert used(b) <= 0.92 * memory < used(b + 1)
    # the plain bound (no draft, no k + 1 slots, the whole memory) admits more
    assert b < speculation.max_batch(memory, weights, kv, 2000, 0)
    assert speculation.max_batch(memory, memory, kv, 2000, 4) == 0
    with pytest.raises(ValueError):
        speculation.max_batch(memory, weights, kv, 2000, 4, utilization=1.5)


def test_a_verification_pass_prices_its_tokens_kernel_by_kernel():
    from inferlab.analysis.step_time import Shape, StepModel

    target = StepModel.for_device(ModelConfig.from_name("llama-2-7b"), "H100 SXM")
    # 8 sequences x (k + 1 = 5) tokens after 100 cached: logits at all 40 positions, 8 cache reads
    t = speculation.pass_seconds(target, 5, 100, batch=8)
    shape = Shape(tokens=40, rows=40, pairs=8 * (5 * 100 + 15), kv_read=8 * 105, kv_written=40)
    assert t == pytest.approx(target.seconds(shape))


def test_a_draft_of_its_own_shape_reads_its_own_cache():
    """Llama-3.2-1B drafting for Llama-3-8B: a sixth of the weights, a quarter of the cache per
    token. Each round's parts are the step-time model's passes, and at a long context and a
    large batch the draft's cache reads, which the 'c times the target' shortcut scales with its
    weights, take the gain away."""
    from inferlab.analysis import formulas
    from inferlab.analysis.step_time import StepModel

    t_cfg, d_cfg = ModelConfig.from_name("llama-3-8b"), ModelConfig.from_name("llama-3.2-1b")
    assert formulas.kv_bytes_per_token(d_cfg) / formulas.kv_bytes_per_token(t_cfg) == 0.25
    target = StepModel.for_device(t_cfg, "H100 SXM")
    draft = StepModel.for_device(d_cfg, "H100 SXM")
    r = speculation.spec_round(target, 64, 0.7, 4, draft, 1000, round_overhead_s=2e-4)
    assert r.draft_s == pytest.approx(4 * speculation.pass_seconds(draft, 1, 1000, 64))
    assert r.verify_s == pytest.approx(speculation.pass_seconds(target, 5, 1000, 64))
    assert r.plain_s == pytest.approx(speculation.pass_seconds(target, 1, 1000, 64))
    assert r.round_s == pytest.approx(r.draft_s + r.verify_s + 2e-4)
    assert r.tokens == pytest.approx(64 * speculation.expected_tokens(0.7, 4))
    assert r.speedup == pytest.approx(r.plain_s / 64 / (r.round_s / r.tokens))
    # the overhead costs gain; a number c keeps the old meaning (c times every weight and cache)
    plain = speculation.batched_speedup(target, 64, 0.7, 4, draft, 1000)
    assert r.speedup < plain
    c = draft.weight_bytes_read() / target.weight_bytes_read()
    assert speculation.batched_speedup(target, 64, 0.7, 4, c, 1000) == pytest.approx(
        speculation.batched_speedup(target, 64, 0.7, 4, target.scaled(c), 1000))
    # the shortcut with the draft's weight share undercounts its cache, and flatters at batch
    big = dict(batch=256, a=0.7, k=4, context=1000)
    own = speculation.batched_speedup(target, draft=draft, **big)
    assert speculation.batched_speedup(target, draft=c, **big) > own
    assert own < 1 < speculation.batched_speedup(target, 1, 0.7, 4, draft, 1000)
    with pytest.raises(ValueError):
        speculation.spec_round(target, 8, 0.7, 4, draft, round_overhead_s=-1)


@pytest.mark.parametrize("bad", [dict(a=1.2, k=2), dict(a=0.5, k=-1), dict(a=0.5, k=1.5)])
def test_formulas_refuse_bad_input(bad):
    with pytest.raises(ValueError):
        speculation.expected_tokens(**bad)


def test_prompt_lookup_earliest_and_latest_rules():
    """Issue 24 item 20: the reference implementation and Hugging Face take the earliest match;
    the course takes the latest and may copy past the end of the text."""
    from inferlab.model.speculative import lookup_agreement, prompt_lookup
    toks = [1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    assert prompt_lookup(toks, 2, prefer="earliest") == [9, 1]   # after the first "1 2 3"
    assert prompt_lookup(toks, 2, prefer="latest") == [7, 5]     # after the latest one
    period = [4, 5, 4, 5, 4]
    assert prompt_lookup(period, 4, prefer="latest") == [5, 4, 5, 4]   # copies past the end
    assert prompt_lookup(period, 4, prefer="earliest") == [5, 4]       # cut at the end
    with pytest.raises(ValueError, match="prefer"):
        prompt_lookup(toks, 2, prefer="middle")
    # on a periodic text every drafted token is right until the text ends
    text = [1, 2] * 20
    assert lookup_agreement(text, k=4, prefer="latest", start=4) == pytest.approx(
        sum(min(4, len(text) - t) for t in range(4, len(text) - 1)) / (len(text) - 5))
