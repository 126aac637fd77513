"""Lab 3's checks: a correct answer passes, a stub gets [TODO] and the reference, and planted
bugs raise CheckFailed."""

from __future__ import annotations

from collections import deque

import pytest
import torch
import torch.nn.functional as F

from inferlab.serving import prefix_cache
from inferlab.serving.reservation import slots_held
from inferlab.course.checks import CheckFailed
from inferlab.course.checks import lab03 as check
from inferlab.course.checks.lab03 import gather_index, gather_kv
from inferlab.serving.paged_cache import (BlockAllocator, BlockStateError, BlockTable,
    OutOfBlocksError)


def _stub(*args, **kwargs):
    raise NotImplementedError("Exercise 3.x")


# ---------------------------------------------------------------- 3.1 the allocator

class GoodAllocator:
    def __init__(self, num_blocks):
        self.refs = [0] * num_blocks
        self.free_list = deque(range(num_blocks))

    @property
    def num_free(self):
        return len(self.free_list)

    def allocate(self):
        if not self.free_list:
            raise OutOfBlocksError("no free block")
        b = self.free_list.popleft()
        self.refs[b] = 1
        return b

    def _owned(self, b):
        if not 0 <= b < len(self.refs) or self.refs[b] == 0:
            raise BlockStateError(f"block {b} is not allocated")

    def fork(self, b):
        self._owned(b)
        self.refs[b] += 1
        return b

    def free(self, b):
        self._owned(b)
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self.free_list.append(b)

    def refcount(self, b):
        return self.refs[b]


class StubAllocator(GoodAllocator):  # what the lab hands out: the exercise methods raise
    allocate = fork = free = _stub


class IndexErrorWhenEmpty(GoodAllocator):
    def allocate(self):
        b = self.free_list.popleft()  # IndexError, not OutOfBlocksError
        self.refs[b] = 1
        return b


class NoDoubleFreeCheck(GoodAllocator):
    def free(self, b):
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self.free_list.append(b)


class FreesOnFirstOwner(GoodAllocator):
    def free(self, b):
        self._owned(b)
        self.refs[b] -= 1
        self.free_list.append(b)  # back on the free list while still shared


def test_allocator_check():
    assert check.allocator(GoodAllocator) is GoodAllocator
    assert check.allocator(StubAllocator) is BlockAllocator
    for bug in (IndexErrorWhenEmpty, NoDoubleFreeCheck, FreesOnFirstOwner):
        with pytest.raises(CheckFailed, match=r"\[FAIL\] Exercise 3.1"):
            check.allocator(bug)


def test_allocator_check_prints_todo(capsys):
    check.allocator(StubAllocator)
    assert "[TODO] Exercise 3.1" in capsys.readouterr().out


# ---------------------------------------------------------------- 3.2 the block table

class GoodTable:
    def __init__(self, allocator, block_size):
        self.allocator, self.block_size = allocator, block_size
        self.blocks, self.num_tokens = [], 0

    def append(self, n_new):
        need = -(-(self.num_tokens + n_new) // self.block_size) - len(self.blocks)
        if not self.allocator.can_allocate(need):
            raise OutOfBlocksError("no room")
        self.blocks += [self.allocator.allocate() for _ in range(need)]
        self.num_tokens += n_new

    def slot_mapping(self, positions):
        blocks = torch.tensor(self.blocks)
        return blocks[positions // self.block_size] * self.block_size + positions % self.block_size


class StubTable(GoodTable):
    append = slot_mapping = _stub


class BlockPerAppend(GoodTable):
    def append(self, n_new):
        self.blocks.append(self.allocator.allocate())
        self.num_tokens += n_new


class LogicalSlots(GoodTable):
    def slot_mapping(self, positions):
        return positions  # ignores the block table


class NotAtomic(GoodTable):
    def append(self, n_new):
        need = -(-(self.num_tokens + n_new) // self.block_size) - len(self.blocks)
        self.num_tokens += n_new
        for _ in range(need):
            self.blocks.append(self.allocator.allocate())


def test_block_table_check():
    assert check.block_table(GoodTable) is GoodTable
    assert check.block_table(StubTable) is BlockTable
    for bug in (BlockPerAppend, LogicalSlots, NotAtomic):
        with pytest.raises(CheckFailed, match=r"\[FAIL\] Exercise 3.2"):
            check.block_table(bug)


# ---------------------------------------------------------------- 3.3 paged decode attention

def _write_new(k_new, v_new, k_pool, v_pool, tables):
    for b, t in enumerate(tables):
        slot = t.slot_mapping(torch.tensor(t.num_tokens - 1))
        k_pool[slot], v_pool[slot] = k_new[b, :, 0], v_new[b, :, 0]


def good_paged_decode(q, k_new, v_new, k_pool, v_pool, tables):
    _write_new(k_new, v_new, k_pool, v_pool, tables)
    out = []
    for b, t in enumerate(tables):
        slots = t.slot_mapping(torch.arange(t.num_tokens))
        k, v = k_pool[slots].transpose(0, 1)[None], v_pool[slots].transpose(0, 1)[None]
        out.append(F.scaled_dot_product_attention(q[b:b + 1], k, v, enable_gqa=True))
    return torch.cat(out)


def no_mask(q, k_new, v_new, k_pool, v_pool, tables):
    _write_new(k_new, v_new, k_pool, v_pool, tables)
    lengths = [t.num_tokens for t in tables]
    idx = gather_index(tables, lengths)
    return F.scaled_dot_product_attention(q, gather_kv(k_pool, idx), gather_kv(v_pool, idx),
                                          enable_gqa=True)


def logical_gather(q, k_new, v_new, k_pool, v_pool, tables):
    _write_new(k_new, v_new, k_pool, v_pool, tables)
    out = []
    for b, t in enumerate(tables):
        slots = torch.arange(t.num_tokens)  # as if the blocks were contiguous from 0
        k, v = k_pool[slots].transpose(0, 1)[None], v_pool[slots].transpose(0, 1)[None]
        out.append(F.scaled_dot_product_attention(q[b:b + 1], k, v, enable_gqa=True))
    return torch.cat(out)


def no_write(q, k_new, v_new, k_pool, v_pool, tables):
    return good_paged_decode(q, k_new, v_new, k_pool.clone(), v_pool.clone(), tables)


def test_paged_decode_check():
    assert check.paged_decode(good_paged_decode) is good_paged_decode
    assert check.paged_decode(_stub) is check._reference_paged_decode
    for bug in (no_mask, logical_gather, no_write):
        with pytest.raises(CheckFailed, match=r"\[FAIL\] Exercise 3.3"):
            check.paged_decode(bug)


def test_reference_paged_decode_passes_its_own_check():
    assert check.paged_decode(check._reference_paged_decode) is check._reference_paged_decode


# ---------------------------------------------------------------- 3.4 slots held

def pow2_of_tokens_so_far(policy, longest, tokens_so_far, max_len, block_size):
    if policy == "power_of_two":
        return min(max_len, 1 << (tokens_so_far - 1).bit_length())
    return slots_held(policy, longest, tokens_so_far, max_len, block_size)


def paged_rounds_down(policy, longest, tokens_so_far, max_len, block_size):
    if policy == "paged":
        return tokens_so_far // block_size * block_size
    return slots_held(policy, longest, tokens_so_far, max_len, block_size)


def paged_reserves_final(policy, longest, tokens_so_far, max_len, block_size):
    if policy == "paged":
        return -(-longest // block_size) * block_size
    return slots_held(policy, longest, tokens_so_far, max_len, block_size)


def test_slots_held_check():
    assert check.slots_held(slots_held) is slots_held
    assert check.slots_held(_stub) is slots_held
    for bug in (pow2_of_tokens_so_far, paged_rounds_down, paged_reserves_final):
        with pytest.raises(CheckFailed, match=r"\[FAIL\] Exercise 3.4"):
            check.slots_held(bug)


# ---------------------------------------------------------------- 3.5 fork

def good_fork(table):
    child = BlockTable(table.allocator, table.block_size)
    child.blocks = [table.allocator.fork(b) for b in table.blocks]
    child.num_tokens = table.num_tokens
    return child


def same_list(table):
    child = BlockTable(table.allocator, table.block_size)
    child.blocks, child.num_tokens = table.blocks, table.num_tokens
    for b in table.blocks:
        table.allocator.fork(b)
    return child


def no_refcount(table):
    child = BlockTable(table.allocator, table.block_size)
    child.blocks, child.num_tokens = list(table.blocks), table.num_tokens
    return child


def test_fork_check():
    assert check.fork(good_fork) is good_fork
    assert check.fork(_stub) is BlockTable.fork
    for bug in (same_list, no_refcount):
        with pytest.raises(CheckFailed, match=r"\[FAIL\] Exercise 3.5"):
            check.fork(bug)


# ---------------------------------------------------------------- 3.6 block hashes

def tuple_prefix_hashes(tokens, block_size):  # a different but correct scheme
    return [hash(tuple(tokens[:(i + 1) * block_size])) for i in range(len(tokens) // block_size)]


def unchained(tokens, block_size):
    return [hash(tuple(tokens[i * block_size:(i + 1) * block_size]))
            for i in range(len(tokens) // block_size)]


def with_partial(tokens, block_size):
    return [hash(tuple(tokens[:i + block_size])) for i in range(0, len(tokens), block_size)]


def test_block_hashes_check():
    assert check.block_hashes(prefix_cache.block_hashes) is prefix_cache.block_hashes
    assert check.block_hashes(tuple_prefix_hashes) is tuple_prefix_hashes
    assert check.block_hashes(_stub) is prefix_cache.block_hashes
    for bug in (unchained, with_partial):
        with pytest.raises(CheckFailed, match=r"\[FAIL\] Exercise 3.6"):
            check.block_hashes(bug)


# ---------------------------------------------------------------- 3.7 the log-sum-exp merge

def good_merge(out1, lse1, out2, lse2):
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    total = w1 + w2
    return (w1[..., None] * out1 + w2[..., None] * out2) / total[..., None], m + torch.log(total)


def softmax_merge(out1, lse1, out2, lse2):  # a different but correct way: softmax of the lses
    w = torch.softmax(torch.stack([lse1, lse2]), 0)
    return w[0][..., None] * out1 + w[1][..., None] * out2, torch.logaddexp(lse1, lse2)


def equal_weights(out1, lse1, out2, lse2):
    return (out1 + out2) / 2, torch.logaddexp(lse1, lse2)


def not_renormalised(out1, lse1, out2, lse2):
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    return w1[..., None] * out1 + w2[..., None] * out2, m + torch.log(w1 + w2)


def larger_part_only(out1, lse1, out2, lse2):  # a max instead of the log-sum-exp weighting
    return torch.where((lse1 >= lse2)[..., None], out1, out2), torch.maximum(lse1, lse2)


def lse_is_the_max(out1, lse1, out2, lse2):  # right output, the union's lse taken as a max
    return good_merge(out1, lse1, out2, lse2)[0], torch.maximum(lse1, lse2)


def no_max_subtracted(out1, lse1, out2, lse2):  # overflows when the scores are large
    w1, w2 = torch.exp(lse1), torch.exp(lse2)
    return (w1[..., None] * out1 + w2[..., None] * out2) / (w1 + w2)[..., None], \
        torch.log(w1 + w2)


def output_only(out1, lse1, out2, lse2):
    return good_merge(out1, lse1, out2, lse2)[0]


@pytest.mark.parametrize("bug, says", [
    (equal_weights, "equal weight"), (not_renormalised, "did not divide"),
    (larger_part_only, "kept the part with the larger"), (lse_is_the_max, "not their max"),
    (no_max_subtracted, "overflows float32"), (output_only, "expected a pair")])
def test_merge_check_catches_each_planted_bug(bug, says):
    with pytest.raises(CheckFailed, match=r"\[FAIL\] Exercise 3.7") as caught:
        check.merge_attention(bug)
    assert says in str(caught.value)


def test_merge_check_passes_correct_merges_and_lends_the_package_merge():
    from inferlab.serving.shared_prefix import merge
    assert check.merge_attention(good_merge) is good_merge
    assert check.merge_attention(softmax_merge) is softmax_merge
    assert check.merge_attention(_stub) is merge
    assert check.merge_attention(merge) is merge  # the reference passes its own check


# ---------------------------------------------------------------- 3.8 bytes a decode step reads

def good_read_bytes(batch, prefix, suffix, n_kv_heads, head_dim, bytes_per_element):
    token = 2 * n_kv_heads * head_dim * bytes_per_element
    return batch * (prefix + suffix) * token, (prefix + batch * suffix) * token


def keys_only(batch, prefix, suffix, n_kv_heads, head_dim, bytes_per_element):
    return tuple(x // 2 for x in good_read_bytes(batch, prefix, suffix, n_kv_heads, head_dim,
                                                 bytes_per_element))


def no_saving(batch, prefix, suffix, n_kv_heads, head_dim, bytes_per_element):
    each, _ = good_read_bytes(batch, prefix, suffix, n_kv_heads, head_dim, bytes_per_element)
    return each, each


def one_suffix(batch, prefix, suffix, n_kv_heads, head_dim, bytes_per_element):
    each, _ = good_read_bytes(batch, prefix, suffix, n_kv_heads, head_dim, bytes_per_element)
    return each, (prefix + suffix) * 2 * n_kv_heads * head_dim * bytes_per_element


@pytest.mark.parametrize("bug, says", [(keys_only, "K AND V"), (no_saving, "ONCE for the batch"),
                                       (one_suffix, "its own suffix")])
def test_read_bytes_check_catches_each_planted_bug(bug, says):
    with pytest.raises(CheckFailed, match=r"\[FAIL\] Exercise 3.8") as caught:
        check.kv_read_bytes(bug)
    assert says in str(caught.value)


def test_read_bytes_check_passes_and_lends_a_reference():
    assert check.kv_read_bytes(good_read_bytes) is good_read_bytes
    reference = check.kv_read_bytes(_stub)
    assert reference(16, 1024, 128, 8, 128, 2) == good_read_bytes(16, 1024, 128, 8, 128, 2)
