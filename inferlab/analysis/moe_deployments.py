"""Mixtures of experts on their published deployments: bytes per GPU and cost per output token.

Chapter 8's cost tables price dense models on one device or a tensor-parallel group. A large
mixture of experts is served differently (Chapter 10): with **expert parallelism** and
**data-parallel attention**, each of N GPUs keeps every non-expert weight (attention, dense
layers, shared experts, router, embeddings) and (E + R) / N of each MoE layer's routed experts
(R redundant copies of hot experts), and runs attention for its own sequences. DeepSeek publishes
such layouts for DeepSeek-V3/R1 (``data/published.csv``: ``deepseek_prefill_layout``,
``deepseek_decode_layout``; DeepSeek-AI 2025, inference-system overview).

At decode, once the group's global batch touches every expert (Chapter 10: E [1 - (1 - k/E)^B]
per layer), each GPU reads per step its replicated weights, its local experts and its own
sequences' KV cache. ``weight_bytes_per_gpu`` counts the weights from the model's published shape
(``inferlab.analysis.moe``); ``decode_floor_usd_per_m`` prices an output token at that bandwidth
floor with Chapter 8's formula (``prices.bandwidth_floor_usd_per_m``). The floor leaves out
the arithmetic and the network.

The network is in the step-time model's version of the step (``decode_step_kernels`` with an
``all_to_all``): every MoE layer dispatches each token's k rows to its experts' GPUs in FP8 and
combines them back in bf16 (DeepSeek-AI 2025, inference-system overview), through each GPU's
400 Gb/s NIC, priced from DeepEP's published kernels in two bounds
(``inferlab.analysis.collectives.ExpertAllToAll``; ``deepseek_all_to_all``).
``deepseek_all_to_all_at`` takes the dearer of the two at a call's width, and is the one choice
Chapters 8 and 10 both call: at DeepSeek's published point a micro-batch's call is below the
width DeepEP timed, so the bound with the per-call latency. DeepSeek's service
runs core MLA in BF16 beside FP8 matmuls (same overview), so attention is priced at the BF16
peak. DeepSeek overlaps communication with computation by splitting each step into two
micro-batches (``overlap=True``: ``StepModel.overlapped_s``), which hides only the smaller of
the two; ``overlap_sides`` gives both, each micro-batch re-reading the weights and paying every
call's latency again. ``published_operating_point`` reads the decode batch per GPU and the context from
DeepSeek's published statistics, ``profile_operating_point`` its published decode profile,
``published_daily_usd_per_m`` its whole service's cost over its output tokens, and
``mtp_tokens_per_step`` the tokens a step yields with the multi-token-prediction module
(DeepSeek-AI 2024, acceptance of the second token).

gpt-oss-120b is published for the opposite deployment: one 80 GB GPU, with its routed experts in
MXFP4 (4.25 bits a weight with the block scale) and everything else in bf16 (``data/published.csv``:
``gptoss_single_gpu``; Hugging Face's MXFP4 documentation). ``gptoss_layout`` is that one GPU (a
layout of one); its cache is grouped-query with every other layer a 128-token sliding window
(``inferlab.analysis.attention_layouts``). One GPU's batch is small against 128 experts, so the
weights read per step count the experts the batch is expected to touch, not all of them.

``decode_step_kernels`` prices the step on the course's one step-time model
(``step_time.StepModel``): arithmetic on the active parameters, bytes of the touched weights and
the caches, kernel by kernel, and, when given, the dispatch and combine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferlab.analysis import mla, prices
from inferlab.analysis.attention_layouts import AttentionLayout
from inferlab.analysis.chip_costs import FP4
from inferlab.analysis.collectives import ExpertAllToAll, Link, deepep_rows
from inferlab.analysis.hardware import get_device_spec
from inferlab.analysis.step_time import COMMUNICATION, Attention, Shape, StepModel, precision
from inferlab.analysis.moe import MoEConfig, expected_experts
from inferlab.analysis.published import quote
from inferlab.device import bytes_per_element


@dataclass(frozen=True)
class EPLayout:
    """An expert-parallel layout: ``gpus`` GPUs, each with its own attention (data-parallel)."""

    model: str
    gpus: int
    redundant_experts: int

    def experts_per_gpu(self) -> float:
        moe = MoEConfig.from_name(self.model)
        return (moe.n_experts + self.redundant_experts) / self.gpus


def deepseek_layout(phase: str = "decode") -> EPLayout:
    """DeepSeek-V3's published prefill or decode layout (``data/published.csv``)."""
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    _, gpus, _, _, redundant = quote(f"deepseek_{phase}_layout").values
    return EPLayout("deepseek-v3", int(gpus), int(redundant))


def gptoss_layout() -> EPLayout:
    """gpt-oss-120b on the one 80 GB GPU it is published to fit (``data/published.csv``)."""
    return EPLayout("gpt-oss-120b", 1, 0)


# The published gpt-oss-120b deployment: MXFP4 routed experts, bf16 for the rest.
GPTOSS_DTYPE, GPTOSS_EXPERT_BYTES = "bfloat16", FP4.bytes_per_weight


def weight_bytes_per_gpu(layout: EPLayout, dtype="float8_e4m3fn", batch_per_gpu: int | None = None,
                         expert_bytes: float | None = None,
                         head_dtype: str | None = "bfloat16") -> float:
    """Weight bytes one GPU reads per decode step.

    Everything but the routed experts is replicated; the input embedding is a lookup of one row
    per token and is left out, as in ``MoEConfig.decode_bytes_per_step``. With no batch, every
    local expert is read; with ``batch_per_gpu``, each local expert is read with the probability
    that the group's batch routes a token to it. ``expert_bytes`` (default: ``dtype``'s) is the
    bytes per routed-expert weight (MXFP4 experts beside bf16 attention, for gpt-oss).
    ``head_dtype``: the LM head's (bf16 in DeepSeek-V3's reference inference; None: ``dtype``).
    """
    moe = MoEConfig.from_name(layout.model)
    per_element = bytes_per_element(dtype)
    expert_bytes = per_element if expert_bytes is None else expert_bytes
    lookup = 0 if moe.tie_embeddings else moe.vocab_size * moe.d_model
    share = 1.0 if batch_per_gpu is None else experts_touched(layout, batch_per_gpu) / moe.n_experts
    local = moe.moe_layers * layout.experts_per_gpu() * share * moe.expert_params
    head = moe.vocab_size * moe.d_model
    head_bytes = per_element if head_dtype is None else bytes_per_element(head_dtype)
    return (moe.params(0) - lookup - head) * per_element + head * head_bytes \
        + local * expert_bytes


def kv_bytes_per_token(layout: EPLayout, dtype="bfloat16", context: int | None = None) -> float:
    """Cache bytes a decode step reads per token of context, all layers.

    MLA models (DeepSeek): the latent and positional key. Grouped-query models with sliding-window
    layers (gpt-oss): a window layer reads at most its window, so the average over ``context``
    tokens is needed.
    """
    moe = MoEConfig.from_name(layout.model)
    if moe.mla is not None:
        return mla.kv_bytes_per_token(moe.mla, dtype)
    if context is None:
        raise ValueError(f"{layout.model} has window layers: give the context")
    attention = AttentionLayout.from_name(layout.model)
    return attention.read_bytes(context, bytes_per_element(dtype)) / context


def sequences_that_fit(layout: EPLayout, memory_bytes: float, context: int, dtype="bfloat16",
                       kv_dtype="bfloat16", expert_bytes: float | None = None) -> int:
    """Sequences of ``context`` tokens whose caches fit beside one GPU's share of the weights."""
    moe = MoEConfig.from_name(layout.model)
    stored = weight_bytes_per_gpu(layout, dtype, None, expert_bytes) \
        + moe.vocab_size * moe.d_model * bytes_per_element(dtype) * (not moe.tie_embeddings)
    free = memory_bytes - stored
    if free <= 0:
        return 0
    return int(free // (context * kv_bytes_per_token(layout, kv_dtype, context)))


def experts_touched(layout: EPLayout, batch_per_gpu: int) -> float:
    """Expected distinct routed experts per layer the whole group's batch touches."""
    moe = MoEConfig.from_name(layout.model)
    return expected_experts(batch_per_gpu * layout.gpus, moe.n_experts, moe.experts_per_token)


def decode_floor_usd_per_m(layout: EPLayout, bandwidth: float, usd_per_gpu_hour: float,
                           batch_per_gpu: int, context: int, weight_dtype="float8_e4m3fn",
                           kv_dtype="bfloat16", expert_bytes: float | None = None) -> float:
    """Dollars per million output tokens at the bandwidth floor of one GPU of ``layout``.

    The step reads the replicated weights, the local experts the group's batch is expected to
    touch, and its own sequences' cache."""
    return prices.bandwidth_floor_usd_per_m(
        weight_bytes_per_gpu(layout, weight_dtype, batch_per_gpu, expert_bytes),
        kv_bytes_per_token(layout, kv_dtype, context),
        bandwidth, batch_per_gpu, context, usd_per_gpu_hour)


def published_decode_usd_per_m() -> float:
    """DeepSeek's own decode throughput per node at its assumed GPU price, per million tokens:
    the course's decode-only derivation (prefill nodes and idle hours left out)."""
    gpus_per_node = quote("deepseek_node_gpus").value
    tokens_per_s, usd_per_gpu_hour = quote("deepseek_decode_node_throughput").values
    return prices.usd_per_million(gpus_per_node * usd_per_gpu_hour, tokens_per_s)


def published_daily_usd_per_m() -> float:
    """DeepSeek's published cost of a day (every node, prefill included, at $2 per GPU-hour)
    over the output tokens it served that day, per million."""
    usd_per_day = quote("deepseek_daily_cost").values[0]
    output_tokens = quote("deepseek_daily_tokens").values[-1] * 1e9
    return usd_per_day / output_tokens * 1e6


NIC = "RDMA NIC per GPU (400G)"   # DeepEP's H800s: one 400 Gb/s CX7 NIC per GPU


def deepseek_all_to_all(layout: EPLayout, link: str = NIC, kernel: str = "rdma",
                        fixed_latency: bool = False) -> ExpertAllToAll:
    """Dispatch and combine of ``layout`` through each GPU's NIC: k rows of d_model per token in
    every MoE layer, FP8 out and bf16 back, 8 GPUs to a node (``deepseek_node_gpus``). By
    default DeepEP's Feb-2025 pure-RDMA kernel (the one published when DeepSeek's statistics
    were taken) at the NIC bandwidth it achieved; ``fixed_latency`` gives the other bound."""
    moe = MoEConfig.from_name(layout.model)
    return ExpertAllToAll(layout.gpus, moe.experts_per_token, moe.d_model, Link.named(link),
                          int(quote("deepseek_node_gpus").value), moe.moe_layers, kernel,
                          fixed_latency)


def deepep_tokens() -> int:
    """Tokens per GPU at which DeepEP timed its low-latency kernels (``data/deepep.csv``)."""
    widths = {int(r["tokens"]) for r in deepep_rows("rdma")}
    if len(widths) != 1:
        raise ValueError(f"DeepEP's pure-RDMA rows mix batch sizes: {sorted(widths)}")
    return widths.pop()


def deepseek_all_to_all_at(layout: EPLayout, tokens_per_call: float,
                           **kw) -> ExpertAllToAll:
    """The dearer of ``deepseek_all_to_all``'s two bounds for calls of ``tokens_per_call``
    tokens. Both reproduce DeepEP's times at its own batch (``deepep_tokens``). Below it the
    bound with DeepEP's per-call latency is the dearer: a fixed cost per call does not shrink
    with the batch, while the other bound scales DeepEP's time down in proportion to the
    tokens. Above it the achieved bandwidth is the dearer (the line rate would flatter the
    extra bytes). With two micro-batches, a call carries half a GPU's tokens."""
    return deepseek_all_to_all(layout, fixed_latency=tokens_per_call < deepep_tokens(), **kw)


@dataclass(frozen=True)
class OperatingPoint:
    """The decode batch per GPU and context DeepSeek's published statistics imply."""

    batch_per_gpu: float   # sequences decoding at once on each GPU
    context: int           # tokens of cache each output token reads (their average)
    tokens_per_gpu_s: float


def published_operating_point() -> OperatingPoint:
    """Each node's output rate over its GPUs, divided by one sequence's average output speed,
    is the number of sequences each GPU decodes at once; the context is the published average
    cache length per output token (DeepSeek-AI 2025, statistics of the online service)."""
    per_node, _ = quote("deepseek_decode_node_throughput").values
    low, high = quote("deepseek_output_speed").values
    per_gpu = per_node / quote("deepseek_node_gpus").value
    return OperatingPoint(per_gpu / ((low + high) / 2), int(quote("deepseek_kv_length").value),
                          per_gpu)


def profile_operating_point() -> OperatingPoint:
    """DeepSeek's published decode profile: EP 128 with 128 requests a GPU and a 4K prompt,
    "closely matching the actual online deployment" (deepseek-ai/profile-data)."""
    ep, requests, prompt = quote("deepseek_decode_profile").values
    return OperatingPoint(float(requests), int(prompt), float("nan"))


def mtp_tokens_per_step() -> tuple[float, float]:
    """Tokens one decode step yields per sequence with DeepSeek-V3's one MTP module: the next
    token, plus the drafted second one when it is accepted (85 to 90% of the time)."""
    low, high, _ = quote("deepseek_v3_mtp_acceptance").values
    return 1 + low / 100, 1 + high / 100


def _step(layout: EPLayout, device: str, batch_per_gpu: float, context: int, prec="fp8",
          weight_dtype="float8_e4m3fn", kv_dtype="bfloat16", expert_bytes: float | None = None,
          positions: int = 1, head_dtype: str | None = "bfloat16"):
    """One GPU's decode step on the course's one step-time model (``step_time.StepModel``).

    Per GPU the linear kernels do 2 FLOPs per *active* parameter per token (its own sequences'
    attention and dense parts, and on average its share of the tokens routed to its experts),
    but read the weights its batch touches (``weight_bytes_per_gpu``), passed to the model's
    ``kernels`` as ``linear_bytes``. Attention is MLA's (``mla.attention_cost``) or grouped-query
    with the window layers reading at most their window. ``positions``: tokens each sequence
    runs through the model per step (2 with one MTP draft to verify). ``head_dtype``: the LM
    head's weights and arithmetic (DeepSeek-V3's reference inference keeps its output head in
    the default dtype, bf16, beside FP8 linears: ``inference/model.py``, ``Transformer``;
    None: the linears' precision). Returns the model, the step's shape and the linear kernels'
    bytes."""
    moe, p, spec = MoEConfig.from_name(layout.model), precision(prec), get_device_spec(device)
    head = moe.vocab_size * moe.d_model
    lookup = 0 if moe.tie_embeddings else head
    if moe.mla is not None:   # core MLA in BF16 (DeepSeek's inference-system overview)
        attention = replace(mla.attention_cost(moe.mla, kv_dtype), compute="bfloat16")
        held = float(context)
    else:
        window = AttentionLayout.from_name(layout.model)
        per_layer = window.token_elements() * bytes_per_element(kv_dtype)
        attention = Attention(moe.n_layers * per_layer,
                              4 * moe.n_layers * moe.n_heads * moe.head_dim)
        held = window.read_bytes(context, bytes_per_element(kv_dtype)) / (moe.n_layers * per_layer)
    tokens = batch_per_gpu * positions
    read = weight_bytes_per_gpu(layout, weight_dtype, tokens, expert_bytes, head_dtype) \
        - head * (p.bytes_per_weight if head_dtype is None else bytes_per_element(head_dtype))
    attention_peak = None if attention.compute is None else spec.peak_flops(attention.compute)
    model = StepModel(moe.active_params() - lookup - head, head, moe.d_model, moe.n_layers,
                      attention, p, spec.peak_flops(p.compute), spec.bandwidth,
                      attention_peak_flops=attention_peak,
                      head_bytes_per_weight=None if head_dtype is None
                      else bytes_per_element(head_dtype),
                      head_peak_flops=None if head_dtype is None else spec.peak_flops(head_dtype))
    shape = Shape.of_rows([(positions, held)]).times(batch_per_gpu)
    return model, shape, read


def decode_step_kernels(layout: EPLayout, device: str, batch_per_gpu: float, context: int,
                        all_to_all: ExpertAllToAll | None = None, **kw):
    """The kernels of one GPU's decode step (``_step``), with the dispatch and combine of its
    tokens when ``all_to_all`` is given (``deepseek_all_to_all``)."""
    model, shape, read = _step(layout, device, batch_per_gpu, context, **kw)
    return model.kernels(shape, read, all_to_all)


def decode_step_s(layout: EPLayout, device: str, batch_per_gpu: float, context: int,
                  all_to_all: ExpertAllToAll | None = None, overlap: bool = False,
                  positions: int = 1, **kw) -> float:
    """Seconds of one GPU's decode step: kernel by kernel in sequence, or with two micro-batches
    overlapping communication and computation (``overlap``; each micro-batch reads the weights
    its half of the batch touches)."""
    model, shape, read = _step(layout, device, batch_per_gpu, context, positions=positions, **kw)
    if not overlap:
        return model.seconds(shape, read, all_to_all)
    _, _, half_read = _step(layout, device, batch_per_gpu / 2, context, positions=positions, **kw)
    return model.overlapped_s(shape, half_read, all_to_all)


def overlap_sides(layout: EPLayout, device: str, batch_per_gpu: float, context: int,
                  all_to_all: ExpertAllToAll | None = None, positions: int = 1,
                  **kw) -> tuple[float, float]:
    """(computation, communication) of ``decode_step_s``'s overlapped step, each summed over
    the two micro-batches: each micro-batch reads the weights its half of the batch touches and
    pays every call's latency again. The step is the larger of the two."""
    model, shape, _ = _step(layout, device, batch_per_gpu, context, positions=positions, **kw)
    _, _, half_read = _step(layout, device, batch_per_gpu / 2, context, positions=positions, **kw)
    return model.overlap_sides(shape, half_read, all_to_all)


def step_parts(layout: EPLayout, device: str, batch_per_gpu: float, context: int,
               all_to_all: ExpertAllToAll | None = None, positions: int = 1, **kw) -> dict:
    """Seconds per kernel class of one GPU's step, the communication split into its latency
    and its bytes' time (no overlap)."""
    model, shape, read = _step(layout, device, batch_per_gpu, context, positions=positions, **kw)
    out = {}
    for k in model.kernels(shape, read, all_to_all):
        if k.name in COMMUNICATION:
            out[f"{k.name} latency"] = k.latency_s
            out[f"{k.name} bytes"] = k.memory_s
        else:
            out[k.name] = k.seconds
    return out


def decode_step_usd_per_m(layout: EPLayout, device: str, usd_per_gpu_hour: float,
                          batch_per_gpu: float, context: int, tokens_per_step: float = 1.0,
                          **kw) -> float:
    """Dollars per million output tokens at the step-time model's decode step, each sequence
    yielding ``tokens_per_step`` tokens a step (more than 1 with MTP)."""
    step = decode_step_s(layout, device, batch_per_gpu, context, **kw)
    return prices.usd_per_million(usd_per_gpu_hour, batch_per_gpu * tokens_per_step / step)
