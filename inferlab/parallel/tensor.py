"""Tensor parallelism: one Llama split over ``world_size`` ranks, Megatron-style.

Shoeybi et al. 2019 (Megatron-LM, arXiv:1909.08053) split a transformer block so that each rank
holds a slice of every weight matrix and the ranks talk twice per layer:

- attention: q_proj, k_proj and v_proj are split by output rows (column-parallel), so each rank
  computes whole heads of its own; o_proj is split by input columns (row-parallel), so each rank
  produces a partial sum of the layer's output, and one all-reduce adds the partial sums;
- MLP: gate_proj and up_proj are column-parallel (a slice of the hidden width each), down_proj is
  row-parallel, and a second all-reduce adds its partial sums.

Everything else (embedding, norms, LM head) is replicated here, so every rank ends each layer
with the full activations and computes the same logits. (Megatron also splits the embedding and
the LM head by vocabulary; the course's model is too small for that to matter.) Each all-reduce
carries one d-wide vector per token, so a forward moves 2 x layers x d x bytes-per-element per
token through each all-reduce, whatever the number of ranks.

KV heads: with K KV heads and N ranks, each rank holds K / N of them when N divides K. When there
are fewer KV heads than ranks, a KV head cannot be split (its query heads need all of it), so it is
replicated: each rank holds one KV head, and N / K ranks hold copies of the same one. vLLM does
this (``QKVParallelLinear`` in ``vllm/model_executor/layers/linear.py``: ``num_kv_head_replicas =
tp_size / total_num_kv_heads`` when ``tp_size >= total_num_kv_heads``); the KV cache then stores
each replicated head N / K times over the group.

``shard_model(model, rank, world_size)`` builds rank ``rank``'s part as an ordinary
``inferlab.model.llama.Llama`` whose config has the rank's head and width counts, with o_proj and
down_proj replaced by ``RowParallelLinear`` (same parameter names), so the course's KV cache and
``generate`` run on it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from inferlab.model.config import ModelConfig
from inferlab.model.llama import Llama


@dataclass(frozen=True)
class HeadSplit:
    """Which query and KV heads rank r holds when ``n_heads`` and ``n_kv_heads`` go to N ranks."""

    world_size: int
    n_heads: int
    n_kv_heads: int

    def __post_init__(self) -> None:
        N, H, K = self.world_size, self.n_heads, self.n_kv_heads
        if N < 1 or H % N:
            raise ValueError(f"{H} query heads cannot be split evenly over {N} ranks")
        if K % N and N % K:
            raise ValueError(f"{K} KV heads over {N} ranks: one count must divide the other "
                             "(split the KV heads, or replicate each over N / K ranks)")

    @property
    def heads_per_rank(self) -> int:
        return self.n_heads // self.world_size

    @property
    def kv_heads_per_rank(self) -> int:
        return max(self.n_kv_heads // self.world_size, 1)

    @property
    def kv_replicas(self) -> int:
        """Ranks that hold a copy of each KV head: 1 when the KV heads are split."""
        return max(self.world_size // self.n_kv_heads, 1)

    def q_heads(self, rank: int) -> range:
        h = self.heads_per_rank
        return range(rank * h, (rank + 1) * h)

    def kv_heads(self, rank: int) -> range:
        """Rank r's KV heads; replicated heads go to ranks r // replicas (vLLM's rule)."""
        k = self.kv_heads_per_rank
        first = (rank // self.kv_replicas) * k
        return range(first, first + k)


def local_config(config: ModelConfig, world_size: int, rank: int = 0) -> ModelConfig:
    """The shape of one rank's part: its query heads, KV heads and MLP width."""
    split = HeadSplit(world_size, config.n_heads, config.n_kv_heads)
    if config.ffn_dim % world_size:
        raise ValueError(f"ffn_dim={config.ffn_dim} cannot be split evenly over {world_size} ranks")
    return config.scaled(n_heads=split.heads_per_rank, n_kv_heads=split.kv_heads_per_rank,
                         ffn_dim=config.ffn_dim // world_size, head_dim=config.head_dim,
                         name=f"{config.name}-tp{world_size}-rank{rank}")


class AllReduce:
    """Sum a tensor over the process group in place, counting the calls and the bytes sent in."""

    def __init__(self, group=None):
        self.group = group
        self.calls = 0
        self.bytes = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=self.group)
        self.calls += 1
        self.bytes += x.numel() * x.element_size()
        return x


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_r @ W_r^T): this rank's input columns of W, summed over the ranks."""

    def __init__(self, in_features: int, out_features: int, all_reduce):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.all_reduce = all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.all_reduce(F.linear(x, self.weight).contiguous())  # (B, T, d), summed


def _head_rows(heads: range, head_dim: int) -> slice:
    return slice(heads.start * head_dim, heads.stop * head_dim)


def shard_state(state: dict, config: ModelConfig, rank: int, world_size: int) -> dict:
    """Rank ``rank``'s slice of every tensor of a full model's state dict (by HF name)."""
    split = HeadSplit(world_size, config.n_heads, config.n_kv_heads)
    D, F_r = config.head_dim, config.ffn_dim // world_size
    q_rows = _head_rows(split.q_heads(rank), D)
    kv_rows = _head_rows(split.kv_heads(rank), D)
    ffn = slice(rank * F_r, (rank + 1) * F_r)
    out = {}
    for name, t in state.items():
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            t = t[q_rows]                       # column-parallel: whole query heads
        elif name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
            t = t[kv_rows]                      # whole KV heads, split or replicated
        elif name.endswith("o_proj.weight"):
            t = t[:, q_rows]                    # row-parallel: the same heads' input columns
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            t = t[ffn]
        elif name.endswith("down_proj.weight"):
            t = t[:, ffn]
        out[name] = t.contiguous()
    return out


def shard_model(model: Llama, rank: int, world_size: int, all_reduce=None) -> Llama:
    """Rank ``rank``'s part of ``model``; ``all_reduce`` (default ``AllReduce()``) joins the parts."""
    all_reduce = AllReduce() if all_reduce is None else all_reduce
    config = local_config(model.config, world_size, rank)
    with torch.device("meta"):
        part = Llama(config)
        for layer in part.model.layers:
            q_width = config.n_heads * config.head_dim
            layer.self_attn.o_proj = RowParallelLinear(q_width, config.d_model, all_reduce)
            layer.mlp.down_proj = RowParallelLinear(config.ffn_dim, config.d_model, all_reduce)
    part.load_state_dict(shard_state(model.state_dict(), model.config, rank, world_size),
                         assign=True)
    if config.tie_embeddings:  # assign=True replaced the shared parameter; share it again
        part.lm_head.weight = part.model.embed_tokens.weight
    return part.eval()


def all_reduce_bytes_per_token(config: ModelConfig, bytes_per_element: int) -> int:
    """Bytes each rank puts into all-reduces per token: 2 per layer, each d elements wide."""
    return 2 * config.n_layers * config.d_model * bytes_per_element


def split_mlp(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, rank: int,
              world_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s slices of one SwiGLU MLP's weights (``nn.Linear`` layout, (out, in)).

    gate and up (F, d) are column-parallel: the rank's F / N output rows; down (d, F) is
    row-parallel: the same F / N input columns. Then down_r(silu(gate_r x) * up_r x) summed over
    the ranks is the whole MLP's output (what ``shard_state`` does inside a model).
    """
    F_r = gate.shape[0] // world_size
    ffn = slice(rank * F_r, (rank + 1) * F_r)
    return gate[ffn], up[ffn], down[:, ffn]
