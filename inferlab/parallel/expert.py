"""Expert parallelism: a mixture of experts whose experts live on different ranks.

Each of N ranks holds the router and every non-expert weight (attention, norms, embeddings),
processes its own tokens (the attention part is data-parallel), and owns E / N of each layer's
experts: rank r owns experts r E/N .. (r+1) E/N - 1. In every MoE layer:

1. route: each rank routes its tokens (Mixtral's top-k, ``inferlab.model.moe.route``);
2. dispatch: each (token, expert) pair's activation goes to the expert's rank, in one
   ``all_to_all_single`` (preceded by one that tells each rank how many rows to expect);
3. compute: each rank runs its experts on the rows it received;
4. combine: the results go back by the reverse ``all_to_all_single``, and each rank adds its
   tokens' k results with their routing weights.

gloo implements ``all_to_all_single`` on CPU tensors, uneven splits included (checked here on
torch 2.13 by the tests; NCCL does on CUDA tensors). This sends one row per (token, expert)
pair, even when a token's k experts share a rank; engines that send one copy per (token, rank)
pair and fan out on arrival move less.

Traffic: a token's k rows each leave its rank unless their expert is local; with uniform
routing over N ranks a row is remote with probability (N - 1) / N, so a token dispatches
k (N - 1) / N x d x bytes-per-element on average and gets as much back at the combine
(``expected_dispatch_bytes_per_token``). ``DispatchCounter`` counts the rows that actually
crossed, so a run compares measured traffic with that prediction.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from inferlab.model.moe import MoELlama, SparseMoE, route


def expected_dispatch_bytes_per_token(d_model: int, experts_per_token: int, world_size: int,
                                      bytes_per_element: int) -> float:
    """Mean bytes one token sends to other ranks at one layer's dispatch, under uniform routing."""
    return experts_per_token * (world_size - 1) / world_size * d_model * bytes_per_element


class DispatchCounter:
    """Rows and bytes of activations this rank sent to other ranks (dispatch and combine)."""

    def __init__(self):
        self.routed_tokens = 0    # tokens routed on this rank, summed over layers
        self.dispatch_rows = 0    # (token, expert) rows sent to another rank
        self.dispatch_bytes = 0
        self.combine_bytes = 0    # expert outputs sent back to other ranks


def _exchange(rows: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
    """all_to_all_single of ``rows`` (n, ...) with ``send[r]`` rows to rank r, ``recv[r]`` from r."""
    out = rows.new_empty((sum(recv), *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), output_split_sizes=recv,
                           input_split_sizes=send)
    return out


class ExpertParallelMoE(nn.Module):
    """One rank's part of a ``SparseMoE``: the router, and its own E / N experts."""

    def __init__(self, moe: SparseMoE, rank: int, world_size: int, counter: DispatchCounter):
        super().__init__()
        n_experts = len(moe.experts)
        if n_experts % world_size:
            raise ValueError(f"{n_experts} experts cannot be split evenly over {world_size} ranks")
        self.rank, self.world_size, self.k = rank, world_size, moe.k
        self.per_rank = n_experts // world_size
        self.first = rank * self.per_rank
        self.gate = moe.gate
        self.experts = nn.ModuleList(list(moe.experts)[self.first:self.first + self.per_rank])
        self.counter = counter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        flat = x.reshape(B * T, d)
        weights, experts = route(self.gate(flat), self.k)       # (N, k), (N, k)
        dest = (experts // self.per_rank).reshape(-1)           # (N k,) rank of each row
        order = torch.argsort(dest, stable=True)                # rows grouped by rank
        rows = flat.repeat_interleave(self.k, dim=0)[order]     # (N k, d)
        ids = experts.reshape(-1)[order]
        send = torch.bincount(dest, minlength=self.world_size)  # (W,)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)                      # how many rows each rank sends us
        send_l, recv_l = send.tolist(), recv.tolist()
        got_rows, got_ids = _exchange(rows, send_l, recv_l), _exchange(ids, send_l, recv_l)
        out_rows = torch.empty_like(got_rows)
        for i, expert in enumerate(self.experts):               # each local expert once
            mine = torch.where(got_ids == self.first + i)[0]
            out_rows[mine] = expert(got_rows[mine])
        back = _exchange(out_rows, recv_l, send_l)              # (N k, d), in ``order``
        results = torch.empty_like(back)
        results[order] = back                                   # token-major again
        y = (results.view(B * T, self.k, d) * weights[..., None].to(x.dtype)).sum(dim=1)
        remote = sum(send_l) - send_l[self.rank]
        c = self.counter
        c.routed_tokens += B * T
        c.dispatch_rows += remote
        c.dispatch_bytes += remote * d * x.element_size()
        c.combine_bytes += (sum(recv_l) - recv_l[self.rank]) * d * x.element_size()
        return y.view(B, T, d)


def shard_experts(model: MoELlama, rank: int, world_size: int,
                  counter: DispatchCounter | None = None) -> MoELlama:
    """Turn ``model`` (in place) into rank ``rank``'s part: every MoE layer expert-parallel."""
    counter = DispatchCounter() if counter is None else counter
    for layer in model.model.layers:
        layer.block_sparse_moe = ExpertParallelMoE(layer.block_sparse_moe, rank, world_size,
                                                   counter)
    return model
