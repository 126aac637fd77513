"""Tests of the paged KV cache: allocator, block tables, copy-on-write, paged attention."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferlab.model.kv_cache import KVCache
from inferlab.model.llama import build_model
from inferlab.serving import paged_triton
from inferlab.serving.paged_cache import (BlockAllocator, BlockStateError, BlockTable,
    OutOfBlocksError, PagedKVCache)
from inferlab.serving.config import ServingConfig
from inferlab.course.checks.lab03 import gather_index, gather_kv  # the lab's reference


def paged_cache(model, num_blocks, block_size, **kw):
    return PagedKVCache.for_model(model, ServingConfig(num_blocks=num_blocks,
                                                       block_size=block_size), **kw)

# ---------------------------------------------------------------------------- the allocator


def test_allocator_counts_and_free_list():
    a = BlockAllocator(3)
    assert (a.num_blocks, a.num_free) == (3, 3)
    b0, b1 = a.allocate(), a.allocate()
    assert b0 != b1 and a.num_free == 1 and a.refcount(b0) == 1
    assert a.fork(b0) == b0 and a.refcount(b0) == 2
    a.free(b0)
    assert a.refcount(b0) == 1 and a.num_free == 1  # still owned once
    a.free(b0)
    assert a.refcount(b0) == 0 and a.num_free == 2
    assert a.can_allocate(2) and not a.can_allocate(3)


def test_allocator_errors_are_specific():
    a = BlockAllocator(2)
    a.allocate(), a.allocate()
    with pytest.raises(OutOfBlocksError):
        a.allocate()
    a.free(0)
    with pytest.raises(BlockStateError, match="free"):
        a.free(0)  # double free
    with pytest.raises(BlockStateError):
        a.free(7)  # unknown block
    with pytest.raises(BlockStateError):
        a.fork(0)  # forking a free block
    with pytest.raises(ValueError):
        BlockAllocator(0)
    assert issubclass(OutOfBlocksError, RuntimeError)


# ---------------------------------------------------------------------------- block tables


def test_append_allocates_only_at_block_boundaries():
    a = BlockAllocator(8)
    t = BlockTable(a, block_size=4)
    assert t.blocks_needed(1) == 1
    t.append(1)
    assert len(t.blocks) == 1 and t.num_tokens == 1
    for n in range(2, 5):
        assert t.blocks_needed(1) == 0
        t.append(1)
    assert len(t.blocks) == 1 and t.num_tokens == 4
    t.append(1)
    assert len(t.blocks) == 2
    t.append(7)  # 12 tokens: 3 blocks
    assert len(t.blocks) == 3 and t.num_tokens == 12 and a.num_free == 5


def test_append_that_cannot_fit_changes_nothing():
    a = BlockAllocator(3)
    t = BlockTable(a, block_size=4)
    t.append(6)
    before = (list(t.blocks), t.num_tokens, a.num_free)
    assert not t.can_append(9)
    with pytest.raises(OutOfBlocksError):
        t.append(9)  # needs 2 more blocks, 1 is free
    assert (list(t.blocks), t.num_tokens, a.num_free) == before
    t.append(2)  # fits in the last block and one new one
    assert t.num_tokens == 8 and a.num_free == 1


def test_slot_mapping():
    a = BlockAllocator(8)
    a.allocate(), a.allocate()  # make the table's blocks non-trivial
    t = BlockTable(a, block_size=4)
    t.append(10)  # blocks 2, 3, 4
    slots = t.slot_mapping(torch.arange(10))
    expected = [b * 4 + o for b in t.blocks for o in range(4)][:10]
    assert slots.tolist() == expected
    assert t.slot_mapping(torch.tensor([[0, 9]])).shape == (1, 2)
    with pytest.raises(IndexError):
        t.slot_mapping(torch.tensor([12]))


def test_fork_shares_then_copy_on_write():
    a = BlockAllocator(8)
    parent = BlockTable(a, block_size=4)
    parent.append(6)  # one full block, one half-filled
    shared = parent.blocks[1]
    child = parent.fork()
    assert child.blocks == parent.blocks and a.refcount(shared) == 2
    assert child.blocks_needed(1) == 1  # the shared half block must be copied
    child.append(1)
    assert child.blocks[0] == parent.blocks[0]  # the full block stays shared
    assert child.blocks[1] != shared and a.refcount(shared) == 1
    assert a.take_copies() == [(shared, child.blocks[1])] and a.take_copies() == []
    assert parent.blocks_needed(1) == 0  # sole owner again: writes in place
    parent.append(1)
    assert parent.blocks[1] == shared and a.pending_copies == []
    child.free(), parent.free()
    assert a.num_free == 8


def test_fork_of_full_block_needs_no_copy():
    a = BlockAllocator(4)
    parent = BlockTable(a, block_size=4)
    parent.append(4)
    child = parent.fork()
    child.append(1)
    assert not a.pending_copies and child.blocks[0] == parent.blocks[0]


# --------------------------------------------------- property test: random allocator programs

_ops = st.lists(st.tuples(st.sampled_from(["new", "append", "append", "fork", "free", "step"]),
                          st.integers(0, 3), st.integers(0, 6)), min_size=10, max_size=40)


def _check_invariants(alloc: BlockAllocator, tables: list[BlockTable]) -> None:
    owners = Counter()
    for t in tables:
        assert len(set(t.blocks)) == len(t.blocks), "a table holds one block twice"
        assert len(t.blocks) == -(-t.num_tokens // t.block_size), "table has wrong block count"
        owners.update(t.blocks)
    for block in range(alloc.num_blocks):
        assert alloc.refcount(block) == owners[block], f"refcount of block {block} is wrong"
    assert alloc.num_free == alloc.num_blocks - len(owners), "a block leaked or is double-free"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          database=None)
@given(ops=_ops, block_size=st.sampled_from([1, 2, 4, 8]), num_blocks=st.integers(1, 24))
def test_random_programs_keep_ownership_and_contents_consistent(ops, block_size, num_blocks):
    """Random allocate/append/fork/free: counts stay consistent, nothing leaks, and every table
    reads back its own tokens from a fake one-number-per-slot pool.

    As in the engine, appends only reserve room; a "step" (a forward pass) first runs the queued
    copy-on-write copies (what PagedKVCache.bind does), then writes every reserved token.
    """
    alloc = BlockAllocator(num_blocks)
    pool = torch.full((num_blocks * block_size,), -1)  # one "K/V" number per slot
    tables: list[BlockTable] = []
    contents: list[list[int]] = []  # every token a table holds, written or not
    written: list[int] = []         # how many of them a step has written
    next_token = 0

    def step():
        for src, dst in alloc.take_copies():
            pool[dst * block_size:(dst + 1) * block_size] = \
                pool[src * block_size:(src + 1) * block_size].clone()
        for i, t in enumerate(tables):
            todo = torch.arange(written[i], len(contents[i]))
            if len(todo):
                pool[t.slot_mapping(todo)] = torch.tensor(contents[i][written[i]:])
            written[i] = len(contents[i])
        for t, c in zip(tables, contents):
            if c:
                assert pool[t.slot_mapping(torch.arange(len(c)))].tolist() == c

    for op, pick, n in ops:
        if op == "new" or not tables:
            tables.append(BlockTable(alloc, block_size))
            contents.append([]), written.append(0)
            continue
        i = pick % len(tables)
        t = tables[i]
        if op == "append":
            before = (list(t.blocks), t.num_tokens, alloc.num_free)
            try:
                t.append(n)
            except OutOfBlocksError:
                assert (list(t.blocks), t.num_tokens, alloc.num_free) == before
                continue
            contents[i] = contents[i] + list(range(next_token, next_token + n))
            next_token += n
        elif op == "fork":
            step()  # the engine forks a sequence whose K/V are computed
            tables.append(t.fork())
            contents.append(list(contents[i])), written.append(written[i])
        elif op == "free":
            t.free()
            tables.pop(i), contents.pop(i), written.pop(i)
        else:
            step()
        _check_invariants(alloc, tables)
    step()
    for t in tables:
        t.free()
    assert alloc.num_free == num_blocks and all(alloc.refcount(b) == 0 for b in range(num_blocks))


# ------------------------------------------------------------ paged attention vs contiguous

def _scatter_tables(lengths, block_size, num_blocks, seed):
    """Tables for ``lengths`` whose blocks are scattered over the pool in a random order."""
    alloc = BlockAllocator(num_blocks)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_blocks, generator=g).tolist()
    alloc._free.clear()
    alloc._free.extend(order)  # hand blocks out in a shuffled order
    tables = []
    for n in lengths:
        t = BlockTable(alloc, block_size)
        t.append(n)
        tables.append(t)
    return tables


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 70), min_size=1, max_size=5),
       block_size=st.sampled_from([1, 4, 16]), group=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**16))
def test_gathered_attention_equals_contiguous_sdpa(lengths, block_size, group, seed):
    K, D = 2, 8
    H = K * group
    num_blocks = sum(-(-n // block_size) for n in lengths) + 3
    tables = _scatter_tables(lengths, block_size, num_blocks, seed)
    g = torch.Generator().manual_seed(seed)
    pool_k = torch.randn(num_blocks * block_size, K, D, generator=g)
    pool_v = torch.randn(num_blocks * block_size, K, D, generator=g)
    q = torch.randn(len(lengths), H, 1, D, generator=g)
    idx = gather_index(tables, lengths)
    mask = (torch.arange(max(lengths)) < torch.tensor(lengths)[:, None])[:, None, None]
    out = F.scaled_dot_product_attention(q, gather_kv(pool_k, idx), gather_kv(pool_v, idx),
                                         attn_mask=mask, enable_gqa=group > 1)
    for b, (t, n) in enumerate(zip(tables, lengths)):  # oracle: each row on its own
        slots = t.slot_mapping(torch.arange(n))
        k, v = pool_k[slots].transpose(0, 1)[None], pool_v[slots].transpose(0, 1)[None]
        ref = F.scaled_dot_product_attention(q[b:b + 1], k, v, enable_gqa=group > 1)
        torch.testing.assert_close(out[b:b + 1], ref, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny", seed=0)


def _contiguous_logits(model, prompt, next_token):
    cache = KVCache.for_model(model, 1, max_len=len(prompt) + 1)
    model(prompt[None], torch.arange(len(prompt)), cache)
    return model(next_token.view(1, 1), torch.tensor([len(prompt)]), cache)[0, -1]


@torch.inference_mode()
def test_paged_ragged_decode_equals_per_sequence_contiguous(tiny):
    torch.manual_seed(0)
    lengths = [5, 33, 17, 1, 48]
    prompts = [torch.randint(0, 512, (n,)) for n in lengths]
    cache = paged_cache(tiny, num_blocks=40, block_size=16, use_triton=False)
    tables = []
    for p in reversed(prompts):  # prefill one at a time, in a different order: scattered blocks
        t = cache.new_table()
        t.append(len(p))
        cache.bind([t])
        tiny(p[None], torch.arange(len(p))[None], cache)
        tables.insert(0, t)
    nxt = torch.randint(0, 512, (len(lengths),))
    for t in tables:
        t.append(1)
    cache.bind(tables)
    logits = tiny(nxt[:, None], torch.tensor(lengths)[:, None], cache)[:, -1]
    ref = torch.stack([_contiguous_logits(tiny, p, x) for p, x in zip(prompts, nxt)])
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_chunked_prefill_and_forked_decode(tiny):
    """A prompt prefilled in two chunks, forked into two samples that decode differently."""
    torch.manual_seed(1)
    prompt = torch.randint(0, 512, (21,))
    cache = paged_cache(tiny, num_blocks=8, block_size=8, use_triton=False)
    t = cache.new_table()
    for chunk in (torch.arange(0, 13), torch.arange(13, 21)):
        t.append(len(chunk))
        cache.bind([t])
        tiny(prompt[chunk][None], chunk[None], cache)
    child = t.fork()
    used = cache.allocator.num_free
    a, b = torch.tensor([7]), torch.tensor([300])
    for table in (t, child):
        table.append(1)
    assert cache.allocator.num_free == used - 1  # one copy of the shared half-filled block
    cache.bind([t, child])
    logits = tiny(torch.stack([a, b]), torch.tensor([[21], [21]]), cache)[:, -1]
    ref = torch.stack([_contiguous_logits(tiny, prompt, a), _contiguous_logits(tiny, prompt, b)])
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
    t.free(), child.free()
    assert cache.allocator.num_free == cache.num_blocks


def test_cache_validates_its_inputs(tiny):
    cache = paged_cache(tiny, num_blocks=4, block_size=16, use_triton=False)
    q = torch.zeros(1, 8, 1, 32)
    k = torch.zeros(1, 4, 1, 32)
    with pytest.raises(ValueError, match="bind"):
        cache.attend(0, q, k, k, torch.tensor([[0]]))
    t = cache.new_table()
    cache.bind([t])
    with pytest.raises(ValueError, match="append"):
        cache.attend(0, q, k, k, torch.tensor([[0]]))
    assert cache.nbytes == 2 * 4 * 4 * 16 * 4 * 32 * 4  # K and V, L, blocks, size, K, D, fp32


@pytest.mark.skipif(not paged_triton.available("cpu"),
                    reason="needs Triton; on a CPU run with TRITON_INTERPRET=1")
def test_triton_kernel_matches_gather_path():
    """Runs on a GPU, or on a CPU under Triton's interpreter (TRITON_INTERPRET=1)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lengths, block_size, K, H, D = [3, 40, 17], 16, 2, 4, 32
    tables = _scatter_tables(lengths, block_size, 12, seed=3)
    g = torch.Generator().manual_seed(0)
    kc = torch.randn(12, block_size, K, D, generator=g).to(device)
    vc = torch.randn(12, block_size, K, D, generator=g).to(device)
    q = torch.randn(3, H, 1, D, generator=g).to(device)
    bt = torch.zeros(3, 3, dtype=torch.int32)
    for b, t in enumerate(tables):
        bt[b, :len(t.blocks)] = torch.tensor(t.blocks)
    # the cache's pool layout: keys (blocks, K, D, block_size), values (blocks, K, block_size, D)
    out = paged_triton.paged_decode_attention(q, kc.permute(0, 2, 3, 1).contiguous(),
                                              vc.transpose(1, 2).contiguous(), bt.to(device),
                                              torch.tensor(lengths, dtype=torch.int32).to(device))
    idx = gather_index(tables, lengths, device)
    mask = (torch.arange(40) < torch.tensor(lengths)[:, None])[:, None, None].to(device)
    ref = F.scaled_dot_product_attention(q, gather_kv(kc.view(-1, K, D), idx),
                                         gather_kv(vc.view(-1, K, D), idx), attn_mask=mask,
                                         enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_triton_is_optional():
    if not paged_triton.HAVE_TRITON:
        assert not paged_triton.available("cpu")
        with pytest.raises(RuntimeError, match="Triton"):
            paged_triton.paged_decode_attention(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2),
                                                torch.zeros(1, 1, 1, 2),
                                                torch.zeros(1, 1, dtype=torch.int32),
                                                torch.ones(1, dtype=torch.int32))


@pytest.mark.skipif(not paged_triton.available("cpu"),
                    reason="needs Triton; on a CPU run with TRITON_INTERPRET=1")
@torch.inference_mode()
def test_model_decode_through_the_triton_path(tiny):
    """The whole model, decode rows through the fused kernel, prefill through the gather path."""
    torch.manual_seed(2)
    lengths = [3, 20, 9]
    prompts = [torch.randint(0, 512, (n,)) for n in lengths]
    cache = paged_cache(tiny, num_blocks=12, block_size=16, use_triton=True)
    tables = []
    for p in prompts:
        t = cache.new_table()
        t.append(len(p))
        cache.bind([t])
        tiny(p[None], torch.arange(len(p))[None], cache)
        tables.append(t)
    nxt = torch.randint(0, 512, (len(lengths),))
    for t in tables:
        t.append(1)
    cache.bind(tables)
    logits = tiny(nxt[:, None], torch.tensor(lengths)[:, None], cache)[:, -1]
    ref = torch.stack([_contiguous_logits(tiny, p, x) for p, x in zip(prompts, nxt)])
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


def test_prepare_builds_every_layer_s_metadata_in_one_copy(monkeypatch):
    from inferlab.serving import paged_attention
    from inferlab.serving.paged_cache import BlockManager

    copies = []
    real = paged_attention.to_device
    monkeypatch.setattr(paged_attention, "to_device", lambda *a: copies.append(1) or real(*a))
    tables = _scatter_tables([5, 17, 1], block_size=4, num_blocks=12, seed=3)
    pool = PagedKVCache(1, 2, 8, BlockManager(12, 4), use_triton=False)  # K=2, D=8, S=4
    ids, pos, meta = paged_attention.prepare(tables, [[7], [8], [9]], [4, 16, 0], pool)
    assert len(copies) == 1
    assert ids.tolist() == [[7, 8, 9]] and pos.tolist() == [[4, 16, 0]]  # packed in one row
    slots = meta.slot_blocks * 4 + meta.slot_offsets
    assert slots.tolist() == [int(t.slot_mapping(torch.tensor(n - 1)))
                              for t, n in zip(tables, [5, 17, 1])]
    assert meta.decode_context.tolist() == [5, 17, 1] and meta.decode_tables.shape == (3, 5)
    assert meta.decode_mask.shape == (3, 1, 20) and meta.decode_mask.sum().item() == 5 + 17 + 1
    with pytest.raises(ValueError, match="append"):  # row 2 holds 1 token, not 2
        paged_attention.prepare(tables, [[1, 2]] * 3, [3, 15, -1], pool)


def test_the_fused_kernel_is_chosen_only_on_a_gpu(tiny):
    import subprocess
    import sys

    assert not paged_cache(tiny, 4, 16).use_triton  # on a CPU, even under the interpreter
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    code = ("from inferlab.serving import paged_triton as t; "
            "assert not t.available('cpu'), 'available on a CPU without the interpreter'")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def test_generate_refuses_a_paged_cache_clearly(tiny):
    from inferlab.model.generate import generate

    with pytest.raises(TypeError, match="serve"):
        generate(tiny, torch.tensor([1, 2, 3]), 2, cache=paged_cache(tiny, 4, 16))
