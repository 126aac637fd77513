"""Convert a model to fewer KV heads: multi-head to grouped-query (GQA) or multi-query (MQA).

Every KV head stored in the cache costs 2 x head_dim numbers per token per layer, so a model with
fewer KV heads has a proportionally smaller cache and reads proportionally fewer bytes per
decode step. Ainslie et al. 2023 turn a multi-head checkpoint into a grouped-query one by
mean-pooling the key and value projection matrices of the heads in each group, then training
briefly ("uptraining", a small fraction of the original pre-training) to recover quality.
This module does the pooling step; without the uptraining the converted model computes a
different, worse function, which is fine for measuring bytes and speed but not for quality.

Query head h uses KV head h // (n_heads / n_kv_heads) (the layout of ``repeat_kv`` in Hugging
Face models and of ``enable_gqa`` in ``scaled_dot_product_attention``), so the heads grouped
together are consecutive: going from K to K' KV heads averages each run of K / K' of them.
"""

from __future__ import annotations

import torch

from inferlab.model.llama import Llama


def kv_head_options(n_heads: int) -> list[int]:
    """The KV head counts a model with ``n_heads`` query heads can have: the divisors of n_heads."""
    return [k for k in range(1, n_heads + 1) if n_heads % k == 0]


def mean_pool_heads(weight: torch.Tensor, n_kv_heads: int, new_kv_heads: int,
                    head_dim: int) -> torch.Tensor:
    """Average consecutive groups of heads in a K or V projection weight (K*D, d) or bias (K*D,)."""
    if n_kv_heads % new_kv_heads:
        raise ValueError(f"cannot pool {n_kv_heads} KV heads into {new_kv_heads}: the new count "
                         f"must divide the old one (choose from {kv_head_options(n_kv_heads)})")
    group = n_kv_heads // new_kv_heads
    rest = weight.shape[1:]  # (d,) for a weight, () for a bias
    heads = weight.reshape(new_kv_heads, group, head_dim, *rest)  # (K', g, D, ...)
    return heads.float().mean(dim=1).to(weight.dtype).reshape(new_kv_heads * head_dim, *rest)


def convert_kv_heads(model: Llama, n_kv_heads: int) -> Llama:
    """A copy of ``model`` with ``n_kv_heads`` KV heads, K/V projections mean-pooled per group.

    ``n_kv_heads`` must divide the model's current KV head count (1 gives MQA). The query,
    output and feed-forward weights are copied unchanged; the original model is not modified.
    """
    config = model.config
    if n_kv_heads == config.n_kv_heads:
        raise ValueError(f"the model already has {n_kv_heads} KV heads")
    if n_kv_heads > config.n_kv_heads:
        raise ValueError(f"pooling only removes heads: the model has {config.n_kv_heads} KV "
                         f"heads and cannot grow to {n_kv_heads}")
    new_config = config.with_kv_heads(n_kv_heads)  # validates that it divides n_heads
    state = {}
    for name, tensor in model.state_dict().items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            tensor = mean_pool_heads(tensor, config.n_kv_heads, n_kv_heads, config.head_dim)
        state[name] = tensor.detach().clone()
    with torch.device("meta"):
        converted = Llama(new_config)
    converted.load_state_dict(state, assign=True)
    if new_config.tie_embeddings:  # assign=True unties the shared table; tie it again
        converted.lm_head.weight = converted.model.embed_tokens.weight
    return converted.eval()
