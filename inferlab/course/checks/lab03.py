"""Checks for Lab 3, "PagedAttention". Oracles: ``inferlab.serving.paged_cache`` (the reference
allocator and block table), contiguous ``scaled_dot_product_attention`` on the same K/V, the
contiguous ``KVCache``, ``inferlab.serving.reservation.slots_held``, the defining property of
a chained hash, softmax attention over all the keys at once (for the log-sum-exp merge) and
``inferlab.serving.shared_prefix.bytes_read``.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from inferlab.serving import prefix_cache, reservation
from inferlab.course.checks import (CheckFailed, expect_close, expect_equal, expect_tensor_close,
                                    lends, run_check)
from inferlab.model.kv_cache import KVCache
from inferlab.model.llama import build_model
from inferlab.serving.paged_cache import (BlockAllocator, BlockStateError, BlockTable,
    OutOfBlocksError, PagedKVCache)
from inferlab.serving.config import ServingConfig
from inferlab.serving.shared_prefix import bytes_read, merge

# Points per exercise for the grader's score (inferlab.course.grade; an instructor's
# --weights file overrides them): more for the exercises that are more code.
WEIGHTS = {"3.1": 2, "3.2": 2, "3.3": 3, "3.4": 1, "3.5": 2, "3.6": 2, "3.7": 2,
           "3.8": 1}


def _expect_raises(what: str, exc: type, fn, hint: str) -> None:
    try:
        fn()
    except exc:
        return
    except NotImplementedError:
        raise
    except Exception as error:  # the wrong exception: a scheduler could not catch it
        raise CheckFailed(f"{what} raised {type(error).__name__}: {error}; expected "
                          f"{exc.__name__}. Hint: {hint}") from None
    raise CheckFailed(f"{what} raised nothing; expected {exc.__name__}. Hint: {hint}")


def allocator(cls):
    """Exercise 3.1: ``cls(num_blocks)`` with allocate, fork, free, refcount and num_free."""
    def cases(c):
        a = c(4)
        expect_equal("num_free of a new allocator with 4 blocks", a.num_free, 4)
        got = [a.allocate() for _ in range(4)]
        expect_equal("four allocations from 4 blocks (sorted)", sorted(got), [0, 1, 2, 3],
                     hint="hand out each free block once; every block id is in 0..num_blocks-1.")
        expect_equal("num_free after allocating all 4", a.num_free, 0)
        _expect_raises("allocate() with no free block", OutOfBlocksError, a.allocate,
                       "raise inferlab.serving.paged_cache.OutOfBlocksError (not IndexError "
                       "from an empty list) so a scheduler can catch it and preempt.")
        b = got[0]
        expect_equal("fork(b) returns", a.fork(b), b, hint="fork returns the same block id.")
        expect_equal("refcount after one fork", a.refcount(b), 2,
                     hint="fork adds an owner: the reference count goes up by one.")
        a.free(b)
        expect_equal("num_free after freeing one of two owners", a.num_free, 0,
                     hint="a block returns to the free list only when its LAST owner frees it.")
        a.free(b)
        expect_equal("refcount and num_free after the last owner frees it",
                     (a.refcount(b), a.num_free), (0, 1))
        _expect_raises("free() of a block that is already free", BlockStateError,
                       lambda: a.free(b), "a double free must raise BlockStateError; silently "
                       "decrementing below zero lets two sequences own one block later.")
        _expect_raises("fork() of a free block", BlockStateError, lambda: a.fork(b),
                       "only a block someone owns can gain another owner.")
        _expect_raises("free() of block 99 in a 4-block pool", BlockStateError,
                       lambda: a.free(99), "check that the id is in range first.")
        # A random program against the reference: the same counts after every operation.
        rng = random.Random(0)
        mine, ref, held = c(6), BlockAllocator(6), []
        for step in range(300):
            op = rng.choice(["allocate", "fork", "free"]) if held else "allocate"
            if op == "allocate":
                if not ref.can_allocate():
                    continue
                blocks = mine.allocate(), ref.allocate()
                held.append(blocks[0])
                if mine.refcount(blocks[0]) != 1:
                    raise CheckFailed(f"a freshly allocated block has refcount "
                                      f"{mine.refcount(blocks[0])}; expected 1.")
            else:
                b = rng.choice(held)
                if op == "fork":
                    mine.fork(b)
                    held.append(b)
                else:
                    mine.free(b)
                    held.remove(b)
            counts = sorted(mine.refcount(x) for x in range(6))
            expected = sorted([held.count(x) for x in set(held)] + [0] * (6 - len(set(held))))
            if counts != expected or mine.num_free != 6 - len(set(held)):
                raise CheckFailed(f"after {step + 1} random operations the reference counts are "
                                  f"{counts} with {mine.num_free} free; expected {expected} with "
                                  f"{6 - len(set(held))} free. Hint: a block leaked or is owned "
                                  "twice: check that free() puts a block back exactly once.")
    return run_check("3.1", "the block allocator", cls, BlockAllocator, cases,
                     success="allocations, forks and frees keep every count right, and "
                             "misuse raises exceptions a scheduler can catch.")


def block_table(cls):
    """Exercise 3.2: ``cls(allocator, block_size)`` with ``append(n_new)`` and ``slot_mapping``."""
    def cases(c):
        alloc = BlockAllocator(10)
        alloc.allocate(), alloc.allocate(), alloc.allocate()  # so logical != physical ids
        t = c(alloc, 4)
        for n, (n_tokens, n_blocks) in zip([1, 2, 1, 1, 7], [(1, 1), (3, 1), (4, 1), (5, 2),
                                                             (12, 3)]):
            t.append(n)
            expect_equal(f"(num_tokens, number of blocks) after appending {n}",
                         (t.num_tokens, len(t.blocks)), (n_tokens, n_blocks),
                         hint="allocate a block only when the tokens no longer fit: a table with "
                              "n tokens holds ceil(n / block_size) blocks.")
        ref = BlockTable(alloc, 4)
        ref.blocks, ref.num_tokens = list(t.blocks), t.num_tokens
        positions = torch.tensor([0, 3, 4, 5, 11])
        expect_equal("slot_mapping([0, 3, 4, 5, 11])", t.slot_mapping(positions),
                     ref.slot_mapping(positions),
                     hint="slot = blocks[position // block_size] * block_size + position % "
                          "block_size: the PHYSICAL block from the table, then the offset.")
        before = (list(t.blocks), t.num_tokens, alloc.num_free)
        _expect_raises(f"append(40) with {alloc.num_free} free blocks", OutOfBlocksError,
                       lambda: t.append(40), "check that enough blocks are free BEFORE "
                       "allocating any, and raise OutOfBlocksError.")
        expect_equal("(blocks, num_tokens, num_free) after a failed append",
                     (list(t.blocks), t.num_tokens, alloc.num_free), before,
                     hint="a failed append must change nothing: no block taken, no token counted.")
    return run_check("3.2", "the block table", cls, BlockTable, cases,
                     success="a block is taken only at a boundary and every token maps to its "
                             "physical slot.")


def gather_index(tables: list[BlockTable], lengths: list[int],
                 device: str | torch.device = "cpu") -> torch.Tensor:
    """Slots (B, N) of tokens 0..lengths[b]-1 of each table; N = max(lengths), padded with 0.

    Padding points at slot 0, which holds some other sequence's K/V: mask those keys out. The
    simplest gathering over a token-major pool, the check's reference (the engine reads the
    blocks in place instead: ``inferlab.serving.paged_attention``).
    """
    idx = torch.zeros(len(tables), max(lengths), dtype=torch.long, device=device)
    for b, (table, n) in enumerate(zip(tables, lengths)):
        idx[b, :n] = table.slot_mapping(torch.arange(n, device=device))
    return idx


def gather_kv(pool: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """K or V from a token-major pool (num_slots, K, D) at slots ``index`` (B, N): (B, K, N, D),
    a transposed view that SDPA reads with strides."""
    B, N = index.shape
    return pool[index.reshape(-1)].view(B, N, *pool.shape[1:]).transpose(1, 2)  # (B, K, N, D)


def _reference_paged_decode(q, k_new, v_new, k_pool, v_pool, tables):
    lengths = [t.num_tokens for t in tables]
    slots = torch.stack([t.slot_mapping(torch.tensor([n - 1])) for t, n in zip(tables, lengths)])
    k_pool[slots[:, 0]] = k_new[:, :, 0]  # (B, K, D) into each row's newest slot
    v_pool[slots[:, 0]] = v_new[:, :, 0]
    index = gather_index(tables, lengths, q.device)
    mask = (torch.arange(max(lengths), device=q.device)
            < torch.tensor(lengths, device=q.device)[:, None])[:, None, None]
    return F.scaled_dot_product_attention(q, gather_kv(k_pool, index), gather_kv(v_pool, index),
                                          attn_mask=mask, enable_gqa=q.shape[1] != k_new.shape[1])


def paged_decode(fn):
    """Exercise 3.3: ``fn(q, k_new, v_new, k_pool, v_pool, tables)`` writes each row's new K/V at
    its last position and attends over the row's own tokens; (B, H, 1, D)."""
    def cases(f):
        g = torch.Generator().manual_seed(3)
        block_size, K, H, D = 4, 2, 4, 8
        lengths = [3, 13, 1, 8]
        alloc = BlockAllocator(16)
        alloc._free = type(alloc._free)(torch.randperm(16, generator=g).tolist())  # scatter
        tables = []
        for n in lengths:
            t = BlockTable(alloc, block_size)
            t.append(n)
            tables.append(t)
        k_pool = torch.randn(16 * block_size, K, D, generator=g)
        v_pool = torch.randn(16 * block_size, K, D, generator=g)
        B = len(lengths)
        q = torch.randn(B, H, 1, D, generator=g)
        k_new, v_new = torch.randn(B, K, 1, D, generator=g), torch.randn(B, K, 1, D, generator=g)
        # The oracle: each row's K/V as ONE contiguous tensor, in position order, then plain SDPA.
        expected = []
        for b, (t, n) in enumerate(zip(tables, lengths)):
            slots = t.slot_mapping(torch.arange(n))
            k_row, v_row = k_pool[slots].clone(), v_pool[slots].clone()  # (n, K, D)
            k_row[-1], v_row[-1] = k_new[b, :, 0], v_new[b, :, 0]
            expected.append(F.scaled_dot_product_attention(
                q[b:b + 1], k_row.transpose(0, 1)[None], v_row.transpose(0, 1)[None],
                enable_gqa=True))
        expected = torch.cat(expected)
        k_copy, v_copy = k_pool.clone(), v_pool.clone()
        got = f(q, k_new, v_new, k_copy, v_copy, tables)
        for b, (t, n) in enumerate(zip(tables, lengths)):
            slot = int(t.slot_mapping(torch.tensor([n - 1])))
            if not torch.equal(k_copy[slot], k_new[b, :, 0]):
                raise CheckFailed(f"row {b}: the pool's slot {slot} (position {n - 1}) does not "
                                  "hold the new key. Hint: write k_new[b] at "
                                  "table.slot_mapping(position) for position = num_tokens - 1.")
        expect_tensor_close("paged decode attention vs contiguous SDPA on the same K/V", got,
                            expected, atol=1e-5, rtol=1e-5,
                            hint="gather each row's slots in position order (slot_mapping of "
                                 "0..n-1), and mask the padding of shorter rows: a key at "
                                 "position >= n must get no weight.")
    return run_check("3.3", "paged_decode", fn, _reference_paged_decode, cases,
                     success="attention through scattered blocks equals contiguous attention.")


def slots_held(fn):
    """Exercise 3.4: ``fn(reservation, longest, tokens_so_far, max_len, block_size)``."""
    cases_list = [(p, 299, n, 2048, 16) for p in reservation.RESERVATIONS for n in (100, 150, 299)]
    cases_list += [("power_of_two", 256, 130, 2048, 16), ("power_of_two", 257, 200, 2048, 16),
                   ("power_of_two", 1799, 900, 2048, 16),
                   ("paged", 21, 17, 2048, 16), ("paged", 20, 16, 2048, 16),
                   ("paged", 20, 20, 2048, 8), ("max_length", 9, 7, 512, 16)]
    hints = {"max_length": "max-length reservation holds max_len slots from the start.",
             "power_of_two": "round the LONGEST length up to a power of two (256 stays 256), "
                             "and never beyond max_len.",
             "exact": "an oracle reserves exactly the longest length at admission.",
             "paged": "paging holds whole blocks for the tokens stored SO FAR: "
                      "ceil(tokens_so_far / block_size) * block_size."}

    def cases(f):
        for args in cases_list:
            expected = reservation.slots_held(*args)
            got = f(*args)
            if got != expected:
                raise CheckFailed(f"slots_held{args} returned {got!r}, expected {expected}. "
                                  f"Hint: {hints[args[0]]}")
    return run_check("3.4", "slots_held", fn, reservation.slots_held, cases)


def fork(fn):
    """Exercise 3.5: ``fn(table) -> BlockTable`` sharing every block with ``table``."""
    def cases(f):
        alloc = BlockAllocator(8)
        parent = BlockTable(alloc, 4)
        parent.append(6)
        child = f(parent)
        if not isinstance(child, BlockTable):
            raise CheckFailed(f"fork returned a {type(child).__name__}; expected a BlockTable.")
        expect_equal("child.blocks and child.num_tokens", (child.blocks, child.num_tokens),
                     (parent.blocks, parent.num_tokens),
                     hint="the child starts with the parent's blocks and token count.")
        if child.blocks is parent.blocks:
            raise CheckFailed("the child's block list IS the parent's list object, so appending "
                              "to one changes the other. Hint: build a new list.")
        expect_equal("reference counts of the shared blocks", [alloc.refcount(b) for b in
                                                               parent.blocks], [2, 2],
                     hint="each shared block gains an owner: allocator.fork(block).")
        # The whole story on a model: prefill once, fork, decode two different tokens.
        model = build_model("tiny", seed=5)
        gen = torch.Generator().manual_seed(6)
        prompt = torch.randint(0, model.config.vocab_size, (11,), generator=gen)
        cache = PagedKVCache.for_model(model, ServingConfig(num_blocks=6, block_size=8),
                                       use_triton=False)
        t = cache.new_table()
        t.append(11)
        with torch.no_grad():
            cache.bind([t])
            model(prompt[None], torch.arange(11)[None], cache)
            child = f(t)
            t.append(1), child.append(1)  # copy-on-write of the shared half-filled block
            cache.bind([t, child])
            nxt = torch.tensor([[3], [400]])
            got = model(nxt, torch.tensor([[11], [11]]), cache)[:, -1]
            expected = []
            for token in nxt:
                kv = KVCache.for_model(model, 1, max_len=12)
                model(prompt[None], torch.arange(11), kv)
                expected.append(model(token.view(1, 1), torch.tensor([11]), kv)[0, -1])
        expect_tensor_close("logits of two samples decoding from one shared prompt", got,
                            torch.stack(expected), atol=1e-4, rtol=1e-4,
                            hint="if the samples disagree with decoding alone, they wrote into "
                                 "the same block: did the reference counts go up?")
        t.free(), child.free()
        expect_equal("free blocks after both tables are freed", cache.allocator.num_free, 6,
                     hint="every fork must be matched by a free: none may leak.")
    return run_check("3.5", "fork", fn, BlockTable.fork, cases,
                     success="samples share the prompt's blocks and copy only on write.")


def block_hashes(fn):
    """Exercise 3.6: ``fn(tokens, block_size)`` -> one chained hash per FULL block."""
    def cases(f):
        bs = 4
        a = list(range(11))  # two full blocks and three tokens
        ha = f(a, bs)
        expect_equal("len(block_hashes(11 tokens, block_size=4))", len(ha), 2,
                     hint="hash only FULL blocks: a partial block can still change.")
        expect_equal("hashes of a prompt extended by more tokens, first two",
                     list(f(a + [50, 51, 52, 53, 54], bs))[:2], list(ha))
        b = list(range(4)) + [99] + list(range(5, 11))  # block 1 differs
        hb = f(b, bs)
        expect_equal("block 0 of two prompts equal on tokens 0..3", hb[0], ha[0])
        if hb[1] == ha[1]:
            raise CheckFailed("two prompts that differ in block 1 got the same hash for block 1.")
        c = [7] + list(range(1, 11))  # block 0 differs, block 1 equal
        hc = f(c, bs)
        if hc[1] == ha[1]:
            raise CheckFailed("two prompts whose FIRST blocks differ got the same hash for block "
                              "1, although its keys and values differ (each token's K/V depend "
                              "on every token before it). Hint: chain the hashes: hash block i "
                              "together with the hash of block i - 1.")
    return run_check("3.6", "block_hashes", fn, prefix_cache.block_hashes, cases,
                     success="equal hashes mean equal prefixes, so a hit is always safe.")


def _part(q, k, v):
    """The check's own softmax attention of q (B, H, D) over one part's keys k, v (B, H, N, D):
    the output (B, H, D) and each query's log-sum-exp of its scores (B, H); N may be 0."""
    scores = (q[:, :, None] @ k.transpose(-1, -2))[:, :, 0] / math.sqrt(q.shape[-1])  # (B, H, N)
    if scores.shape[-1] == 0:  # no keys: nothing to attend, no mass
        return torch.zeros_like(q), torch.full(q.shape[:2], float("-inf"))
    return (torch.softmax(scores, -1)[:, :, None] @ v)[:, :, 0], torch.logsumexp(scores, -1)


def _merge_hint(got, o1, l1, o2, l2) -> str:
    """The hint for a wrong merged output: which known mistake it matches, if one does."""
    w1, w2 = torch.exp(l1)[..., None], torch.exp(l2)[..., None]  # small scores: no overflow here
    m = torch.maximum(l1, l2)[..., None]
    unnormalised = ("you weighted each part by e^lse but did not divide by the total weight "
                    "e^lse1 + e^lse2: each part's output is already normalised over its own "
                    "keys, so the merged weights must add up to 1.")
    mistakes = [
        (w1 * o1 + w2 * o2, unnormalised),
        (torch.exp(l1[..., None] - m) * o1 + torch.exp(l2[..., None] - m) * o2, unnormalised),
        ((o1 + o2) / 2, "you gave both parts equal weight. A part's weight is its share of the "
                        "softmax's mass, e^lse1 / (e^lse1 + e^lse2): a prefix of many keys (or "
                        "high scores) holds more of it than a short suffix."),
        (torch.where(l1[..., None] >= l2[..., None], o1, o2),
         "you kept the part with the larger log-sum-exp and dropped the other, a max where "
         "the softmax needs a weighted sum: out = (e^(lse1-m) out1 + e^(lse2-m) out2) / "
         "(e^(lse1-m) + e^(lse2-m))."),
    ]
    for wrong, hint in mistakes:
        if isinstance(got, torch.Tensor) and got.shape == wrong.shape and \
                torch.allclose(got.float(), wrong, atol=1e-5, rtol=1e-5):
            return hint
    return ("weight each part by its share of the softmax's mass, e^(lse_i - m) / (e^(lse1 - m) "
            "+ e^(lse2 - m)) with m = max(lse1, lse2), and add the two weighted outputs.")


def merge_attention(fn):
    """Exercise 3.7: ``fn(out1, lse1, out2, lse2) -> (out, lse)``, attention over the union of
    two parts' keys from each part's output (..., D) and log-sum-exp (...)."""
    def call(f, o1, l1, o2, l2, what):
        result = f(o1.clone(), l1.clone(), o2.clone(), l2.clone())
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise CheckFailed(f"merge_attention on {what} returned {_short_type(result)}; "
                              "expected a pair (out, lse). Hint: return the merged output and "
                              "the merged log-sum-exp, so a third part could be merged later.")
        return result

    def cases(f):
        g = torch.Generator().manual_seed(37)
        B, H, D = 3, 4, 8
        for P, L, scale, what in [(9, 3, 1.0, "a 9-key prefix and a 3-key suffix"),
                                  (2, 11, 1.0, "a 2-key prefix and an 11-key suffix"),
                                  (6, 5, 60.0, "queries 60 times larger (scores in the "
                                                "hundreds)"),
                                  (7, 0, 1.0, "an empty suffix (lse2 = -inf, out2 = 0)")]:
            q = scale * torch.randn(B, H, D, generator=g)
            k, v = torch.randn(B, H, P + L, D, generator=g), torch.randn(B, H, P + L, D, generator=g)
            o1, l1 = _part(q, k[:, :, :P], v[:, :, :P])
            o2, l2 = _part(q, k[:, :, P:], v[:, :, P:])
            # The oracle: one softmax over the prefix's and the suffix's keys together.
            full = F.scaled_dot_product_attention(q[:, :, None], k, v)[:, :, 0]   # (B, H, D)
            full_lse = torch.logsumexp((q[:, :, None] @ k.transpose(-1, -2))[:, :, 0]
                                       / math.sqrt(D), -1)
            out, lse = call(f, o1, l1, o2, l2, what)
            if isinstance(out, torch.Tensor) and not bool(torch.isfinite(out).all()):
                raise CheckFailed(
                    f"merge_attention on {what} returned inf or nan in the output, with "
                    f"log-sum-exps up to {float(torch.maximum(l1, l2).max()):.0f}. Hint: "
                    "e^x overflows float32 above x = 88.7 (and e^-inf times 0 is fine, but inf / "
                    "inf is nan): subtract m = max(lse1, lse2) from both before exponentiating.")
            hint = _merge_hint(out, o1, l1, o2, l2) if scale == 1.0 else (
                "subtract m = max(lse1, lse2) before exponentiating, then weight as before.")
            expect_tensor_close(f"merge_attention's output on {what}, against attention over "
                                "all the keys at once,", out, full, atol=1e-5, rtol=1e-4,
                                hint=hint)
            expect_tensor_close(f"merge_attention's lse on {what}, against the log-sum-exp of "
                                "all the scores,", lse, full_lse, atol=1e-4, rtol=1e-5,
                                hint="the union's normaliser is the sum of the parts': "
                                     "lse = m + log(e^(lse1 - m) + e^(lse2 - m)), not their "
                                     "max (that drops the smaller part's mass).")
    return run_check("3.7", "merge_attention", fn, merge, cases,
                     success="two softmax parts merge exactly, even when e^lse would "
                             "overflow.")


def _short_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"one tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _reference_read_bytes(batch, prefix, suffix, n_kv_heads, head_dim, bytes_per_element):
    r = bytes_read(batch, prefix, suffix, 2 * n_kv_heads * head_dim * bytes_per_element)
    return r["per_sequence"], r["shared_prefix"]


def kv_read_bytes(fn):
    """Exercise 3.8: ``fn(batch, prefix, suffix, n_kv_heads, head_dim, bytes_per_element)`` ->
    (per_sequence, shared_prefix): one layer's K/V bytes a decode step reads."""
    reference = lends(_reference_read_bytes, bytes_read)
    shapes = [(16, 1024, 128, 8, 128, 2), (64, 2048, 512, 8, 128, 2), (1, 500, 20, 4, 64, 4),
              (8, 0, 33, 2, 16, 1), (5, 96, 1, 32, 128, 2)]

    def cases(f):
        for B, P, L, K, D, e in shapes:
            what = f"kv_read_bytes({B}, {P}, {L}, {K}, {D}, {e})"
            got = f(B, P, L, K, D, e)
            if not (isinstance(got, (tuple, list)) and len(got) == 2):
                raise CheckFailed(f"{what} returned {_short_type(got)}; expected a pair "
                                  "(per_sequence, shared_prefix) of byte counts.")
            each, once = reference(B, P, L, K, D, e)
            token = 2 * K * D * e
            for name, value, expected, hints in [
                    ("per_sequence", got[0], each,
                     {B * (P + L) * K * D * e: "count K AND V: 2 x n_kv_heads x head_dim x "
                                              "bytes_per_element per token.",
                      (P + L) * token: "every one of the batch's sequences reads its whole "
                                       "context: multiply by the batch."}),
                    ("shared_prefix", got[1], once,
                     {(P + B * L) * K * D * e: "count K AND V: 2 x n_kv_heads x head_dim x "
                                               "bytes_per_element per token.",
                      B * (P + L) * token: "that is still the per-sequence count: with the "
                                           "split the prefix is read ONCE for the batch.",
                      (P + L) * token: "the prefix is read once, but each sequence still "
                                       "reads its own suffix: B x suffix tokens."}),
            ]:
                hint = ""
                try:
                    hint = hints.get(round(float(value)), "")
                except (TypeError, ValueError):
                    pass
                expect_close(f"{what}[{'01'[name == 'shared_prefix']}] ({name})", value,
                             expected, rel=1e-9, unit=" B",
                             hint=hint or ("per sequence: B x (prefix + suffix) tokens; split: "
                                           "prefix + B x suffix tokens; each token's K and V "
                                           "take 2 x n_kv_heads x head_dim x bytes_per_element."))
    return run_check("3.8", "kv_read_bytes", fn, reference, cases,
                     success="the split saves (batch - 1) x prefix tokens' K/V a layer.")
