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
