"""MoE deployments (inferlab.analysis.moe_deployments): DeepSeek-V3's published layouts, the
bytes each GPU reads, and the bandwidth-floor cost against the published one."""

import pytest

from inferlab.analysis import moe_deployments as md
from inferlab.analysis.moe import MoEConfig


def test_the_published_layouts_hold_every_expert_and_its_redundant_copies():
    v3 = MoEConfig.from_name("deepseek-v3")
    for phase, per_gpu in (("prefill", 9), ("decode", 2)):  # the overview's experts per GPU
        layout = md.deepseek_layout(phase)
        assert layout.experts_per_gpu() == per_gpu
        assert layout.experts_per_gpu() * layout.gpus == v3.n_experts + layout.redundant_experts
    with pytest.raises(ValueError, match="phase"):
        md.deepseek_layout("train")


def test_weight_bytes_per_gpu_splits_only_the_routed_experts():
    v3 = MoEConfig.from_name("deepseek-v3")
    wide, narrow = md.deepseek_layout("decode"), md.deepseek_layout("prefill")
    replicated = (v3.params(0) - v3.vocab_size * v3.d_model)  # FP8: one byte each
    assert md.weight_bytes_per_gpu(wide) == pytest.approx(
        replicated + v3.moe_layers * 2 * v3.expert_params)
    assert md.weight_bytes_per_gpu(narrow) - md.weight_bytes_per_gpu(wide) == pytest.approx(
        v3.moe_layers * 7 * v3.expert_params)
    one_gpu = md.EPLayout("deepseek-v3", 1, 0)  # everything on one GPU: the whole model's read
    assert md.weight_bytes_per_gpu(one_gpu) == pytest.approx(
        v3.decode_bytes_per_step(10**6, "float8_e4m3fn"))


def test_floor_cost_falls_with_batch_and_the_published_cost_is_its_arithmetic():
    layout = md.deepseek_layout("decode")
    costs = [md.decode_floor_usd_per_m(layout, 3.35e12, 2.0, b, 4096) for b in (8, 32, 128)]
    assert costs[0] > costs[1] > costs[2] > 0
    assert 0.98 * 256 < md.experts_touched(layout, 1) < 256  # 144 sequences touch almost all
    assert md.published_decode_usd_per_m() == pytest.approx(8 * 2.0 / 3600 / 14800 * 1e6)


def test_gptoss_fits_its_published_single_gpu_with_mxfp4_experts():
    from inferlab.analysis.published import quote

    oss, layout = MoEConfig.from_name("gpt-oss-120b"), md.gptoss_layout()
    assert layout.gpus == 1 and layout.experts_per_gpu() == oss.n_experts == 128
    assert md.GPTOSS_EXPERT_BYTES == pytest.approx(4.25 / 8)  # 4-bit elements, one 8-bit scale per 32
    lookup = oss.vocab_size * oss.d_model
    every = md.weight_bytes_per_gpu(layout, md.GPTOSS_DTYPE, expert_bytes=md.GPTOSS_EXPERT_BYTES)
    experts = oss.moe_layers * oss.n_experts * oss.expert_params
    assert every == pytest.approx((oss.params(0) - lookup) * 2 + experts * 4.25 / 8)
    memory = quote("gptoss_single_gpu").value * 1e9  # the published 80 GB
    assert every + lookup * 2 < memory < oss.total_params() * 2  # fits in MXFP4, not in bf16
    fit = md.sequences_that_fit(layout, memory, 4096, expert_bytes=md.GPTOSS_EXPERT_BYTES)
    assert fit > 0
    assert every + lookup * 2 + fit * 4096 * md.kv_bytes_per_token(layout, context=4096) <= memory
    assert md.sequences_that_fit(layout, 60e9, 4096, expert_bytes=md.GPTOSS_EXPERT_BYTES) == 0


def test_gptoss_reads_the_experts_its_batch_touches_and_its_windowed_cache():
    oss, layout = MoEConfig.from_name("gpt-oss-120b"), md.gptoss_layout()
    read = [md.weight_bytes_per_gpu(layout, md.GPTOSS_DTYPE, b, md.GPTOSS_EXPERT_BYTES)
            for b in (1, 8, 64, 10**6)]
    replicated = (oss.params(0) - oss.vocab_size * oss.d_model) * 2
    assert read[0] == pytest.approx(replicated + oss.moe_layers * 4 * oss.expert_params * 4.25 / 8)
    assert read[0] < read[1] < read[2] < read[3]
    assert read[3] == pytest.approx(md.weight_bytes_per_gpu(
        layout, md.GPTOSS_DTYPE, expert_bytes=md.GPTOSS_EXPERT_BYTES))
    per_layer = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, bf16
    assert md.kv_bytes_per_token(layout, context=128) == 36 * per_layer  # inside every window
    assert md.kv_bytes_per_token(layout, context=4096) == pytest.approx(
        (18 * 4096 + 18 * 128) * per_layer / 4096)
    with pytest.raises(ValueError, match="context"):
        md.kv_bytes_per_token(layout)
    costs = [md.decode_floor_usd_per_m(layout, 3.35e12, 2.0, b, 4096, md.GPTOSS_DTYPE,
                                       expert_bytes=md.GPTOSS_EXPERT_BYTES) for b in (1, 8, 64)]
    assert costs[0] > costs[1] > costs[2] > 0


def test_the_step_time_model_prices_active_flops_and_touched_bytes():
    ds, oss = md.deepseek_layout("decode"), md.gptoss_layout()
    v3 = MoEConfig.from_name("deepseek-v3")
    head = v3.vocab_size * v3.d_model
    kernels = {k.name: k for k in md.decode_step_kernels(ds, "H100 SXM", 32, 4096)}
    assert kernels["linear"].flops == pytest.approx(2 * (v3.active_params() - 2 * head) * 32)
    assert kernels["linear"].bytes + kernels["lm_head"].bytes == pytest.approx(
        md.weight_bytes_per_gpu(ds, batch_per_gpu=32))
    kw = dict(prec="bf16", weight_dtype="bfloat16", expert_bytes=md.GPTOSS_EXPERT_BYTES)
    for layout, batch, options in ((ds, 32, {}), (ds, 128, {}), (oss, 1, kw), (oss, 64, kw)):
        floor = md.decode_floor_usd_per_m(layout, 3.35e12, 2.0, batch, 4096,
                                          options.get("weight_dtype", "float8_e4m3fn"),
                                          expert_bytes=options.get("expert_bytes"))
        step = md.decode_step_usd_per_m(layout, "H100 SXM", 2.0, batch, 4096, **options)
        # every kernel is memory-bound here, so the model adds only the K/V each step writes
        assert all(k.bound == "memory"
                   for k in md.decode_step_kernels(layout, "H100 SXM", batch, 4096, **options))
        assert floor <= step < 1.001 * floor
    # a batch of 2048 sequences per GPU makes the linear kernels compute-bound: above the floor
    big = md.decode_step_kernels(ds, "H100 SXM", 2048, 256)
    assert {k.name: k.bound for k in big}["linear"] == "compute"
    assert md.decode_step_usd_per_m(ds, "H100 SXM", 2.0, 2048, 256) > 1.1 * \
        md.decode_floor_usd_per_m(ds, 3.35e12, 2.0, 2048, 256)
