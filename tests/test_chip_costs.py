"""The chips of 2026 and their prices: sourced rows, cost per token by precision, reasoning
output as a cost driver, owning against renting."""

import dataclasses
import math

import pytest

from inferlab.analysis import chip_costs as cc
from inferlab.analysis.hardware import load_hardware
from inferlab.analysis.step_time import StepModel
from inferlab.sim.token_cost import usd_per_million
from inferlab.data import read_table
from inferlab.model.config import ModelConfig

LLAMA70 = ModelConfig.from_name("llama-3-70b")


def test_a_row_without_a_source_or_a_date_is_refused(monkeypatch):
    good = dict(read_table("chips_2026.csv")[0])
    for broken in ({**good, "source": ""}, {**good, "date": "soon"}, {**good, "status": "sure"}):
        monkeypatch.setattr(cc, "read_table", lambda name, row=broken: [row])
        with pytest.raises(ValueError):
            cc.load_chips()


def test_the_chips_match_their_sources_and_missing_numbers_stay_empty():
    chips = cc.load_chips()
    assert set(chips) == {"GB300 NVL72 (per GPU)", "B300 (HGX)", "MI355X", "TPU7x (Ironwood)",
                          "Rubin (VR200 NVL72, per GPU)", "MI455X (Helios, per GPU)"}
    assert {n for n, c in chips.items() if c.shipping} == {
        "GB300 NVL72 (per GPU)", "B300 (HGX)", "MI355X", "TPU7x (Ironwood)"}
    # the HBM4 generation: announced memory and bandwidth, no dense peak in any source read
    rubin, mi455 = chips["Rubin (VR200 NVL72, per GPU)"], chips["MI455X (Helios, per GPU)"]
    assert (rubin.spec.memory, rubin.spec.bandwidth) == (288e9, 22e12)
    assert (mi455.spec.memory, mi455.spec.bandwidth) == (432e9, 19.6e12)
    for c in (rubin, mi455):
        assert not c.shipping and "announced" in c.availability
        assert c.spec.peak_bf16 is None and c.spec.peak_fp8 is None and c.spec.peak_fp4 is None
    tpu = chips["TPU7x (Ironwood)"]
    # docs.cloud.google.com/tpu/docs/tpu7x, 'System architecture'
    assert (tpu.spec.peak_bf16, tpu.spec.peak_fp8, tpu.spec.bandwidth) == (2307e12, 4614e12,
                                                                           7380e9)
    assert tpu.spec.memory == 192 * 2**30
    assert tpu.spec.peak_fp4 is None and tpu.tdp_w is None        # not published: not guessed
    gb300 = chips["GB300 NVL72 (per GPU)"]
    assert gb300.spec.peak_fp4 * 72 == pytest.approx(1080e15)     # the rack's dense FP4
    assert gb300.spec.bandwidth * 72 == pytest.approx(576e12)      # the rack's HBM bandwidth
    mi = chips["MI355X"]
    assert (mi.spec.peak_bf16, mi.spec.peak_fp8, mi.spec.peak_fp4, mi.tdp_w) == \
        (2.5e15, 5e15, 10e15, 1400)


def test_the_new_chips_stay_out_of_the_hardware_table():
    """Chapters 1 and 8 print every row of data/hardware.csv; the new chips live apart."""
    every = load_hardware(kinds=None)
    assert not set(cc.load_chips()) & set(every)


def test_fp4_is_each_vendors_block_format_with_its_scales():
    import torch

    from inferlab.model.formats import mxfp4_quantize, nvfp4_quantize

    nv, amd = cc.chip_precision(cc.chip("B300 (HGX)"), "fp4"), cc.chip_precision(
        cc.chip("MI355X"), "fp4")
    assert nv.name == "nvfp4" and amd.name == "mxfp4"
    assert nv.bytes_per_weight == pytest.approx(4.5 / 8)    # 16 E2M1 + one E4M3 scale
    assert amd.bytes_per_weight == pytest.approx(4.25 / 8)  # 32 E2M1 + one E8M0 scale
    # the same bits as the emulated formats store (NVFP4's one FP32 tensor scale aside)
    w = torch.randn(64, 4096)
    assert nvfp4_quantize(w)[2].bits_per_weight == pytest.approx(4.5, abs=1e-3)
    assert mxfp4_quantize(w)[2].bits_per_weight == pytest.approx(4.25)
    for p in (nv, amd):
        assert p.bytes_per_kv == 1 and p.compute == "fp4"
    with pytest.raises(ValueError, match="prec must be one of"):
        cc.chip_precision(cc.chip("MI355X"), "int3")


def test_a_decode_point_is_the_step_time_model_and_the_cost_is_price_over_throughput():
    b300 = cc.chip("B300 (HGX)")
    point = cc.decode_point(LLAMA70, b300, "fp8", 64, 2000)
    model = StepModel.for_device(LLAMA70, b300.spec, cc.chip_precision(b300, "fp8"))
    assert model.peak_flops == 4500e12          # W8A8 at the FP8 peak, not the 16-bit one
    assert point.step_s == pytest.approx(model.decode_s(64, 64 * 2001))
    assert point.tokens_per_s == pytest.approx(64 / point.step_s)
    assert point.usd_per_m_output(7.4) == pytest.approx(usd_per_million(7.4, 64 / point.step_s))


def test_lower_precision_serves_more_tokens_on_every_chip_that_has_the_peak():
    table = cc.precision_table("llama-3-70b", 2000, 0.05)
    for name, chip in cc.load_chips().items():
        if chip.spec.peak_bf16 is None:             # announced HBM4 chips: no peak to price at
            assert all(table[name, p] is None for p in cc.CHIP_PRECISIONS)
            continue
        bf16, fp8, fp4 = (table[name, p] for p in ("bf16", "fp8", "fp4"))
        assert fp8.tokens_per_s > bf16.tokens_per_s
        assert fp8.batch > bf16.batch               # half the cache bytes: more sequences fit
        if fp4 is not None:
            assert fp4.tokens_per_s > fp8.tokens_per_s
        for p in (bf16, fp8, fp4):
            if p is not None:
                assert p.step_s <= 0.05
    assert table["TPU7x (Ironwood)", "fp4"] is None
    with pytest.raises(ValueError, match="no fp4 peak"):
        cc.decode_point(LLAMA70, cc.chip("TPU7x (Ironwood)"), "fp4", 1, 2000)


def test_best_point_is_the_largest_batch_within_the_bound():
    mi = cc.chip("MI355X")
    tight = cc.best_point(LLAMA70, mi, "bf16", 2000, 0.02)
    assert tight.step_s <= 0.02
    assert tight.batch == cc.max_batch(LLAMA70, mi, "bf16", 2000) or \
        cc.decode_point(LLAMA70, mi, "bf16", tight.batch + 1, 2000).step_s > 0.02
    with pytest.raises(ValueError, match="cannot decode"):
        cc.best_point(LLAMA70, mi, "bf16", 2000, 1e-4)


def test_an_api_request_costs_what_its_row_says():
    rows = {p.provider: p for p in cc.api_prices_2026()}
    opus = rows["Anthropic"]
    assert (opus.usd_per_m_input, opus.usd_per_m_cached_input, opus.usd_per_m_output,
            opus.batch_discount) == (4.0, 0.2, 20.0, 0.5)
    plain = cc.api_request_usd(opus, 10_000, 1_000)
    assert plain == pytest.approx((10_000 * 4 + 1_000 * 20) / 1e6)
    assert cc.api_request_usd(opus, 10_000, 1_000, batch=True) == pytest.approx(plain / 2)
    cached = cc.api_request_usd(opus, 10_000, 1_000, cached_share=0.9)
    assert cached == pytest.approx((1_000 * 4 + 9_000 * 0.2 + 1_000 * 20) / 1e6)
    # the output count sets a reasoning model's bill: 32K thoughts against a 250-token answer
    long = cc.api_request_usd(opus, 1_000, 32_000)
    assert long - cc.api_request_usd(opus, 1_000, 250) == pytest.approx(31_750 * 20 / 1e6)
    gemini = rows["Google"]
    with pytest.raises(ValueError, match="cached-input"):
        cc.api_request_usd(gemini, 1_000, 100, cached_share=0.5)
    # a row that publishes no batch discount cannot price a batch request
    with pytest.raises(ValueError, match="batch"):
        cc.api_request_usd(dataclasses.replace(gemini, batch_discount=None), 1_000, 100,
                           batch=True)


def test_a_long_reasoning_output_makes_each_self_hosted_token_dearer():
    b300 = cc.chip("B300 (HGX)")
    short = cc.self_hosted_request_usd(LLAMA70, b300, "fp8", 1000, 250, 0.05, 7.4)
    long = cc.self_hosted_request_usd(LLAMA70, b300, "fp8", 1000, 5500, 0.05, 7.4)
    assert long / 5500 > short / 250          # the growing cache cuts the batch


def test_the_daily_load_and_the_cost_inputs():
    load = cc.daily_load(8, 2, peak_hour=14)
    assert max(load) == pytest.approx(8) and load[14] == pytest.approx(8)
    assert min(load) == pytest.approx(2) and load[2] == pytest.approx(2)
    assert sum(load) / 24 == pytest.approx(5)
    kwh = cc.cost_input("electricity_industrial_middle_atlantic")
    assert (kwh.value, kwh.unit) == (9.04, "US cents per kWh")
    with pytest.raises(ValueError):
        cc.cost_input("free_lunch")


def test_own_against_rent():
    flat = cc.own_vs_rent([4.0] * 24, rent_usd_per_hour=7.4, tdp_w=1100, usd_per_kwh=0.0904)
    assert flat.owned_chips == 4 and flat.utilisation == pytest.approx(1)
    assert flat.power_usd_per_day == pytest.approx(4 * 24 * 1.1 * 0.0904)
    assert flat.break_even_usd_per_chip_year == pytest.approx((7.4 - 1.1 * 0.0904) * 8760)
    cycle = cc.own_vs_rent(cc.daily_load(4, 1), 7.4, 1100, 0.0904)
    assert cycle.owned_chips == 4 and cycle.utilisation < 1
    assert cycle.break_even_usd_per_chip_year < flat.break_even_usd_per_chip_year
    dearer_power = cc.own_vs_rent(cc.daily_load(4, 1), 7.4, 1100, 0.1729)
    assert dearer_power.break_even_usd_per_chip_year < cycle.break_even_usd_per_chip_year
    assert math.isclose(cycle.rent_usd_per_chip_year,
                        sum(math.ceil(x) for x in cc.daily_load(4, 1)) * 7.4 * 365 / 4)
    with pytest.raises(ValueError):
        cc.own_vs_rent([1.0] * 23, 7.4, 1100, 0.09)


def test_power_beyond_the_chip():
    # NVIDIA's DGX B200 guide: 14.3 kW max for 8 GPUs of 1,000 W
    system = cc.cost_input("node_power_dgx_b200").value
    other = cc.server_other_w(system, 8, 1000)
    assert other == pytest.approx((14300 - 8000) / 8)
    pue = cc.cost_input("pue_industry_average").value
    chip_only = cc.own_vs_rent([4.0] * 24, 7.4, 1100, 0.0904)
    wall = cc.own_vs_rent([4.0] * 24, 7.4, 1100, 0.0904, other_w=other, pue=pue)
    assert wall.watts_per_chip == pytest.approx((1100 + other) * pue)
    assert wall.power_usd_per_day == pytest.approx(chip_only.power_usd_per_day
                                                   * (1100 + other) * pue / 1100)
    assert wall.break_even_usd_per_chip_year < chip_only.break_even_usd_per_chip_year
    with pytest.raises(ValueError):
        cc.own_vs_rent([4.0] * 24, 7.4, 1100, 0.0904, pue=0.9)
    with pytest.raises(ValueError):
        cc.server_other_w(7000, 8, 1000)


def test_each_kernel_class_says_what_binds_it():
    """FP8's bytes at the 16-bit peak, and FP8 itself, at their best batches on the B300: the
    linear kernel turns compute-bound while the cache reads stay memory-bound, which a sum over
    the kernels would hide."""
    b300 = cc.chip("B300 (HGX)")
    model = StepModel.for_device(LLAMA70, b300.spec, cc.chip_precision(b300, cc.BYTES_ONLY))
    assert model.peak_flops == b300.spec.peak_flops("bfloat16")
    assert cc.chip_precision(b300, cc.BYTES_ONLY).bytes_per_weight == 1
    bf16 = cc.best_point(LLAMA70, b300, "bf16", 2000, 0.05)
    assert bf16.memory_bound and all(k.memory_s >= k.compute_s for k in bf16.kernels)
    for prec in (cc.BYTES_ONLY, "fp8"):
        point = cc.best_point(LLAMA70, b300, prec, 2000, 0.05)
        linear, attention = point.kernel("linear"), point.kernel("attention")
        assert linear.compute_s > linear.memory_s and linear.bound == "compute"
        assert attention.bound == "memory" and not point.memory_bound
        assert point.step_s == pytest.approx(sum(k.seconds for k in point.kernels))
