"""The second KV tier: evicted prefix blocks go down and come back on a hit with the same
contents, so a hit served from the tier generates what recomputing would; it counts what it
moved; it forgets the least recently used block first."""

import pytest
import torch

from course_server import model_and_tokenizer
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine
from inferlab.serving.kv_tier import FileTier, HostTier
from inferlab.serving.paged_cache import BlockManager, PagedKVCache
from inferlab.serving.request import Request

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_pool(num_blocks=4):
    pool = PagedKVCache(2, 2, 8, BlockManager(num_blocks, 4))
    for t in pool.pools:
        t.copy_(torch.randn(t.shape))
    return pool


@pytest.mark.parametrize("kind", [HostTier, FileTier])
def test_a_block_comes_back_with_its_contents_and_the_oldest_goes_first(kind):
    pool = small_pool()
    tier = kind(2, pool)
    before = [t[:, 1].clone() for t in pool.pools]
    tier.store(11, pool, 1)
    tier.store(12, pool, 2)
    tier.store(13, pool, 3)  # full: 11, the least recently used, is forgotten
    assert 11 not in tier and 12 in tier and 13 in tier and tier.dropped == 1
    assert not tier.load(11, pool, 0) and tier.misses == 1
    tier.store(11, pool, 1)  # back in; 12 is now the oldest
    for t in pool.pools:
        t[:, 0].zero_()
    assert tier.load(11, pool, 0)
    assert all(torch.equal(t[:, 0], b) for t, b in zip(pool.pools, before))
    block_bytes = sum(t[:, 0].numel() * t.element_size() for t in pool.pools)
    assert tier.bytes_loaded == block_bytes and tier.bytes_stored == 4 * block_bytes


def run(tier_blocks, prompts, num_blocks):
    model, _ = model_and_tokenizer()
    config = ServingConfig(num_blocks=num_blocks, max_batch=2, token_budget=64, policy="chunked",
                           kv_tier_blocks=tier_blocks)
    engine = Engine(model, config, prefix_cache=True)
    # one after another, so each prompt's blocks are cached before the next arrives
    results = [engine.run([Request(tuple(p), 4)]).results[0].tokens for p in prompts]
    return results, engine


def test_a_hit_from_the_tier_generates_what_recomputing_does():
    g = torch.Generator().manual_seed(3)
    system = torch.randint(3, 1000, (48,), generator=g).tolist()      # 3 blocks of 16
    other = [torch.randint(3, 1000, (60,), generator=g).tolist() for _ in range(3)]
    prompts = [system + [5, 6, 7], *other, system + [8, 9, 10]]  # the others evict the system
    with_tier, engine = run(16, prompts, num_blocks=12)
    without, plain = run(None, prompts, num_blocks=12)
    assert with_tier == without
    tier, pool_hits = engine.tier, engine.cache.memory.cache.hits
    # the last prompt reuses all three of the system prompt's blocks: those the pool evicted
    # come back from the tier; without it, they were computed again
    assert tier.hits >= 1 and pool_hits + tier.hits == 3
    # without it the chain breaks at the first block the pool evicted: fewer are reused
    assert plain.tier is None and plain.cache.memory.cache.hits < 3
    assert tier.bytes_loaded == tier.hits * tier.slot_bytes


def test_a_tier_needs_the_prefix_cache():
    model, _ = model_and_tokenizer()
    with pytest.raises(ValueError, match="prefix_cache"):
        Engine(model, ServingConfig(num_blocks=8, kv_tier_blocks=4))


def test_the_server_exports_what_the_tier_moved():
    import httpx

    from course_server import NAME, start

    config = ServingConfig(num_blocks=12, max_batch=2, token_budget=64, policy="chunked",
                           kv_tier_blocks=16)
    srv, engine = start(config, prefix_cache=True, stats_interval_s=0)
    g = torch.Generator().manual_seed(4)
    system = torch.randint(3, 1000, (48,), generator=g).tolist()
    prompts = [system + [5], *[torch.randint(3, 1000, (60,), generator=g).tolist()
                               for _ in range(3)], system + [6]]
    with srv:
        for p in prompts:  # one at a time, as above
            r = httpx.post(srv.url + "/v1/completions", timeout=60,
                           json={"model": NAME, "prompt": p, "max_tokens": 2})
            assert r.status_code == 200, r.text
        metrics = httpx.get(srv.url + "/metrics").text
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("inferlab_kv_tier_")}
    assert values["inferlab_kv_tier_hits"] == engine.tier.hits >= 1
    assert values["inferlab_kv_tier_bytes_loaded"] == engine.tier.hits * engine.tier.slot_bytes


def test_the_reload_benchmark_moves_every_block_of_the_prefix():
    from inferlab.benchmarks.kv_tier import measure

    model, _ = model_and_tokenizer()
    r = measure(model, 32)
    c = model.config
    per_block = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 16 * model.dtype.itemsize
    assert r["tokens"] == 32 and r["bytes"] == 2 * per_block
    assert r["reload_s"] > 0 and r["prefill_s"] > 0
