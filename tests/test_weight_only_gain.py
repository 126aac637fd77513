"""Chapter 5's conclusion on weight-only int4: its decode speed-up is capped by the weights' share
of the bytes a step reads, because every sequence's KV cache stays 16-bit.

Counted with the course's one model of time (``inferlab.analysis.step_time``) and Chapter 2's
capacity, for Llama-2-7B on an H100 SXM: the gain never beats 1 / ((1 - s) + s / 4), s the
weights' share of the bf16 step's bytes (1 / ((1 - s) + s b / 2) with int4's b bytes per weight,
its 16-bit scale per 128 weights included, as the chapter prices it); it falls as the batch and
the context grow; and the batch at which counting the weights alone still promises 2x does not
fit on the GPU.
"""

import pytest

from inferlab.analysis import formulas
from inferlab.analysis.capacity import capacity
from inferlab.analysis.hardware import get_device_spec
from inferlab.analysis.step_time import Shape, StepModel
from inferlab.model.config import ModelConfig

LLAMA7 = ModelConfig.from_name("llama-2-7b")
H100 = get_device_spec("H100 SXM")
BF16 = StepModel.for_device(LLAMA7, H100, "bf16")
W4 = StepModel.for_device(LLAMA7, H100, "int4 weights g128")  # the precision Chapter 5 prices


def gain(batch, context):
    return BF16.decode_s(batch, batch * context) / W4.decode_s(batch, batch * context)


def weight_share(batch, context):
    kernels = BF16.kernels(Shape.decode(batch, batch * context))
    return BF16.weight_bytes_read() / sum(k.bytes for k in kernels)


@pytest.mark.parametrize("batch", [1, 16, 74, 116, 148, 295])
@pytest.mark.parametrize("context", [128, 1024, 4096])
def test_the_gain_never_beats_the_weights_share_of_the_bytes(batch, context):
    s = weight_share(batch, context)
    assert W4.precision.bytes_per_kv == BF16.precision.bytes_per_kv == 2  # the cache stays bf16
    b = W4.precision.bytes_per_weight
    assert b == pytest.approx(formulas.quantized_bytes_per_weight(4, 128)) == 0.5 + 2 / 128
    assert 1.0 <= gain(batch, context) <= 1 / ((1 - s) + s * b / 2) * (1 + 1e-9)


def test_the_gain_falls_with_the_batch_and_the_context():
    batches = [1, 8, 16, 32, 64, 128]
    for context in (256, 1024, 4096):
        gains = [gain(b, context) for b in batches]
        assert gains == sorted(gains, reverse=True)
    assert gain(16, 256) > gain(16, 1024) > gain(16, 4096)
    # at 1,024 tokens the KV cache already takes most of a 16-sequence step: well under 4x
    assert gain(16, 1024) < 2.0 < gain(1, 1024)


def test_the_weights_only_critical_batch_and_twice_it():
    """Counting weights alone, int4 is still ~2x at twice its critical batch; with the cache it
    is barely faster there, and that batch does not fit on one GPU in either precision."""
    peak = H100.peak_flops("bfloat16")
    crit4 = round(formulas.critical_batch_size(peak, H100.bandwidth, 0.5))
    assert crit4 == 74
    assert gain(2 * crit4, 1024) < 1.15
    weights4 = formulas.param_count(LLAMA7) * W4.precision.bytes_per_weight
    assert capacity(LLAMA7, H100, 1024).max_requests < capacity(
        LLAMA7, H100, 1024, weights=weights4).max_requests < 2 * crit4
