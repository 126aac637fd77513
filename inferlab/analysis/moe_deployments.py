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
floor with Chapter 8's formula (``token_cost.bandwidth_floor_usd_per_m``). This is a lower bound:
it leaves out the dispatch and combine over the network (which DeepSeek overlaps with computation
using two micro-batches), load imbalance, and the arithmetic, so it is the cost a perfect
deployment approaches, to set beside the published one (``published_decode_usd_per_m``).

gpt-oss-120b is published for the opposite deployment: one 80 GB GPU, with its routed experts in
MXFP4 (4.25 bits a weight with the block scale) and everything else in bf16 (``data/published.csv``:
``gptoss_single_gpu``; Hugging Face's MXFP4 documentation). ``gptoss_layout`` is that one GPU (a
layout of one); its cache is grouped-query with every other layer a 128-token sliding window
(``inferlab.analysis.attention_layouts``). One GPU's batch is small against 128 experts, so the
weights read per step count the experts the batch is expected to touch, not all of them.

``decode_step_kernels`` prices the same step on the course's one step-time model
(``step_time.StepModel``): arithmetic on the active parameters, bytes of the touched weights and
the caches, kernel by kernel. At the published batches every kernel is memory-bound, so it agrees
with the floor; the network's all-to-all is still left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.analysis import mla, token_cost
from inferlab.analysis.attention_layouts import AttentionLayout
from inferlab.analysis.chip_costs import FP4
from inferlab.analysis.hardware import get_device_spec
from inferlab.analysis.step_time import Attention, Shape, StepModel, precision
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
                         expert_bytes: float | None = None) -> float:
    """Weight bytes one GPU reads per decode step.

    Everything but the routed experts is replicated; the input embedding is a lookup of one row
    per token and is left out, as in ``MoEConfig.decode_bytes_per_step``. With no batch, every
    local expert is read; with ``batch_per_gpu``, each local expert is read with the probability
    that the group's batch routes a token to it. ``expert_bytes`` (default: ``dtype``'s) is the
    bytes per routed-expert weight (MXFP4 experts beside bf16 attention, for gpt-oss).
    """
    moe = MoEConfig.from_name(layout.model)
    per_element = bytes_per_element(dtype)
    expert_bytes = per_element if expert_bytes is None else expert_bytes
    lookup = 0 if moe.tie_embeddings else moe.vocab_size * moe.d_model
    share = 1.0 if batch_per_gpu is None else experts_touched(layout, batch_per_gpu) / moe.n_experts
    local = moe.moe_layers * layout.experts_per_gpu() * share * moe.expert_params
    return (moe.params(0) - lookup) * per_element + local * expert_bytes


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
    return token_cost.bandwidth_floor_usd_per_m(
        weight_bytes_per_gpu(layout, weight_dtype, batch_per_gpu, expert_bytes),
        kv_bytes_per_token(layout, kv_dtype, context),
        bandwidth, batch_per_gpu, context, usd_per_gpu_hour)


def published_decode_usd_per_m() -> float:
    """DeepSeek's own decode throughput per node at its assumed GPU price, per million tokens."""
    gpus_per_node = quote("deepseek_node_gpus").value
    tokens_per_s, usd_per_gpu_hour = quote("deepseek_decode_node_throughput").values
    return token_cost.usd_per_million(gpus_per_node * usd_per_gpu_hour, tokens_per_s)


def decode_step_kernels(layout: EPLayout, device: str, batch_per_gpu: int, context: int,
                        prec="fp8", weight_dtype="float8_e4m3fn", kv_dtype="bfloat16",
                        expert_bytes: float | None = None):
    """One GPU's decode step on the course's one step-time model (``step_time.StepModel``).

    Per GPU the linear kernels do 2 FLOPs per *active* parameter per token (its own sequences'
    attention and dense parts, and on average its share of the tokens routed to its experts),
    but read the weights its batch touches (``weight_bytes_per_gpu``), passed to the model's
    ``kernels`` as ``linear_bytes``. Attention is MLA's (``mla.attention_cost``) or grouped-query
    with the window layers reading at most their window. The dispatch and combine over the
    network are not priced.
    """
    moe, p, spec = MoEConfig.from_name(layout.model), precision(prec), get_device_spec(device)
    head = moe.vocab_size * moe.d_model
    lookup = 0 if moe.tie_embeddings else head
    if moe.mla is not None:
        attention, held = mla.attention_cost(moe.mla, kv_dtype), float(context)
    else:
        window = AttentionLayout.from_name(layout.model)
        per_layer = window.token_elements() * bytes_per_element(kv_dtype)
        attention = Attention(moe.n_layers * per_layer,
                              4 * moe.n_layers * moe.n_heads * moe.head_dim)
        held = window.read_bytes(context, bytes_per_element(kv_dtype)) / (moe.n_layers * per_layer)
    read = weight_bytes_per_gpu(layout, weight_dtype, batch_per_gpu, expert_bytes) \
        - head * p.bytes_per_weight
    model = StepModel(moe.active_params() - lookup - head, head, moe.d_model, moe.n_layers,
                      attention, p, spec.peak_flops(p.compute), spec.bandwidth)
    return model.kernels(Shape.decode(batch_per_gpu, batch_per_gpu * held), linear_bytes=read)


def decode_step_usd_per_m(layout: EPLayout, device: str, usd_per_gpu_hour: float,
                          batch_per_gpu: int, context: int, **kw) -> float:
    """Dollars per million output tokens at the step-time model's decode step."""
    step = sum(k.seconds for k in decode_step_kernels(layout, device, batch_per_gpu, context, **kw))
    return token_cost.usd_per_million(usd_per_gpu_hour, batch_per_gpu / step)
