"""The one step-time model: each kernel class against a hand computation, the sum, precisions,
windows, MLA, tensor parallelism, and the table of what changed against the old single max."""

import pytest

from inferlab.analysis import collectives, formulas, mla
from inferlab.analysis.hardware import get_device_spec
from inferlab.analysis.step_time import (Attention, Shape, StepModel, link_bandwidth,
                                         old_single_max, precision, step_time)
from inferlab.serving.paged_cache import blocks_for
from inferlab.model.config import ModelConfig

LLAMA13 = ModelConfig.from_name("llama-2-13b")
A100 = get_device_spec("A100 80GB SXM")
PEAK, BW = 312e12, 2039e9


def by_name(kernels):
    return {k.name: k for k in kernels}


def test_each_kernel_of_a_decode_step_by_hand():
    # 32 decodes of 500 cached tokens: every row reads 501 tokens of K/V and writes 1
    model = StepModel.for_device(LLAMA13, A100)
    k = by_name(model.kernels(Shape.of_rows([(1, 500)] * 32)))
    linear = formulas.param_count(LLAMA13, include_embeddings=False)
    head = 32000 * 5120
    kv = 2 * 40 * 40 * 128 * 2                          # 800 KiB per token
    assert k["linear"].flops == 2 * linear * 32
    assert k["linear"].seconds == pytest.approx(2 * linear / BW)          # memory-bound
    assert k["attention"].flops == 4 * 40 * 40 * 128 * 32 * 501
    assert k["attention"].bytes == (32 * 501 + 32) * kv
    assert k["attention"].seconds == pytest.approx((32 * 502) * kv / BW)
    assert k["lm_head"].seconds == pytest.approx(2 * head / BW)
    assert "collective" not in k
    total = sum(x.seconds for x in k.values())
    assert model.decode_s(32, 32 * 501) == pytest.approx(total)
    assert step_time([(1, 500)] * 32, LLAMA13, "A100 80GB SXM") == pytest.approx(total)


def test_a_prefill_sums_compute_bound_matmuls_and_a_memory_bound_head():
    model = StepModel.for_device(LLAMA13, A100, overhead_s=1e-3)
    linear = formulas.param_count(LLAMA13, include_embeddings=False)
    pairs = 2000 * 2001 / 2
    by_hand = (2 * linear * 2000 / PEAK + 4 * 40 * 40 * 128 * pairs / PEAK
               + 2 * 32000 * 5120 / BW + 1e-3)
    assert model.prefill_s(2000) == pytest.approx(by_hand)
    # a chunk after a cached part: the i-th new token sees c + i keys
    assert model.rows_s([(256, 1000)]) == pytest.approx(
        model.seconds(Shape(256, 1, 256 * 1000 + 256 * 257 / 2, 1256, 256)))


def test_the_sum_exceeds_the_old_single_max_when_kernels_are_bound_differently():
    # batch 256 at 1,000 tokens on an A100 (ridge 153): the matmuls compute-bound, attention
    # streaming the cache
    model = StepModel.for_device(ModelConfig.from_name("llama-3-8b"), A100)
    shape = Shape.of_rows([(1, 1000)] * 256)
    k = by_name(model.kernels(shape))
    assert k["linear"].bound == "compute" and k["attention"].bound == "memory"
    assert model.seconds(shape) > 1.2 * old_single_max(model, shape)
    # at batch 1 every kernel reads memory, and the two agree
    one = Shape.of_rows([(1, 1000)])
    assert model.seconds(one) == pytest.approx(old_single_max(model, one))


def test_precisions_set_weights_cache_and_arithmetic_apart():
    config = ModelConfig.from_name("llama-3-8b")
    bf16 = StepModel.for_device(config, "H100 SXM")
    int4 = StepModel.for_device(config, "H100 SXM", "int4 weights")
    fp8 = StepModel.for_device(config, "H100 SXM", "fp8")
    shape = Shape.of_rows([(1, 0)])
    assert by_name(int4.kernels(shape))["linear"].bytes == by_name(bf16.kernels(shape))["linear"].bytes / 4
    assert int4.attention.kv_bytes_per_token == bf16.attention.kv_bytes_per_token
    assert fp8.attention.kv_bytes_per_token == bf16.attention.kv_bytes_per_token / 2
    assert fp8.peak_flops == get_device_spec("H100 SXM").peak_fp8 == 1979e12
    with pytest.raises(ValueError, match="no fp8 peak"):
        StepModel.for_device(config, "A100 80GB SXM", "fp8")
    assert precision("bfloat16").name == "bf16"


def test_a_sliding_window_caps_keys_and_cache_reads():
    mistral = ModelConfig.from_name("mistral-7b")
    model = StepModel.for_device(mistral, "H100 SXM")
    assert model.rows_s([(1, 30_000)]) == model.rows_s([(1, 8_000)])
    s = Shape.of_rows([(10, 4090)], window=4096)
    # queries 1..6 see 4091..4096 keys, queries 7..10 the window of 4096
    assert s.pairs == sum(min(4090 + i, 4096) for i in range(1, 11))
    assert s.kv_read == 4096


def test_mla_prices_attention_on_its_latent_cache():
    v3 = mla.MLAShape(61, 7168, 128, 1536, 512, 128, 64, 128)
    attn = mla.attention_cost(v3)
    assert attn == Attention(mla.kv_bytes_per_token(v3), 61 * 128 * (2 * 576 + 2 * 512), kv_heads=1)
    model = StepModel.for_device(LLAMA13, "H100 SXM", attention=attn)
    k = by_name(model.kernels(Shape.of_rows([(1, 999)])))
    assert k["attention"].bytes == 1001 * 61 * 576 * 2


def test_tensor_parallelism_splits_the_cache_only_over_its_kv_heads():
    """MLA caches one latent per token that every head reads: tensor parallelism splits its
    heads' FLOPs but every device reads the whole latent. A grouped-query cache splits over
    its KV heads and is replicated beyond them (vLLM's QKVParallelLinear)."""
    from dataclasses import replace

    v3 = mla.MLAShape(61, 7168, 128, 1536, 512, 128, 64, 128)
    attn = replace(mla.attention_cost(v3), compute="bfloat16")
    shape = Shape.decode(64, 64 * 4096)
    one = by_name(StepModel.for_device(LLAMA13, "H100 SXM", attention=attn).kernels(shape))
    tp8 = by_name(StepModel.for_device(LLAMA13, "H100 SXM", attention=attn, devices=8,
                                       link="NVLink H100").kernels(shape))
    whole = (64 * 4096 + 64) * 61 * 576 * 2
    assert one["attention"].memory_s == pytest.approx(whole / 3.35e12)
    assert tp8["attention"].memory_s == pytest.approx(one["attention"].memory_s)  # not / 8
    assert tp8["attention"].compute_s == pytest.approx(one["attention"].compute_s / 8)
    assert tp8["attention"].bytes == pytest.approx(8 * whole)        # eight full copies read
    # Llama-3-70B has 8 KV heads: split over 8 devices, replicated twice over 16
    config = ModelConfig.from_name("llama-3-70b")
    kv = {n: by_name(StepModel.for_device(config, "H100 SXM", devices=n, link="NVLink H100")
                     .kernels(shape))["attention"].memory_s for n in (1, 8, 16)}
    assert kv[8] == pytest.approx(kv[1] / 8) and kv[16] == pytest.approx(kv[8])


def test_tensor_parallel_splits_work_and_adds_its_collectives():
    config = ModelConfig.from_name("llama-3-70b")
    one = StepModel.for_device(config, "H100 SXM")
    four = StepModel.for_device(config, "H100 SXM", devices=4)
    assert four.link.name == "NVLink H100" and four.link.bandwidth == link_bandwidth("NVLink H100") == 450e9
    shape = Shape.of_rows([(1, 1000)] * 64)
    k1, k4 = by_name(one.kernels(shape)), by_name(four.kernels(shape))
    assert k4["linear"].seconds == pytest.approx(k1["linear"].seconds / 4)
    # 2 all-reduces a layer and one for the vocab-parallel embedding, each of 64 tokens x 8192
    # bf16 activations; one gather of 64 rows of vocabulary-wide logits
    assert four.all_reduce_calls() == 161 and four.gather_calls() == 1
    message, logits = 64 * 8192 * 2, 64 * 128256 * 2
    call = collectives.all_reduce(four.link, message, 4)
    gather = collectives.nccl_gather(four.link, logits, 4)
    k = k4["collective"]
    assert k.latency_s == pytest.approx(161 * call.latency_s + gather.latency_s)
    assert k.memory_s == pytest.approx(161 * call.transfer_s + gather.transfer_s)
    assert k.bytes == pytest.approx(161 * call.bytes + gather.bytes)   # each algorithm's count
    assert gather.bytes == pytest.approx(3 / 4 * logits)
    with pytest.raises(ValueError, match="no GPU link"):
        StepModel.for_device(config, "H100 PCIe", devices=2)


def test_llama_3_70b_at_tp8_pays_its_calls_latency_at_batch_1():
    config = ModelConfig.from_name("llama-3-70b")
    eight = StepModel.for_device(config, "H100 SXM", devices=8)
    assert eight.all_reduce_calls() == 161 and eight.gather_calls() == 1   # vLLM's 162 calls
    one_token = by_name(eight.kernels(Shape.decode(1, 1024)))["collective"]
    # a 16 KiB message: vLLM's one-shot kernel, its fitted latency, (N - 1) x S bytes
    latency, bandwidth = collectives.custom_fits()["NVLink H100"]
    gather = collectives.nccl_gather(eight.link, 128256 * 2, 8)
    assert one_token.latency_s == pytest.approx(161 * latency + gather.latency_s)
    assert one_token.memory_s == pytest.approx(161 * 8192 * 2 / bandwidth + gather.transfer_s)
    assert one_token.bytes == pytest.approx(161 * 7 * 8192 * 2 + gather.bytes)
    assert one_token.bound == "latency" and one_token.latency_s > 10 * one_token.memory_s
    # a link given as bare bytes/s has no latency: the old bandwidth-only model
    free = StepModel.for_device(config, "H100 SXM", devices=8, link=450e9)
    bare = by_name(free.kernels(Shape.decode(1, 1024)))["collective"]
    assert bare.latency_s == 0 and bare.memory_s == pytest.approx(
        161 * 2 * 7 / 8 * 16384 / 450e9 + 7 / 8 * 128256 * 2 / 450e9)


def test_attention_runs_at_its_own_formats_peak():
    """DeepSeek runs core MLA in BF16 beside FP8 matmuls: attention's arithmetic is priced at
    the BF16 peak, the linear layers' at FP8's."""
    from dataclasses import replace

    v3 = mla.MLAShape(61, 7168, 128, 1536, 512, 128, 64, 128)
    attn = mla.attention_cost(v3)
    fp8 = StepModel.for_device(LLAMA13, "H100 SXM", "fp8", attention=attn)
    mixed = StepModel.for_device(LLAMA13, "H100 SXM", "fp8", attention=replace(attn, compute="bfloat16"))
    assert fp8.attention_peak_flops is None and mixed.attention_peak_flops == 989e12
    shape = Shape.of_rows([(2, 4000)] * 256)      # two positions a sequence: MTP's verification
    a8, a16 = by_name(fp8.kernels(shape))["attention"], by_name(mixed.kernels(shape))["attention"]
    assert a16.compute_s == pytest.approx(1979 / 989 * a8.compute_s)   # the two peaks
    assert a16.bound == "compute" and a8.bound == "memory"
    assert by_name(mixed.kernels(shape))["linear"] == by_name(fp8.kernels(shape))["linear"]


def test_two_batch_overlap_hides_only_the_smaller_of_compute_and_communication():
    config = ModelConfig.from_name("llama-3-70b")
    model = StepModel.for_device(config, "H100 SXM", devices=8, link="InfiniBand NDR")
    shape = Shape.decode(64, 64 * 1024)
    half = by_name(model.kernels(shape.times(0.5)))
    compute = 2 * sum(k.seconds for n, k in half.items() if n != "collective")
    talk = 2 * half["collective"].seconds
    assert model.overlapped_s(shape) == pytest.approx(max(compute, talk))
    # never cheaper than either sum, and each micro-batch reads the weights again
    assert model.overlapped_s(shape) >= max(compute, talk)
    assert compute > sum(k.seconds for k in model.kernels(shape) if k.name != "collective")
    assert model.overlapped_s(shape, micro_batches=1) == pytest.approx(
        max(model.seconds(shape) - by_name(model.kernels(shape))["collective"].seconds,
            by_name(model.kernels(shape))["collective"].seconds))


def test_blocks_for_tokens_is_a_ceiling():
    assert [blocks_for(n, 16) for n in (0, 1, 16, 17)] == [0, 1, 1, 2]


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-3-8b", "qwen2.5-7b"])
def test_what_a_step_reads_is_formulas_decode_bytes_and_the_memory_held_includes_the_embedding(name):
    # one meaning each: formulas.weight_bytes is what the weights occupy (input embedding
    # included); a step reads the linear layers and the LM head (formulas.decode_bytes_per_step)
    config = ModelConfig.from_name(name)
    model = StepModel.for_device(config, "H100 SXM", "int4 weights")
    assert model.weight_bytes_read() == formulas.decode_bytes_per_step(config, 0.5)
    assert formulas.weight_bytes(config, 0.5) >= model.weight_bytes_read()


def test_the_cpu_fit_recovers_a_planted_overhead_and_efficiency():
    """``step_fit`` fits overhead and efficiency to measured steps; on steps made by a known
    model it gets them back, and its held-out errors are then zero."""
    from dataclasses import replace

    from inferlab.sim.step_fit import Sample, agreement, fit

    config = ModelConfig.from_name("tiny")
    roof = StepModel.for_roof(config, 50e9, 10e9, "float32")
    truth = replace(roof, overhead_s=2e-3, efficiency=0.4)
    samples = [Sample(((t, 0),), 0, 0, 0.0) for t in (8, 16, 32, 64, 128, 256)] + \
        [Sample((), n, n * c, 0.0) for n in (1, 4, 16, 64) for c in (16, 128)] + \
        [Sample(((t, c),), n, n * 64, 0.0) for t in (16, 64) for c in (0, 32) for n in (2, 8)]
    samples = [replace(s, seconds=truth.seconds(s.shape())) for s in samples]
    got = fit(roof, samples)
    assert got.overhead_s == pytest.approx(2e-3, rel=1e-6)
    assert got.efficiency == pytest.approx(0.4, rel=1e-6)
    report = agreement(roof, samples)
    assert max(abs(e) for e in report.step_model_errors) < 1e-6
    assert "held-out" in report.table()


def test_a_mixture_of_experts_reads_the_bytes_it_touches_and_computes_with_its_active_weights():
    model = StepModel.for_device(ModelConfig.from_name("llama-3-8b"), "H100 SXM", "bf16")
    touched = 3 * model.linear_params * model.precision.bytes_per_weight
    shape = Shape.decode(8, 8 * 1024)
    d = {k.name: k for k in model.kernels(shape)}
    m = {k.name: k for k in model.kernels(shape, linear_bytes=touched)}
    assert m["linear"].flops == d["linear"].flops and m["linear"].bytes == touched
    assert d["linear"].bytes == touched / 3 and m["linear"].memory_s == 3 * d["linear"].memory_s
    assert m["attention"] == d["attention"] and m["lm_head"] == d["lm_head"]
