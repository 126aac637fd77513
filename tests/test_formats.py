"""FP8, block-wise FP8, MXFP4 and NVFP4 round trips, value sets, scales, saturation and storage;
the FP8 KV cache against its scales."""

import math

import pytest
import torch

from inferlab.model import formats as F
from inferlab.model.fp8_kv_cache import Fp8KVCache


def all_fp8_values(fmt):
    codes = torch.arange(256, dtype=torch.uint8).view(F.FP8[fmt]).float()
    return codes[codes.isfinite()]


def test_e2m1_value_set_is_exactly_the_eight_magnitudes_with_sign():
    x = torch.linspace(-8, 8, 20001)
    values = set(F.round_e2m1(x).abs().unique().tolist())
    assert values == {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0}
    grid = torch.tensor(F.E2M1_VALUES)
    for v in torch.cat([grid, -grid]):
        assert float(F.round_e2m1(v)) == float(v)  # representable values map to themselves


@pytest.mark.parametrize("x, want", [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0),
                                     (2.5, 2.0), (3.5, 4.0), (5.0, 4.0), (-2.5, -2.0),
                                     (0.26, 0.5), (5.01, 6.0), (7.9, 6.0), (1e9, 6.0)])
def test_e2m1_rounds_to_nearest_ties_to_even_and_saturates(x, want):
    assert float(F.round_e2m1(torch.tensor(x))) == want


def test_e2m1_keeps_nan():
    assert math.isnan(float(F.round_e2m1(torch.tensor(float("nan")))))


@pytest.mark.parametrize("fmt, top", [("e4m3", 448.0), ("e5m2", 57344.0)])
def test_fp8_round_trip_of_every_representable_value_and_saturation(fmt, top):
    v = all_fp8_values(fmt)
    assert torch.equal(F.to_fp8(v, fmt).float(), v)
    assert F.fp8_max(fmt) == top
    assert float(F.to_fp8(torch.tensor(1e30), fmt).float()) == top
    assert float(F.to_fp8(torch.tensor(-1e30), fmt).float()) == -top
    assert math.isnan(float(F.to_fp8(torch.tensor(float("nan")), fmt).float()))


@pytest.mark.parametrize("granularity", ["tensor", "channel", "block"])
def test_fp8_scaled_round_trip_is_exact_on_scaled_fp8_values(granularity):
    """A matrix whose every block is FP8 values times a power of two, with each block's largest
    magnitude at the format's max, comes back exactly."""
    g = torch.Generator().manual_seed(0)
    v = all_fp8_values("e4m3")
    w = v[torch.randint(0, v.numel(), (256, 256), generator=g)]
    w[::128, ::128] = 448.0   # every 128x128 block (and so every row band) reaches the max
    w[:, 0] = 448.0           # every row too
    deq, stored = F.fp8_quantize(w * 0.25, "e4m3", granularity)
    assert torch.equal(deq, w * 0.25)
    assert stored.element_bits == 8


def test_fp8_block_scales_follow_each_block():
    w = torch.ones(256, 192)
    w[:128, :128] *= 1000.0   # one loud block must not flatten its neighbours
    deq, stored = F.fp8_quantize(w * 1e-3, "e4m3", "block", (128, 128))
    assert torch.allclose(deq, w * 1e-3, rtol=0.07)
    assert stored.scales == 2 * 2  # 192 columns: one full and one partial block per band
    tiles = F.fp8_activation_tiles(torch.randn(3, 5, 256))
    assert tiles.shape == (3, 5, 256)


def test_mx_scale_is_the_specs_power_of_two():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 256, generator=g) * torch.logspace(-3, 3, 64)[:, None]
    deq, codes, stored = F.mxfp4_quantize(w)
    blocks = w.reshape(64, 8, 32)
    amax = blocks.abs().amax(-1)
    want = torch.floor(torch.log2(amax)) - 2 + 127
    assert torch.equal(codes.float(), want)
    X = torch.exp2(codes.float() - 127)[..., None]
    ratio = deq.reshape(64, 8, 32) / X
    assert set(ratio.abs().unique().tolist()) <= set(F.E2M1_VALUES)  # elements are E2M1 codes
    assert stored.bits_per_weight == 4.25


def test_mxfp4_round_trip_of_representable_blocks_and_special_blocks():
    grid = torch.tensor(F.E2M1_VALUES)
    row = torch.cat([grid, -grid, grid, -grid])          # 32 elements, max 6 -> X = 1
    w = torch.stack([row, row * 2.0 ** -10, row * 2.0 ** 20])
    deq, codes, _ = F.mxfp4_quantize(w)
    assert torch.equal(deq, w)
    assert codes.flatten().tolist() == [127, 117, 147]
    special = torch.zeros(3, 32)
    special[1, 3] = float("nan")
    special[2, 5] = float("inf")
    deq, codes, _ = F.mxfp4_quantize(special)
    assert codes.flatten().tolist() == [0, 255, 255]      # zero block: 2^-127; NaN/Inf: NaN
    assert torch.equal(deq[0], torch.zeros(32)) and deq[1:].isnan().all()


def test_mx_scale_saturates_values_above_six_times_x():
    """floor(log2 7) - 2 = 0, so X = 1 and 7 is clamped to 6: the spec's scale can clip."""
    w = torch.zeros(1, 32)
    w[0, 0] = 7.0
    deq, codes, _ = F.mxfp4_quantize(w)
    assert int(codes) == 127 and float(deq[0, 0]) == 6.0


def test_mx_floor_scale_uses_two_thirds_of_the_grid_and_rceil_never_clips():
    """FLOOR (the spec) puts each block's max at [4, 8) X: at least 4 of E2M1's 6, above 6 it
    clips. RCEIL puts it at (3, 6] X: nothing clips, but a block may use just over half."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(64, 256, generator=g) * torch.logspace(-2, 2, 64)[:, None]
    blocks = w.reshape(64, 8, 32)
    for mode, lo, hi in (("floor", 4.0, 8.0), ("rceil", 3.0, 6.0)):
        deq, codes, _ = F.mxfp4_quantize(w, scale_mode=mode)
        ratio = blocks.abs().amax(-1) / torch.exp2(codes.float() - 127)
        assert (ratio >= lo).all() and (ratio <= hi).all(), mode
        assert ((ratio > lo) & (ratio < hi)).any(), mode
    deq, _, _ = F.mxfp4_quantize(w, scale_mode="rceil")
    top = blocks.abs().amax(-1)
    assert torch.allclose(deq.reshape(64, 8, 32).abs().amax(-1), top, rtol=0.25)  # no clamp
    with pytest.raises(ValueError):
        F.mxfp4_quantize(w, scale_mode="round")


def test_mxfp4_clipping_counts_blocks_elements_and_their_error():
    w = torch.zeros(2, 64)
    w[0, :32] = torch.tensor(F.E2M1_VALUES * 4)  # representable: exact, nothing clipped
    w[1, 0] = 7.0                                # X = 1: 7 clips to 6, the only error
    w[1, 32:40] = 1.0                            # exact
    c = F.mxfp4_clipping(w)
    assert c.blocks == 1 / 4 and c.elements == 1 / 128 and c.error_share == 1.0
    assert F.mxfp4_clipping(w * 0.0).error_share == 0.0


def test_nvfp4_two_level_scales_and_storage():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(32, 3200, generator=g)
    deq, block_scales, stored = F.nvfp4_quantize(w)
    assert block_scales.dtype == torch.float8_e4m3fn and block_scales.shape == (32, 200)
    tensor_scale = w.abs().amax() / (6 * 448)
    s = (block_scales.float() * tensor_scale)[..., None]
    ratio = deq.reshape(32, 200, 16) / s  # E2M1 values, up to float32 rounding of the division
    assert torch.allclose(F.round_e2m1(ratio), ratio, rtol=1e-6, atol=0)
    assert stored.bits == 32 * 3200 * 4 + 32 * 200 * 8 + 32
    assert (stored.bits - stored.extra_bits) / stored.elements == 4.5  # + 32 bits per tensor
    assert 4.5 < stored.bits_per_weight < 4.501
    assert float(block_scales.float().max()) == 448.0  # the loudest block uses E4M3's top


def test_nvfp4_is_closer_than_mxfp4_on_gaussian_weights():
    w = torch.randn(64, 512, generator=torch.Generator().manual_seed(3))
    err = {n: float((q(w)[0] - w).pow(2).mean()) for n, q in
           (("mx", F.mxfp4_quantize), ("nv", F.nvfp4_quantize))}
    assert err["nv"] < err["mx"]


def test_weight_formats_apply_to_every_linear_layer():
    from inferlab.model.llama import build_model

    model = build_model("tiny", seed=0)
    before = model.lm_head.weight.clone()
    info = F.apply_weight_format_(model, "mxfp4")
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert info["weights"] == n and info["bits"] / n == pytest.approx(4.25)
    assert not torch.equal(model.lm_head.weight, before)
    with pytest.raises(ValueError):
        F.weight_quantizer("fp3")


@pytest.mark.parametrize("scales", ["tensor", "head", "unit"])
def test_fp8_kv_cache_keeps_its_first_scales(scales):
    cls = Fp8KVCache.variant(scales)
    cache = cls(1, 1, 3, 16, 8)
    g = torch.Generator().manual_seed(4)
    k = torch.randn(1, 3, 4, 8, generator=g) * torch.tensor([1.0, 10.0, 100.0])[None, :, None, None]
    v = torch.randn(1, 3, 4, 8, generator=g)
    k_all, v_all = cache.update(0, torch.arange(4), k, v)
    assert cache.k.dtype == torch.float8_e4m3fn
    amax = k.abs().amax(dim=(0, 2, 3))
    want = {"tensor": amax.max().expand(3) / 448, "head": amax / 448, "unit": torch.ones(3)}
    assert torch.allclose(cache.k_scale[0].flatten(), want[scales])
    assert torch.allclose(k_all, k, rtol=0.07, atol=0.02 if scales == "unit" else 1e-6)
    # a later, louder token saturates at the calibrated range instead of rescaling
    loud = torch.full((1, 3, 1, 8), 1e6)
    k_all, _ = cache.update(0, torch.tensor([4]), loud, loud)
    assert torch.allclose(k_all[:, :, 4], 448 * cache.k_scale[0, 0, :, 0].expand(1, 3, 8)
                          .reshape(1, 3, 8))
