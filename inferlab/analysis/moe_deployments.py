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
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.analysis import mla, token_cost
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


def weight_bytes_per_gpu(layout: EPLayout, dtype="float8_e4m3fn") -> float:
    """Weight bytes one GPU reads per decode step when the batch touches all its experts.

    Everything but the routed experts is replicated; the input embedding is a lookup of one row
    per token and is left out, as in ``MoEConfig.decode_bytes_per_step``.
    """
    moe = MoEConfig.from_name(layout.model)
    lookup = 0 if moe.tie_embeddings else moe.vocab_size * moe.d_model
    local = moe.moe_layers * layout.experts_per_gpu() * moe.expert_params
    return (moe.params(0) - lookup + local) * bytes_per_element(dtype)


def kv_bytes_per_token(layout: EPLayout, dtype="bfloat16") -> float:
    """Cached bytes per token of the model (MLA's latent and positional key, all layers)."""
    moe = MoEConfig.from_name(layout.model)
    if moe.mla is None:
        raise ValueError(f"{layout.model} has no MLA shape in data/moe_models.csv")
    return mla.kv_bytes_per_token(moe.mla, dtype)


def experts_touched(layout: EPLayout, batch_per_gpu: int) -> float:
    """Expected distinct routed experts per layer the whole group's batch touches."""
    moe = MoEConfig.from_name(layout.model)
    return expected_experts(batch_per_gpu * layout.gpus, moe.n_experts, moe.experts_per_token)


def decode_floor_usd_per_m(layout: EPLayout, bandwidth: float, usd_per_gpu_hour: float,
                           batch_per_gpu: int, context: int, weight_dtype="float8_e4m3fn",
                           kv_dtype="bfloat16") -> float:
    """Dollars per million output tokens at the bandwidth floor of one GPU of ``layout``."""
    return token_cost.bandwidth_floor_usd_per_m(
        weight_bytes_per_gpu(layout, weight_dtype), kv_bytes_per_token(layout, kv_dtype),
        bandwidth, batch_per_gpu, context, usd_per_gpu_hour)


def published_decode_usd_per_m() -> float:
    """DeepSeek's own decode throughput per node at its assumed GPU price, per million tokens."""
    gpus_per_node = quote("deepseek_node_gpus").value
    tokens_per_s, usd_per_gpu_hour = quote("deepseek_decode_node_throughput").values
    return token_cost.usd_per_million(gpus_per_node * usd_per_gpu_hour, tokens_per_s)
