"""Lab 2's checks: a correct answer passes, a stub falls back to the reference, planted bugs fail."""

import pytest
import torch
import torch.nn.functional as F

from inferlab.analysis import formulas
from inferlab.course.checks import CheckFailed
from inferlab.course.checks import lab02 as check
from inferlab.model.gqa import mean_pool_heads
from inferlab.model.kv_cache import KVCache


class Cache:
    """The lab's cache, solved; subclasses plant one bug each in ``_write_and_attend``."""

    def __init__(self, n_layers, batch, n_kv_heads, max_len, head_dim, dtype, device):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.n_layers, self.length = n_layers, 0

    def attend(self, layer, q, k, v, positions):
        start, end = int(positions[0]), int(positions[-1]) + 1
        out = self._write_and_attend(layer, q, k, v, positions, start, end)
        if layer == self.n_layers - 1:
            self.length = end
        return out

    def _write_and_attend(self, layer, q, k, v, positions, start, end):
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        keys, values = self.k[layer, :, :, :end], self.v[layer, :, :, :end]
        mask = torch.arange(end) <= positions[:, None]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)


class NoMask(Cache):
    def _write_and_attend(self, layer, q, k, v, positions, start, end):
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return F.scaled_dot_product_attention(q, self.k[layer, :, :, :end], self.v[layer, :, :, :end],
                                              enable_gqa=True)


class OnlyNewKeys(Cache):
    def _write_and_attend(self, layer, q, k, v, positions, start, end):
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[-2] > 1, enable_gqa=True)


class WritesAtZero(Cache):
    def _write_and_attend(self, layer, q, k, v, positions, start, end):
        T = k.shape[-2]
        self.k[layer, :, :, :T] = k
        self.v[layer, :, :, :T] = v
        return super()._write_and_attend(layer, q, self.k[layer, :, :, start:end],
                                         self.v[layer, :, :, start:end], positions, start, end)


class MaskOffByOne(Cache):
    def _write_and_attend(self, layer, q, k, v, positions, start, end):
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        mask = torch.arange(end) < positions[:, None]
        mask[:, 0] = True  # keep every row attending somewhere
        return F.scaled_dot_product_attention(q, self.k[layer, :, :, :end],
                                              self.v[layer, :, :, :end], attn_mask=mask,
                                              enable_gqa=True)


class Stub(Cache):
    def _write_and_attend(self, *args):
        raise NotImplementedError("Exercise 2.1: write the body of attend()")


def test_kv_cache_passes_when_correct(capsys):
    assert check.kv_cache(Cache) is Cache
    assert "[PASS] Exercise 2.1" in capsys.readouterr().out


def test_kv_cache_stub_falls_back_to_the_reference(capsys):
    assert check.kv_cache(Stub) is KVCache
    assert "[TODO] Exercise 2.1" in capsys.readouterr().out


@pytest.mark.parametrize("bug,hint", [(NoMask, "causal mask"), (OnlyNewKeys, "ALL stored keys"),
                                      (WritesAtZero, "prefill|decode"),
                                      (MaskOffByOne, "causal mask")])
def test_kv_cache_planted_bugs_fail(bug, hint):
    with pytest.raises(CheckFailed, match=r"\[FAIL\] Exercise 2.1") as failure:
        check.kv_cache(bug)
    assert any(word in str(failure.value) for word in hint.split("|"))


def test_kv_cache_that_never_advances_length_fails_on_generation():
    class Frozen(Cache):
        def attend(self, layer, q, k, v, positions):
            start, end = int(positions[0]), int(positions[-1]) + 1
            return self._write_and_attend(layer, q, k, v, positions, start, end)

    with pytest.raises(CheckFailed, match="generation"):
        check.kv_cache(Frozen)


def _stub(*args):
    raise NotImplementedError


def test_predicted_speedup(capsys):
    right = lambda c, n: formulas.recompute_flops(c, n) / formulas.flops_per_token(c, n - 1)  # noqa: E731
    check.predicted_speedup(right)
    assert "[PASS]" in capsys.readouterr().out
    with pytest.raises(CheckFailed):  # planted bug: forgets attention, counts weights only
        check.predicted_speedup(lambda c, n: float(n))
    with pytest.raises(CheckFailed):  # planted bug: compares with a cache of n tokens, not n - 1
        check.predicted_speedup(lambda c, n: formulas.recompute_flops(c, n)
                                / formulas.flops_per_token(c, n))
    assert check.predicted_speedup(_stub) is not _stub


def test_cache_bytes(capsys):
    check.cache_bytes(lambda c, t, b, d: formulas.kv_bytes(c, t, d, b))
    assert "[PASS]" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="KV heads"):  # planted bug: query heads instead of KV heads
        check.cache_bytes(lambda c, t, b, d: 2 * c.n_layers * c.n_heads * c.head_dim * t * b
                          * torch.empty((), dtype=getattr(torch, d)).element_size())
    with pytest.raises(CheckFailed):  # planted bug: forgets V
        check.cache_bytes(lambda c, t, b, d: formulas.kv_bytes(c, t, d, b) / 2)
    ref = check.cache_bytes(_stub)
    assert "[TODO]" in capsys.readouterr().out
    assert ref(check.ModelConfig.from_name("llama-2-7b"), 1, 1, "bfloat16") == 512 * 1024


def test_pool_kv_heads(capsys):
    check.pool_kv_heads(mean_pool_heads)
    assert "[PASS]" in capsys.readouterr().out

    def strided(w, heads, new, head_dim):  # planted bug: groups every new-th head, not neighbours
        group = heads // new
        return w.reshape(group, new, head_dim, -1).mean(0).reshape(new * head_dim, -1)

    with pytest.raises(CheckFailed, match="CONSECUTIVE"):
        check.pool_kv_heads(strided)

    def summed(w, heads, new, head_dim):  # planted bug: sums instead of averaging
        return w.reshape(new, heads // new, head_dim, -1).sum(1).reshape(new * head_dim, -1)

    with pytest.raises(CheckFailed):
        check.pool_kv_heads(summed)
    assert check.pool_kv_heads(_stub) is mean_pool_heads


def test_max_requests(capsys):
    def right(mem, w, r, kvb, ctx):
        return int(max(mem - w - r, 0) // kvb // ctx)

    check.max_requests(right)
    assert "[PASS]" in capsys.readouterr().out
    with pytest.raises(CheckFailed):  # planted bug: can go negative when the weights do not fit
        check.max_requests(lambda mem, w, r, kvb, ctx: int((mem - w - r) // kvb // ctx))
    with pytest.raises(CheckFailed):  # planted bug: rounds to nearest instead of down
        check.max_requests(lambda mem, w, r, kvb, ctx: round(max(mem - w - r, 0) / kvb / ctx))
    with pytest.raises(CheckFailed):  # planted bug: forgets the activation reserve
        check.max_requests(lambda mem, w, r, kvb, ctx: int(max(mem - w, 0) // kvb // ctx))
    ref = check.max_requests(_stub)
    assert ref(40 * 2**30, 26 * 2**30, 2 * 2**30, 800 * 1024, 1) == 15728
