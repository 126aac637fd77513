"""Checks for Lab 10, "One model on many devices, and mixtures of experts".

Oracles that need no solution: the all-reduce count of ``inferlab.parallel.tensor`` (two per
layer, each one d-wide vector per token); the defining property of a column- then row-parallel
split (the ranks' partial outputs add up to the whole MLP's) and the package's ``split_mlp``;
Mixtral's routing (``inferlab.model.moe.route``: softmax, top-k, renormalised); and the
uniform-routing expectation of ``inferlab.analysis.moe.expected_experts``, checked against its
closed form.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from inferlab.analysis.moe import expected_experts as _expected_experts
from inferlab.course.checks import (CheckFailed, expect_close, expect_tensor_close, lends,
                                    run_check)
from inferlab.model.moe import route as _route
from inferlab.parallel import tensor

# Points per exercise for the grader's score (inferlab.course.grade; an instructor's
# --weights file overrides them).
WEIGHTS = {"10.1": 1, "10.2": 2, "10.3": 2, "10.4": 1}


def _bytes_reference(n_layers: int, d_model: int, bytes_per_element: int) -> int:
    shape = SimpleNamespace(n_layers=n_layers, d_model=d_model)
    return tensor.all_reduce_bytes_per_token(shape, bytes_per_element)


def all_reduce_bytes(fn):
    """Exercise 10.1: ``all_reduce_bytes(n_layers, d_model, bytes_per_element)``: bytes per token
    each rank puts into tensor parallelism's all-reduces."""
    def cases(f):
        for args in [(6, 192, 4), (80, 8192, 2), (32, 4096, 2), (1, 64, 1)]:
            expected = _bytes_reference(*args)
            got = f(*args)
            hint = "two all-reduces per layer (after attention's o_proj and after the MLP's " \
                   "down_proj), each of one d_model-wide vector per token."
            if got == expected / 2:
                hint = "one all-reduce per layer is missing: attention and the MLP each end in one."
            expect_close(f"all_reduce_bytes{args}", got, expected, rel=1e-12, unit=" bytes",
                         hint=hint)
    return run_check("10.1", "all_reduce_bytes", fn,
                     lends(_bytes_reference, tensor.all_reduce_bytes_per_token), cases,
                     success=f"the course target in float32: {_bytes_reference(6, 192, 4):,} bytes per "
                             "token.")


def _mlp(x, gate, up, down):
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def split_mlp(fn):
    """Exercise 10.2: ``split_mlp(gate, up, down, rank, world_size)``: one rank's weight slices."""
    def cases(f):
        gen = torch.Generator().manual_seed(10)
        for d, ffn, n in [(8, 12, 2), (16, 32, 4), (6, 6, 3)]:
            gate, up = torch.randn(ffn, d, generator=gen), torch.randn(ffn, d, generator=gen)
            down = torch.randn(d, ffn, generator=gen)
            x = torch.randn(5, d, generator=gen)
            total = torch.zeros(5, d)
            for rank in range(n):
                got = f(gate, up, down, rank, n)
                if not (isinstance(got, tuple) and len(got) == 3):
                    raise CheckFailed(f"split_mlp(..., rank={rank}, world_size={n}) returned "
                                      f"{type(got).__name__}; expected a tuple (gate_r, up_r, "
                                      "down_r). Hint: return the three slices in that order.")
                for what, g, want in zip(("gate", "up", "down"), got,
                                         tensor.split_mlp(gate, up, down, rank, n)):
                    hint = ("gate and up are column-parallel: slice their output rows, "
                            "[rank * F/N:(rank + 1) * F/N]; down is row-parallel: slice the same "
                            "range of its input columns.")
                    if isinstance(g, torch.Tensor) and what == "down" and g.shape == (d // n, ffn):
                        hint = "down_proj is split by its input columns (dim 1), not its rows."
                    elif isinstance(g, torch.Tensor) and what != "down" and g.shape == (ffn, d // n):
                        hint = f"{what}_proj is split by its output rows (dim 0), not its columns."
                    expect_tensor_close(f"split_mlp(d={d}, F={ffn}, rank={rank}, N={n}) {what}", g,
                                        want, atol=0, rtol=0, hint=hint)
                total += _mlp(x, *got)
            expect_tensor_close(f"the sum over {n} ranks' partial outputs", total,
                                _mlp(x, gate, up, down), atol=1e-4, rtol=1e-4,
                                hint="each rank's slices must be the same range of the hidden "
                                     "width in all three matrices.")
    return run_check("10.2", "split_mlp", fn, tensor.split_mlp, cases,
                     success="the ranks' partial sums add up to the whole MLP.")


def route(fn):
    """Exercise 10.3: ``route(router_logits, k)``: weights (N, k) summing to 1 and experts (N, k)."""
    def cases(f):
        gen = torch.Generator().manual_seed(3)
        for n, e, k in [(7, 4, 2), (5, 8, 2), (6, 6, 3), (3, 5, 1)]:
            logits = torch.randn(n, e, generator=gen) * 2
            got = f(logits, k)
            if not (isinstance(got, tuple) and len(got) == 2):
                raise CheckFailed(f"route(logits {(n, e)}, k={k}) returned {type(got).__name__};"
                                  " expected a tuple (weights, experts). Hint: torch.topk gives "
                                  "both.")
            weights, experts = got
            want_w, want_e = _route(logits, k)
            hint = "the experts are the k largest logits per token (torch.topk, largest=True)."
            if isinstance(experts, torch.Tensor) and experts.shape == want_e.shape and torch.equal(
                    experts, logits.topk(k, dim=-1, largest=False).indices):
                hint = "those are the k smallest logits: take the largest."
            expect_tensor_close(f"route(logits {(n, e)}, k={k}) experts", experts, want_e,
                                atol=0, rtol=0, hint=hint)
            hint = "softmax over all experts, keep the top k, divide by their sum (so each " \
                   "token's weights add up to 1)."
            if isinstance(weights, torch.Tensor) and weights.shape == want_w.shape and torch.allclose(
                    weights.float(), F.softmax(logits, -1).gather(1, want_e)):
                hint = "the top-k probabilities must be renormalised to sum to 1 per token."
            expect_tensor_close(f"route(logits {(n, e)}, k={k}) weights", weights, want_w,
                                atol=1e-6, rtol=1e-5, hint=hint)
    return run_check("10.3", "route", fn, _route, cases,
                     success="Mixtral's routing: top-k of the softmax, renormalised.")


def expected_experts(fn):
    """Exercise 10.4: ``expected_experts(batch, n_experts, k)``: E [1 - (1 - k/E)^B]."""
    def cases(f):
        for args in [(1, 4, 2), (8, 4, 2), (64, 256, 8), (3, 8, 2), (1000, 256, 8)]:
            expected = _expected_experts(*args)
            got = f(*args)
            b, e, k = args
            hint = "an expert is missed by one token with probability 1 - k/E, by all B " \
                   "independent tokens with probability (1 - k/E)^B."
            if isinstance(got, (int, float)) and abs(got - min(e, k * b)) < 1e-9 and \
                    abs(expected - min(e, k * b)) > 1e-6:
                hint = "k x B counts an expert twice when two tokens pick it; take the " \
                       "probability that an expert is missed by every token."
            expect_close(f"expected_experts{args}", got, expected, rel=1e-9, hint=hint)
    return run_check("10.4", "expected_experts", fn, _expected_experts, cases,
                     success="at batch 1 the k active experts; toward E as the batch grows.")
