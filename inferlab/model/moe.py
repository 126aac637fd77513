"""A Mixtral-style mixture of experts: the course's Llama with each MLP replaced by routed experts.

Jiang et al. 2024 (Mixtral of Experts, arXiv:2401.04088) replace every feed-forward block with
``n_experts`` SwiGLU experts and a router: a linear layer gives each token one logit per expert,
the token goes to the ``experts_per_token`` (k) experts with the largest logits, and their outputs
are added, weighted by a softmax over the selected logits. Hugging Face's
``MixtralSparseMoeBlock`` (``transformers/models/mixtral/modeling_mixtral.py``) computes the
same weights as a softmax over all experts, top-k, then division by the selected weights' sum;
``route`` does exactly that, in float32 as it does.

Parameter names follow Mixtral's Hugging Face checkpoints, so a checkpoint in that layout loads by
name: ``model.layers.N.block_sparse_moe.gate.weight`` (the router, E x d) and
``model.layers.N.block_sparse_moe.experts.M.w1/w2/w3.weight`` (w1 the gate projection, w3 the up
projection, w2 the down projection). Attention, norms, embedding and LM head are the dense
model's (``inferlab.model.llama``), so the KV cache and ``generate`` run on it unchanged.

``MoEModelConfig`` is a runnable model's shape (a ``ModelConfig`` plus the expert counts; its
``ffn_dim`` is one expert's width) read from and written to Mixtral's ``config.json`` layout.
It is not ``inferlab.analysis.moe.MoEConfig``, which describes published models for byte counts.
``course_moe_config()`` is the course's own MoE: ``course-target``'s shape with 4 experts of half
the dense width, top-2, so a token's active parameters equal the dense target's.
Training adds Switch Transformer's load-balancing loss (Fedus et al. 2022, arXiv:2101.03961,
eq. 4-6; the same as Hugging Face's ``load_balancing_loss_func``): ``router_logits`` collects the
routers' outputs during a forward and ``load_balancing_loss`` turns them into E sum_e f_e P_e.
``save_checkpoint`` (``inferlab.model.weights``) writes this model as it writes the dense one;
``inferlab.model.weights.load_moe_checkpoint`` reads it back.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.model.config import ModelConfig
from inferlab.model.llama import Attention, Llama, RMSNorm, init_weights
from inferlab.validation import positive_ints


@dataclass(frozen=True)
class MoEModelConfig(ModelConfig):
    """A Llama shape whose MLPs are ``n_experts`` experts of width ``ffn_dim``, k per token."""

    n_experts: int = 8
    experts_per_token: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_ints("MoEModelConfig.", n_experts=self.n_experts,
                      experts_per_token=self.experts_per_token)
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} exceeds "
                             f"n_experts={self.n_experts}")

    @classmethod
    def from_hf_config(cls, hf: dict, name: str | None = None) -> "MoEModelConfig":
        """Read a Mixtral ``config.json``."""
        if hf.get("model_type") != "mixtral":
            raise ValueError(f"model_type={hf.get('model_type')!r}: a Mixtral config.json is "
                             "expected (model_type 'mixtral')")
        dense = ModelConfig.from_hf_config({**hf, "architectures": ["MistralForCausalLM"]}, name)
        return cls(**{**dense.as_dict(), "n_experts": hf["num_local_experts"],
                      "experts_per_token": hf["num_experts_per_tok"]})

    def to_hf_config(self) -> dict:
        """A ``config.json`` in Mixtral's layout (``MixtralForCausalLM``)."""
        hf = super().to_hf_config()
        hf.pop("attention_bias")  # Mixtral's attention has no biases (refused below)
        return hf | {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                     "num_local_experts": self.n_experts,
                     "num_experts_per_tok": self.experts_per_token,
                     "sliding_window": self.sliding_window, "router_jitter_noise": 0.0,
                     "output_router_logits": False}


COURSE_MOE = "course-moe"


def course_moe_config(n_experts: int = 4, experts_per_token: int = 2) -> MoEModelConfig:
    """``course-target`` with its MLP split into ``n_experts`` experts of ffn_dim * k / E each.

    A token runs k experts, so its active MLP parameters equal the dense target's.
    """
    dense = ModelConfig.from_name("course-target")
    if (dense.ffn_dim * experts_per_token) % n_experts:
        raise ValueError(f"ffn_dim={dense.ffn_dim} x k={experts_per_token} is not divisible "
                         f"by n_experts={n_experts}")
    return MoEModelConfig(**{**dense.as_dict(), "name": COURSE_MOE,
                             "ffn_dim": dense.ffn_dim * experts_per_token // n_experts,
                             "n_experts": n_experts, "experts_per_token": experts_per_token})


def route(router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixtral's routing of N tokens: weights (N, k) summing to 1 per token, experts (N, k).

    Softmax over all experts in float32, keep the k largest, divide by their sum: the same as
    a softmax over the k selected logits.
    """
    probs = F.softmax(router_logits.float(), dim=-1)  # (N, E)
    weights, experts = torch.topk(probs, k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), experts


class Expert(nn.Module):
    """One SwiGLU expert with Mixtral's names: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, d_model: int, ffn_dim: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, d_model, bias=False)
        self.w3 = nn.Linear(d_model, ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def combine(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, modules,
            first_expert: int = 0) -> torch.Tensor:
    """sum_j weights[n, j] * expert_{experts[n, j]}(x[n]) for N tokens x (N, d).

    Only the experts ``first_expert .. first_expert + len(modules) - 1`` are run (all of them in
    one process; a rank's own under expert parallelism); slots routed elsewhere add nothing.
    Each expert runs once, on the tokens routed to it.
    """
    out = torch.zeros_like(x)
    for i, expert in enumerate(modules):
        token, slot = torch.where(experts == first_expert + i)  # (n,), (n,)
        if token.numel():
            y = expert(x[token]) * weights[token, slot, None].to(x.dtype)
            out.index_add_(0, token, y)
    return out


class SparseMoE(nn.Module):
    """The router (``gate``) and the experts: Mixtral's ``block_sparse_moe``."""

    def __init__(self, config: MoEModelConfig):
        super().__init__()
        self.k = config.experts_per_token
        self.gate = nn.Linear(config.d_model, config.n_experts, bias=False)
        self.experts = nn.ModuleList(Expert(config.d_model, config.ffn_dim)
                                     for _ in range(config.n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        flat = x.reshape(B * T, d)
        weights, experts = route(self.gate(flat), self.k)  # (N, k), (N, k)
        return combine(flat, weights, experts, self.experts).view(B, T, d)


@contextmanager
def router_logits(model):
    """Collect each MoE layer's router logits, (N, E) per layer, during the forwards inside."""
    collected: list[torch.Tensor] = []
    handles = [layer.block_sparse_moe.gate.register_forward_hook(
        lambda module, inputs, out: collected.append(out)) for layer in model.model.layers]
    try:
        yield collected
    finally:
        for h in handles:
            h.remove()


def load_balancing_loss(logits: list[torch.Tensor], k: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss, averaged over layers: E sum_e f_e P_e.

    f_e is the fraction of the N k routed slots that went to expert e (not differentiable) and
    P_e the mean router probability of e; the loss is 1 when both are uniform and E / k when the same
    k experts take every token with all the probability. Hugging Face's version sums over the k slots instead of averaging,
    so its value is k times ours; the gradient's direction is the same.
    """
    losses = []
    for layer in logits:  # (N, E)
        probs = F.softmax(layer.float(), dim=-1)
        chosen = torch.topk(probs, k, dim=-1).indices  # (N, k)
        E = probs.shape[-1]
        f = F.one_hot(chosen, E).float().mean(dim=(0, 1))  # (E,)
        losses.append(E * (f * probs.mean(dim=0)).sum())
    return torch.stack(losses).mean()


class MoEDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + moe(norm(x))."""

    def __init__(self, config: MoEModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.block_sparse_moe = SparseMoE(config)
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)

    def forward(self, x, positions, cache=None, rope=None):
        x = x + self.self_attn(self.input_layernorm(x), positions, cache, rope)
        return x + self.block_sparse_moe(self.post_attention_layernorm(x))


class MoELlama(Llama):
    """The dense model with every decoder layer an ``MoEDecoderLayer``; same ``forward``."""

    def __init__(self, config: MoEModelConfig):
        if config.attention_bias:
            raise ValueError("Mixtral's attention has no biases; attention_bias must be False")
        super().__init__(config)
        self.model.layers = nn.ModuleList(MoEDecoderLayer(config, i)
                                          for i in range(config.n_layers))


def build_moe_model(config: MoEModelConfig, seed: int = 0, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> MoELlama:
    """An MoE model with random weights from ``seed`` (``init_weights``'s recipe)."""
    with torch.device("meta"):
        model = MoELlama(config)
    model = model.to_empty(device=device).to(dtype)
    if config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return init_weights(model, seed).eval()
