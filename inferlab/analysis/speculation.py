"""What speculative decoding gains: expected tokens per verification, speed-up, best k, and
where batching takes the gain away.

Leviathan, Kalman and Matias (2023, Sec. 3) model each drafted token as accepted independently
with probability a (the acceptance rate). A verification of k drafted tokens then emits the
accepted prefix plus one token of the target's own, on average

    E(a, k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)

tokens. If a draft step costs c target steps and verifying k + 1 tokens costs one target step
(true while the pass is memory-bound), the wall-clock speed-up over plain decoding is
E(a, k) / (k c + 1) (their Theorem 3.8). Chen et al. (2023) derive the same accounting.

The last functions drop the "verification costs one step" assumption and time each pass with
the course's step-time model (``inferlab.analysis.step_time``: each kernel on its own roofline,
summed). At batch 1 verifying k + 1 tokens is nearly free; as the batch grows the linear layers
turn compute-bound and their k + 1 tokens cost k + 1 times as much, while attention still reads
each sequence's cache once per pass, whatever the batch: at short contexts speculation stops
paying near the critical batch size, at long ones the cache reads keep it paying much further
(Sadhukhan et al. 2024, MagicDec).

The draft is a model of its own shape (``StepModel.for_device`` on the draft's config): its
weights, and its K/V cache per token, which its layers and KV heads set, not its share of the
target's parameters (Llama-3.2-1B keeps a quarter of Llama-3-8B's cache per token with a sixth
of its weights). A number c still works, as the old shortcut: a draft c times the target in
every weight AND every cached number. A round may also pay a fixed ``round_overhead_s`` that no
roofline sees (drafting's bookkeeping, the rejection sampler, the host's work between passes):
a sourced figure, ``data/cost_inputs_2026.csv``, passed in by the caller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from inferlab.analysis.step_time import Shape, StepModel


def _check(a: float, k: int) -> None:
    if not 0 <= a <= 1:
        raise ValueError(f"the acceptance rate a must lie in [0, 1], got {a!r}")
    if k < 0 or int(k) != k:
        raise ValueError(f"k (drafted tokens per verification) must be an integer >= 0, got {k!r}")


def expected_tokens(a: float, k: int) -> float:
    """Expected tokens emitted per verification: (1 - a^(k+1)) / (1 - a), k + 1 at a = 1."""
    _check(a, k)
    return k + 1.0 if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def speedup(a: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Wall-clock speed-up over plain decoding: E(a, k) / (k c + verify_cost).

    ``c``: the cost of one draft step over one target step. ``verify_cost``: the cost of the
    target's pass over k + 1 tokens over one target step (1 while memory-bound; measure it).
    """
    _check(a, k)
    if c < 0 or verify_cost <= 0:
        raise ValueError(f"need c >= 0 and verify_cost > 0, got c={c!r}, verify_cost={verify_cost!r}")
    return expected_tokens(a, k) / (k * c + verify_cost)


def best_k(a: float, c: float, k_max: int = 32) -> int:
    """The k in 0..k_max with the largest ``speedup(a, k, c)`` (0: do not speculate)."""
    return max(range(k_max + 1), key=lambda k: speedup(a, k, c))


def acceptance_needed(target_speedup: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """The least acceptance rate at which ``speedup(a, k, c)`` reaches ``target_speedup``
    (by bisection: E grows with a); inf when even a = 1 falls short."""
    if speedup(1.0, k, c, verify_cost) < target_speedup:
        return math.inf
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid, k, c, verify_cost) < target_speedup else (lo, mid)
    return hi


def _pass_shape(model: StepModel, tokens: int, context: int, batch: int) -> Shape:
    row = Shape.of_rows([(tokens, context)], model.attention.window)
    return replace(row, rows=tokens).times(batch)


def pass_seconds(model: StepModel, tokens: int, context: int = 0, batch: int = 1) -> float:
    """One forward pass of ``model`` (``inferlab.analysis.step_time``) over ``batch`` sequences
    that each verify or decode ``tokens`` new tokens after ``context`` cached ones, with logits
    at every new position (a verification needs them all)."""
    return model.seconds(_pass_shape(model, tokens, context, batch))


def pass_kernels(model: StepModel, tokens: int, context: int = 0, batch: int = 1) -> dict:
    """The kernels of the pass ``pass_seconds`` prices, by name (``step_time.Kernel``: FLOPs,
    bytes, and the seconds of each limit), to count where a pass's time goes."""
    return {kern.name: kern for kern in model.kernels(_pass_shape(model, tokens, context, batch))}


def max_batch(memory: float, weight_bytes: float, kv_bytes_per_token: float, context: int,
              k: int, draft: "float | StepModel" = 0.0, utilization: float = 1.0) -> int:
    """The most sequences of ``context`` cached tokens that can speculate with ``k`` drafts.

    The binding constraint is the KV cache at its peak, during a verification: each sequence
    then holds ``context + k + 1`` slots (the k + 1 written before the verifier decides), in
    the target's cache and in the draft's. They share ``utilization`` x ``memory`` (an engine's
    budget, e.g. vLLM's ``gpu_memory_utilization``) with both models' weights. ``draft``: the
    draft's own ``StepModel`` (its weights read per step, its cache per token; an EAGLE head's
    LM head, shared with the target, is then counted twice, a few hundred MB), or a number c,
    c times the target in weights and in cached bytes per token (as ``batched_speedup`` takes
    it). Activations, CUDA graphs and the allocator's slack are not counted, so this is still
    an upper bound."""
    _check(0.0, k)
    if isinstance(draft, StepModel):
        draft_weights, draft_kv = draft.weight_bytes_read(), draft.attention.kv_bytes_per_token
    else:
        if draft < 0:
            raise ValueError(f"need draft >= 0, got {draft!r}")
        draft_weights, draft_kv = draft * weight_bytes, draft * kv_bytes_per_token
    if not 0 < utilization <= 1 or context < 0:
        raise ValueError(f"need 0 < utilization <= 1 and context >= 0, got "
                         f"{utilization!r}, {context!r}")
    room = utilization * memory - weight_bytes - draft_weights
    per_sequence = (context + k + 1) * (kv_bytes_per_token + draft_kv)
    return max(0, int(room // per_sequence))


@dataclass(frozen=True)
class SpecRound:
    """One speculation round at ``batch`` sequences against one plain decode step: seconds of
    each part (all sequences together) and the tokens the round emits."""

    batch: int
    k: int
    plain_s: float        # one plain decode step
    draft_s: float        # k draft passes of one token per sequence
    verify_s: float       # one target pass of k + 1 tokens per sequence
    overhead_s: float     # the round's fixed cost
    tokens: float         # batch x E(a, k)

    @property
    def round_s(self) -> float:
        return self.draft_s + self.verify_s + self.overhead_s

    @property
    def speedup(self) -> float:
        """Tokens per second speculating over tokens per second decoding plainly."""
        return self.plain_s / self.batch / (self.round_s / self.tokens)


def _draft_model(target: StepModel, draft: "StepModel | float") -> StepModel:
    return draft if isinstance(draft, StepModel) else target.scaled(draft)


def eagle_head(target: StepModel, fused: int = 2) -> StepModel:
    """An EAGLE-style draft head on ``target``, with its own shape (Li et al. 2024, EAGLE, and
    ``inferlab.model.eagle``): one decoder layer of the target's width, a linear layer fusing
    ``fused`` d-wide vectors into one (EAGLE: the next token's embedding and the target's
    feature), and the target's own LM head, which each draft step reads again. Its cache is one
    layer's. The layer is the target's average layer (its linear weights over its layers)."""
    if fused < 1:
        raise ValueError(f"fused must be >= 1, got {fused}")
    n, a = target.n_layers, target.attention
    return replace(target, n_layers=1,
                   linear_params=target.linear_params / n + fused * target.d_model ** 2,
                   attention=replace(a, kv_bytes_per_token=a.kv_bytes_per_token / n,
                                     flops_per_pair=a.flops_per_pair / n))


def spec_round(target: StepModel, batch: int, a: float, k: int, draft: "StepModel | float",
               context: int = 0, round_overhead_s: float = 0.0) -> SpecRound:
    """The parts of one round (``SpecRound``) at ``batch`` sequences of ``context`` cached
    tokens each. ``draft``: the draft's own ``StepModel``, or a number c (a draft c times the
    target in every weight and cached number)."""
    _check(a, k)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if round_overhead_s < 0:
        raise ValueError(f"round_overhead_s must be >= 0, got {round_overhead_s}")
    d = _draft_model(target, draft)
    return SpecRound(batch, k, pass_seconds(target, 1, context, batch),
                     k * pass_seconds(d, 1, context, batch),
                     pass_seconds(target, k + 1, context, batch), round_overhead_s,
                     batch * expected_tokens(a, k))


def batched_speedup(target: StepModel, batch: int, a: float, k: int, draft: "StepModel | float",
                    context: int = 0, round_overhead_s: float = 0.0) -> float:
    """Speculation's speed-up at ``batch`` sequences of ``context`` cached tokens each, for a
    ``target`` step-time model and a ``draft`` (its own ``StepModel``, or a number c: a draft c
    times the target in every weight and cached number).

    Plain decoding: one target pass of one token per sequence. Speculating: k draft passes of
    one token per sequence, then one target pass of k + 1 tokens per sequence, plus a fixed
    ``round_overhead_s``, emitting batch x E(a, k) tokens. Each pass reads each sequence's
    cache once: the k + 1 verified tokens share their sequence's cache read, but no two
    sequences share one, so at a long context the cache reads, which batching does not
    amortise, keep a large batch memory-bound and leave speculation its gain; the draft's own
    cache reads grow with the batch too.
    """
    return spec_round(target, batch, a, k, draft, context, round_overhead_s).speedup


def crossover_batch(target: StepModel, a: float, k: int, draft: "StepModel | float",
                    context: int = 0, max_batch: int = 1 << 16,
                    round_overhead_s: float = 0.0) -> int | None:
    """The smallest batch at which speculating with k tokens no longer pays (speed-up <= 1),
    or None if it still pays at ``max_batch`` (say, the most sequences that fit in memory)."""
    gain = lambda b: batched_speedup(target, b, a, k, draft, context, round_overhead_s)  # noqa: E731
    lo, hi = 1, max_batch
    if gain(lo) <= 1:
        return lo
    if gain(hi) > 1:
        return None
    while hi - lo > 1:  # the speed-up falls as the batch grows
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if gain(mid) > 1 else (lo, mid)
    return hi
