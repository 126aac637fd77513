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
    head = v3.vocab_size * v3.d_model
    replicated = (v3.params(0) - 2 * head) + 2 * head  # FP8 one byte each, the bf16 head two
    assert md.weight_bytes_per_gpu(wide) == pytest.approx(
        replicated + v3.moe_layers * 2 * v3.expert_params)
    assert md.weight_bytes_per_gpu(narrow) - md.weight_bytes_per_gpu(wide) == pytest.approx(
        v3.moe_layers * 7 * v3.expert_params)
    one_gpu = md.EPLayout("deepseek-v3", 1, 0)  # everything on one GPU: the whole model's read
    assert md.weight_bytes_per_gpu(one_gpu) == pytest.approx(
        v3.decode_bytes_per_step(10**6, "float8_e4m3fn") + head)   # the head's second byte


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
    # DeepSeek-V3 keeps its output head in bf16 beside FP8 linears: 2 bytes a weight, read once
    assert kernels["lm_head"].bytes == pytest.approx(2 * head)
    assert md.weight_bytes_per_gpu(ds, head_dtype=None) == pytest.approx(
        md.weight_bytes_per_gpu(ds) - head)
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


def test_the_published_operating_point_is_the_statistics_arithmetic():
    point = md.published_operating_point()
    assert point.tokens_per_gpu_s == 14800 / 8
    assert point.batch_per_gpu == pytest.approx(14800 / 8 / 21)   # 20-22 tokens/s a sequence
    assert point.context == 4989
    assert md.mtp_tokens_per_step() == (1.85, 1.90)


def test_the_all_to_all_is_counted_per_token_through_each_nic():
    ds = md.deepseek_layout("decode")
    a2a = md.deepseek_all_to_all(ds)
    v3 = MoEConfig.from_name("deepseek-v3")
    assert (a2a.ep, a2a.layers, a2a.experts_per_token, a2a.hidden) == (144, 58, 8, 7168)
    assert a2a.kernel == "rdma" and not a2a.fixed_latency
    # every MoE layer: 8 DeepEP messages out (FP8 + a 4-byte scale per 128 + 16 bytes) and 8
    # bf16 rows back; the Feb-2025 kernel sends all but the GPU's own through its NIC
    per_token = v3.moe_layers * 143 / 144 * 8 * ((7168 + 224 + 16) + 2 * 7168)
    assert a2a.layers * (a2a.nic_bytes_per_token("dispatch")
                         + a2a.nic_bytes_per_token("combine")) == pytest.approx(per_token)
    nvlink = md.deepseek_all_to_all(ds, kernel="nvlink")
    assert nvlink.nic_bytes_per_token("combine") == pytest.approx(
        136 / 143 * a2a.nic_bytes_per_token("combine"))
    point = md.published_operating_point()
    parts = md.step_parts(ds, "H100 SXM", point.batch_per_gpu, point.context, a2a)
    assert parts["combine latency"] == 0                      # the achieved-bandwidth bound
    assert parts["combine bytes"] == pytest.approx(
        a2a.layers * point.batch_per_gpu * a2a.nic_bytes_per_token("combine")
        / a2a.nic_bandwidth("combine"))
    # with MTP each sequence runs 2 tokens through the layers: twice the rows on the wire
    two = md.step_parts(ds, "H100 SXM", point.batch_per_gpu, point.context, a2a, positions=2)
    assert two["dispatch bytes"] == pytest.approx(2 * parts["dispatch bytes"])
    fixed = md.deepseek_all_to_all(ds, fixed_latency=True)
    both = md.step_parts(ds, "H100 SXM", point.batch_per_gpu, point.context, fixed, positions=2)
    assert both["dispatch latency"] == pytest.approx(58 * fixed.latency_s("dispatch"))
    assert both["dispatch latency"] == md.step_parts(ds, "H100 SXM", point.batch_per_gpu,
                                                     point.context, fixed)["dispatch latency"]


def test_core_mla_is_priced_at_bf16_beside_fp8_matmuls():
    ds = md.deepseek_layout("decode")
    model, shape, _ = md._step(ds, "H100 SXM", 88, 4989, positions=2)
    assert model.precision.compute == "fp8" and model.peak_flops == 1979e12
    assert model.attention.compute == "bfloat16" and model.attention_peak_flops == 989e12
    k = {x.name: x for x in model.kernels(shape)}
    assert k["attention"].compute_s == pytest.approx(k["attention"].flops / 989e12)
    assert k["attention"].bound == "compute"                  # two positions a sequence


def test_deepseeks_published_costs_and_profile():
    # $87,072 a day for every node over 168B output tokens; the decode-only derivation
    assert md.published_daily_usd_per_m() == pytest.approx(87072 / 168e3)
    assert 226.75 * 8 * 24 * 2 == 87072                       # the overview's own arithmetic
    assert md.published_decode_usd_per_m() < md.published_daily_usd_per_m()
    profile = md.profile_operating_point()
    assert (profile.batch_per_gpu, profile.context) == (128, 4096)


def test_the_network_bounds_bracket_the_step():
    ds, point = md.deepseek_layout("decode"), md.published_operating_point()
    low, high = (md.deepseek_all_to_all(ds, fixed_latency=f) for f in (False, True))
    b, c = point.batch_per_gpu, point.context
    steps = [md.decode_step_s(ds, "H100 SXM", b, c, a, overlap=True) for a in (low, high)]
    alone = md.decode_step_s(ds, "H100 SXM", b, c)
    assert alone < steps[0] < steps[1]          # 44 tokens a micro-batch: below DeepEP's 128


def test_two_batch_overlap_costs_the_larger_of_compute_and_communication():
    ds = md.deepseek_layout("decode")
    a2a = md.deepseek_all_to_all(ds)
    b, c = 64, 4096
    alone = md.decode_step_s(ds, "H100 SXM", b, c)                  # no network
    serial = md.decode_step_s(ds, "H100 SXM", b, c, a2a)
    overlapped = md.decode_step_s(ds, "H100 SXM", b, c, a2a, overlap=True)
    half = md.step_parts(ds, "H100 SXM", b / 2, c, a2a)
    talk = 2 * sum(v for k, v in half.items() if k.startswith(("dispatch", "combine")))
    compute = 2 * (half["linear"] + half["attention"] + half["lm_head"])
    assert overlapped == pytest.approx(max(talk, compute))
    assert alone < overlapped < serial
    assert overlapped > serial - min(talk, compute)        # never the sum minus both
    # the floor <= the step without a network <= the one with it, at one price
    floor = md.decode_floor_usd_per_m(ds, 3.35e12, 2.0, b, c)
    assert floor <= md.decode_step_usd_per_m(ds, "H100 SXM", 2.0, b, c) < \
        md.decode_step_usd_per_m(ds, "H100 SXM", 2.0, b, c, all_to_all=a2a, overlap=True)


def test_the_dearer_all_to_all_bound_is_taken_at_a_calls_width():
    """Both bounds reproduce DeepEP's times at its own batch; below it the one with a per-call
    latency costs more, above it the one at the achieved bandwidth."""
    ds = md.deepseek_layout("decode")
    width = md.deepep_tokens()
    assert width == 128
    for tokens in (16, 44, 127, 129, 400):
        chosen = md.deepseek_all_to_all_at(ds, tokens)
        both = [md.deepseek_all_to_all(ds, fixed_latency=f) for f in (False, True)]
        for phase in ("dispatch", "combine"):
            cost = chosen.cost(phase, tokens)
            assert cost.latency_s + cost.transfer_s == pytest.approx(
                max(c.cost(phase, tokens).latency_s + c.cost(phase, tokens).transfer_s
                    for c in both))
        assert chosen.fixed_latency == (tokens < width)


def test_at_the_published_point_the_latency_bound_lets_the_nic_bind_the_overlapped_step():
    """Chapter 10's statement. Two micro-batches of 44 tokens: each re-reads the weights, so
    the computation side is about twice the sequential one; the communication side pays every
    call's latency twice. With DeepEP's per-call latency (the shared default below 128 tokens a
    call) the NIC binds; without it the two sides are level, the computation a hair ahead."""
    ds, point = md.deepseek_layout("decode"), md.published_operating_point()
    b, c = point.batch_per_gpu, point.context
    chosen = md.deepseek_all_to_all_at(ds, b / 2)
    assert chosen.fixed_latency
    work, talk = md.overlap_sides(ds, "H100 SXM", b, c, chosen)
    assert md.decode_step_s(ds, "H100 SXM", b, c, chosen, overlap=True) == pytest.approx(talk)
    assert talk > 1.3 * work
    free_work, free_talk = md.overlap_sides(ds, "H100 SXM", b, c, md.deepseek_all_to_all(ds))
    assert free_work == work and free_talk < free_work < 1.01 * free_talk
    # the sequential parts of the same step, the weights read once
    parts = md.step_parts(ds, "H100 SXM", b, c)
    once = parts["linear"] + parts["attention"] + parts["lm_head"]
    assert 1.3 * once < work < 2 * once
