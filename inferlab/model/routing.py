"""What a mixture of experts' router did: load per expert, imbalance, distinct experts per batch.

``record_routing(model, tokens)`` runs an ``inferlab.model.moe.MoELlama`` and returns, for every
MoE layer, the experts each token was sent to, (L, N, k). From such a record:

- ``expert_load``: tokens per expert, (L, E). Under perfect balance every expert gets N k / E.
- ``imbalance``: the busiest expert's load over the mean load, per layer. 1.0 is perfect
  balance; under expert parallelism the busiest expert's rank sets the step's pace, so this is
  the slowdown against a perfectly balanced step.
- ``distinct_experts``: how many different experts a batch of tokens touches in one layer,
  which is how many experts' weights a decode step must read.

Their reference under uniform routing (each token picks k experts evenly) is
``inferlab.analysis.moe.expected_experts``: E [1 - (1 - k/E)^B] distinct experts for B tokens.
"""

from __future__ import annotations

import torch

from inferlab.model.moe import route, router_logits


@torch.inference_mode()
def record_routing(model, tokens: torch.Tensor) -> torch.Tensor:
    """The experts each token of ``tokens`` (B, T) went to in each MoE layer: (L, B*T, k)."""
    with router_logits(model) as logits:  # (B*T, E) per layer
        model(tokens)
    return torch.stack([route(x, model.config.experts_per_token)[1] for x in logits])


def expert_load(experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Tokens routed to each expert: (..., N, k) -> (..., E), summing to N k over E."""
    one_hot = torch.nn.functional.one_hot(experts, n_experts)  # (..., N, k, E)
    return one_hot.sum(dim=(-3, -2))


def imbalance(load: torch.Tensor) -> torch.Tensor:
    """Busiest expert's load over the mean load, (..., E) -> (...); 1.0 is perfect balance."""
    load = load.float()
    return load.max(dim=-1).values / load.mean(dim=-1)


def distinct_experts(experts: torch.Tensor) -> int:
    """Different experts a group of tokens touches: ``experts`` (N, k) -> a count."""
    return int(torch.unique(experts).numel())


def distinct_experts_by_batch(experts: torch.Tensor, batch: int) -> torch.Tensor:
    """Distinct experts touched by each consecutive group of ``batch`` tokens, (N, k) -> (N // B,)."""
    n = experts.shape[0] // batch
    return torch.tensor([distinct_experts(experts[i * batch:(i + 1) * batch]) for i in range(n)])
