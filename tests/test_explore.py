"""The roofline explorer: its numbers agree with the formulas and FACTS.md; the figure and the
widget build."""

import math

import matplotlib

matplotlib.use("Agg")

import pytest

from inferlab.analysis import explore, formulas
from inferlab.analysis.hardware import get_device_spec
from inferlab.model.config import ModelConfig


def test_batch_one_llama2_7b_on_a100_matches_the_published_ceiling():
    # FACTS.md: Llama-2-7B's non-embedding bf16 weights are about 13.3 GB, so at 2,039 GB/s
    # batch-1 decode cannot exceed about 153 tokens/s.
    p = explore.decode_point("A100 80GB SXM", "llama-2-7b", batch=1, dtype="bfloat16")
    assert p.weight_bytes == pytest.approx(13.3e9, rel=0.01)
    assert p.tokens_per_s == pytest.approx(153, rel=0.01)
    assert p.bound == "memory" and p.intensity == pytest.approx(1.0, rel=0.01)
    # every kernel memory-bound: the step reads the weights and two tokens' K/V (the new
    # token's, written and then read)
    kv2 = 2 * formulas.kv_bytes_per_token(ModelConfig.from_name("llama-2-7b"))
    assert p.step_time == pytest.approx(formulas.decode_time_floor(p.bytes + kv2, 2039e9))


def test_past_the_critical_batch_the_step_is_compute_bound():
    spec = get_device_spec("H100 SXM")
    critical = formulas.critical_batch_size(spec.peak_bf16, spec.bandwidth, 2)
    below = explore.decode_point(spec, "llama-3-8b", batch=2 ** int(math.log2(critical) - 1))
    above = explore.decode_point(spec, "llama-3-8b", batch=2 ** int(math.log2(critical) + 2))
    assert below.bound == "memory" and above.bound == "compute"
    linear = next(k for k in above.kernels if k.name == "linear")
    assert linear.bound == "compute" and above.step_time > above.flops / spec.peak_bf16
    assert below.ridge == pytest.approx(formulas.ridge_point(spec.peak_bf16, spec.bandwidth))


def test_context_adds_the_whole_batchs_kv_cache_and_can_overflow_memory():
    config = ModelConfig.from_name("llama-3-8b")
    p = explore.decode_point("H100 SXM", config, batch=64, context=4096)
    assert p.kv_bytes == formulas.kv_bytes(config, 4096, "bfloat16", 64)
    assert p.flops == 64 * formulas.flops_per_token(config, 4096)
    assert p.fits is True
    assert explore.decode_point("H100 SXM", config, batch=1024, context=4096).fits is False
    assert explore.decode_point("Apple M4 Pro", config).fits is None


def test_cpu_rows_have_a_bandwidth_floor_only_and_bad_choices_say_why():
    p = explore.decode_point("DDR5-4800 dual channel", "llama-3-8b")
    assert p.peak_flops is None and p.ridge is None and p.bound == "memory"
    assert p.tokens_per_s == pytest.approx(76.8e9 / p.bytes, rel=1e-4)  # + the new token's K/V
    assert "no FLOP/s figure" in str(p)
    with pytest.raises(ValueError, match="choose float16"):
        explore.decode_point("T4", "llama-3-8b", dtype="bfloat16")
    with pytest.raises(ValueError, match="batch must be"):
        explore.decode_point("T4", "llama-3-8b", batch=0, dtype="float16")


def test_figure_and_widget_build():
    import matplotlib.pyplot as plt

    left, right = explore.plot_explorer("H100 SXM", "llama-3-8b", batch=64, context=4096)
    assert left.get_xlabel().startswith("arithmetic intensity") and right.get_yscale() == "log"
    plt.close("all")
    pytest.importorskip("ipywidgets")
    box = explore.roofline_widget()
    controls = [w for row in box.children[:2] for w in row.children]
    by_name = {w.description: w for w in controls}
    assert set(by_name) == {"device", "model", "dtype", "batch", "context"}
    by_name["device"].value = "T4"  # bfloat16 on a T4: the widget prints why, it does not raise
    by_name["dtype"].value = "float16"
    plt.close("all")
