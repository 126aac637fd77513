"""Tests of the reservation-policy simulation, copy-on-write savings and prefix caching."""

from __future__ import annotations

import pytest

from inferlab.serving.paged_cache import BlockAllocator, OutOfBlocksError
from inferlab.serving.prefix_cache import PrefixCache, block_hashes
from inferlab.sim.memory_sim import prefix_sharing_experiment
from inferlab.serving.request import longest_tokens
from inferlab.serving.reservation import RESERVATIONS, FirstFit, slots_held
from inferlab.sim import memory_sim, traces


def test_slots_held_per_policy():
    # A request with a 100-token prompt that stores 300 tokens at its longest
    # (longest_tokens(100, 201) == 300), 150 of them so far.
    f = slots_held
    assert longest_tokens(100, 201) == 300
    assert f("max_length", 300, 150, max_len=2048) == 2048
    assert f("power_of_two", 300, 150) == 512
    assert f("power_of_two", 256, 100) == 256  # exactly a power of two
    assert f("power_of_two", 2000, 1000, max_len=2048) == 2048
    assert f("exact", 300, 150) == 300
    assert f("paged", 300, 150, block_size=16) == 160
    assert f("paged", 300, 160, block_size=16) == 160
    with pytest.raises(ValueError):
        f("exact", 300, 301)
    with pytest.raises(ValueError):
        f("buddy", 1, 1)


def test_first_fit_merges_holes():
    ff = FirstFit(10)
    a, b, c = ff.allocate(3), ff.allocate(3), ff.allocate(3)
    assert (a, b, c) == (0, 3, 6) and ff.allocate(2) is None
    ff.free(a, 3), ff.free(c, 3)
    assert ff.allocate(4) == 6  # the hole at 0 is too small: external fragmentation
    ff.free(6, 4), ff.free(b, 3)
    assert ff.holes == [(0, 10)]


def test_simulation_accounts_for_every_slot_and_orders_policies():
    rows = traces.sharegpt_like(150)
    results = {p: memory_sim.simulate_memory(rows, p, capacity=8192) for p in RESERVATIONS}
    for r in results.values():
        total = r.token_fraction + r.reserved_fraction + r.internal_fraction + r.free_fraction
        assert total == pytest.approx(1.0)
    tok = [results[p].token_fraction for p in RESERVATIONS]
    run = [results[p].mean_running for p in RESERVATIONS]
    assert tok == sorted(tok) and run == sorted(run)  # max < pow2 < exact < paged
    assert results["max_length"].mean_running == pytest.approx(4.0)  # 8192 // 2048
    assert results["paged"].token_fraction > 0.9
    assert results["paged"].reserved_fraction == 0


def test_sharing_saving():
    # One sample shares nothing.
    assert memory_sim.sharing_saving(32, 10, 1) == 0
    # Prompt of exactly 2 blocks, 4 samples, 1 output token each: without sharing each step holds
    # 4 x 3 blocks; with sharing 2 + 4 x 1.
    assert memory_sim.sharing_saving(32, 1, 4, block_size=16) == pytest.approx(1 - 6 / 12)
    # A half-filled shared block is copied on write by all but the last writer.
    assert memory_sim.sharing_saving(24, 1, 2, block_size=16) == pytest.approx(1 - 3 / 4)


def test_prefix_cache_reuses_full_blocks_only():
    alloc = BlockAllocator(20)
    cache = PrefixCache(alloc, block_size=4)
    a = list(range(10))  # two full blocks and a partial one
    t1, cached = cache.allocate_prompt(a)
    assert cached == 0
    cache.insert(t1, a)
    assert len(cache) == 2
    b = list(range(8)) + [99, 98, 97]
    t2, cached = cache.allocate_prompt(b)
    assert cached == 8 and t2.blocks[:2] == t1.blocks[:2] and t2.blocks[2] != t1.blocks[2]
    assert alloc.refcount(t1.blocks[0]) == 3  # t1, t2 and the cache
    c = [5] + list(range(1, 10))  # differs in the first token: the chain never matches
    t3, cached = cache.allocate_prompt(c)
    assert cached == 0
    t1.free(), t2.free(), t3.free()
    assert alloc.num_free == 20 - 2  # the cache still holds two blocks
    assert cache.evict(5) == 2 and alloc.num_free == 20
    assert block_hashes([1, 2, 3, 4, 5], 4) == block_hashes([1, 2, 3, 4], 4)


def test_prefix_cache_evicts_when_full_and_fails_cleanly():
    alloc = BlockAllocator(4)
    cache = PrefixCache(alloc, block_size=2)
    t, _ = cache.allocate_prompt([1, 2, 3, 4, 5, 6])
    cache.insert(t, [1, 2, 3, 4, 5, 6])
    t.free()
    t2, _ = cache.allocate_prompt([9, 9, 9, 9, 9, 9, 9])  # needs all 4: evicts cached blocks
    assert len(t2.blocks) == 4
    with pytest.raises(OutOfBlocksError):
        cache.allocate_prompt([7, 7, 7])
    t2.free()
    assert alloc.num_free + len(cache) == 4


def test_prefix_experiment_saves_the_shared_prompt():
    out = prefix_sharing_experiment([16] * 20, system_len=64, block_size=16)
    # Each later request finds the system prompt's 4 blocks; its own 16 tokens (minus the last)
    # make no full block of their own; the first request finds nothing.
    assert out["hit_rate"] == pytest.approx(19 * 4 / (20 * 4))
    assert out["prefill_saved"] == pytest.approx(19 * 64 / (20 * 80))


def test_paged_run_counts_every_recomputed_token(monkeypatch):
    # Every prompt is computed once; each preemption adds, on readmission, the tokens the
    # sequence held when it was preempted (prompt and output so far), and nothing else.
    from inferlab.serving.scheduler import Scheduler

    held_at_preemption = []
    original = Scheduler.preempt

    def counting(self, seq):
        held_at_preemption.append(seq.num_tokens)
        original(self, seq)

    monkeypatch.setattr(Scheduler, "preempt", counting)
    rows = traces.sharegpt_like(150)
    r = memory_sim.simulate_memory(rows, "paged", capacity=4096)
    assert r.preemptions == len(held_at_preemption) > 0
    assert r.prompt_tokens == sum(x.prompt_len for x in rows)
    assert r.recomputed_tokens == sum(held_at_preemption)
    for p in ("max_length", "exact"):  # reserved up front: no preemption, no recompute
        c = memory_sim.simulate_memory(rows, p, capacity=4096)
        assert c.preemptions == 0 and c.prefill_tokens == c.prompt_tokens


def test_priced_run_charges_the_recomputes():
    from inferlab.analysis.step_time import StepModel
    from inferlab.model.config import ModelConfig

    model = StepModel.for_device(ModelConfig.from_name("llama-2-13b"), "A100 40GB SXM", "fp16")
    rows = traces.sharegpt_like(150)
    r = memory_sim.simulate_memory(rows, "paged", capacity=4096, step_model=model)
    assert r.preemptions > 0 and 0 < r.recompute_s < r.window_s
    assert r.tokens_per_s == pytest.approx(r.window_tokens / r.window_s)
    # the same steps, only the prices change: a slower attention kernel costs more time
    slow = memory_sim.simulate_memory(rows, "paged", capacity=4096,
                                      step_model=memory_sim.slower_attention(model, 2))
    assert slow.window_tokens == r.window_tokens and slow.window_s > r.window_s
    assert memory_sim.simulate_memory(rows, "paged", capacity=4096).tokens_per_s == 0
