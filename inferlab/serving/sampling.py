"""Choosing each sequence's next token from its logits: greedy, or a seeded draw at a temperature.

One function, ``sample``, serves every forward pass of the engine. It takes the step's logits
(one row per sequence), ONE tensor of temperatures and one generator per row:

- a row whose temperature is below ``GREEDY_BELOW`` (0 included), or that has no generator, takes
  the argmax: greedy decoding. vLLM draws the same line (``_SAMPLING_EPS = 1e-5`` in
  ``vllm/sampling_params.py``, read at commit 00388f65): below it a temperature is indistinguishable from 0, and dividing
  logits by, say, 1e-40 overflows float32 to infinity and the softmax to NaN;
- the other rows are sampled from softmax(logits / temperature), computed in float32 on the CPU
  (so that a seed gives the same tokens on every device) and stabilised by subtracting each row's
  largest logit FIRST: every scaled logit is then <= 0 and the largest is exactly 0, so no
  temperature in [GREEDY_BELOW, inf) can overflow, and the softmax's sum is at least 1;
- a sampled row may narrow its choice to its ``top_k`` likeliest tokens and then to the
  smallest set of those holding ``top_p`` of the probability (nucleus sampling, Holtzman et al.,
  ICLR 2020, arXiv:1904.09751), always keeping the likeliest one;
- each sampled row draws from its own ``torch.Generator``, the sequence's: what a seeded request
  gets depends on its own logits and seed alone, not on which rows share the step. The caller
  passes ``None`` for a row whose token will be dropped (a prefill chunk that leaves part of its
  prompt for later), so that it does not draw: one draw per token the request emits.

Greedy rows take the argmax of the logits as they come (float64 stays float64), so greedy
serving equals ``inferlab.model.generate`` token for token.
"""

from __future__ import annotations

import torch

# Temperatures below this are greedy (vLLM's _SAMPLING_EPS).
GREEDY_BELOW = 1e-5


def is_greedy(temperature: float) -> bool:
    """Whether a request at ``temperature`` is decoded greedily (no generator needed)."""
    return temperature < GREEDY_BELOW


def truncate(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``probs`` (h, V) with all but each row's top-k tokens (``top_k`` (h,), 0: all) zeroed,
    then all but the smallest set of those whose probability, renormalised over the top k,
    reaches ``top_p`` (h,) (nucleus sampling, Holtzman et al. 2020). The likeliest token always
    stays; rows are left unnormalised (``torch.multinomial`` normalises)."""
    V = probs.shape[-1]
    vals, idx = probs.sort(dim=-1, descending=True, stable=True)  # (h, V), ties by token id
    k = torch.where(top_k > 0, top_k, V).clamp(max=V).view(-1, 1)  # (h, 1)
    keep = torch.arange(V).view(1, -1) < k  # (h, V): the top k
    kept = vals * keep
    kept = kept / kept.sum(-1, keepdim=True)
    keep &= (kept.cumsum(-1) - kept) < top_p.view(-1, 1)  # mass before it is still short of p
    return torch.zeros_like(probs).scatter(-1, idx, vals * keep)


def sample(logits: torch.Tensor, temperatures: torch.Tensor,
           generators: list[torch.Generator | None], top_k: torch.Tensor | None = None,
           top_p: torch.Tensor | None = None) -> list[int]:
    """One token per row of ``logits`` (n, V).

    ``temperatures`` (n,) holds each row's temperature; ``generators[i]`` is row i's random
    stream, or None for a row that must not draw (it is then greedy, whatever its temperature).
    ``top_k`` (n,) (0: off) and ``top_p`` (n,) (1: off) narrow a sampled row's choice
    (``truncate``); they do not change a greedy row's.
    Raises ``ValueError`` only if some logits are not finite (a model fault, not a request's:
    the engine then ends the rows' requests with that error).
    """
    n = logits.shape[0]
    if temperatures.shape != (n,) or len(generators) != n:
        raise ValueError(f"{n} rows of logits, {tuple(temperatures.shape)} temperatures and "
                         f"{len(generators)} generators")
    finite = torch.isfinite(logits).all(-1)  # (n,): a NaN row would silently argmax to 0
    if not bool(finite.all()):
        rows = (~finite).nonzero().flatten().tolist()
        raise ValueError(f"the model produced logits that are not finite in rows {rows}")
    tokens = logits.argmax(-1).tolist()  # (n,): every row's greedy choice
    warm = (temperatures >= GREEDY_BELOW).tolist()  # one read of the whole tensor
    hot = [i for i, (g, w) in enumerate(zip(generators, warm)) if g is not None and w]
    if not hot:
        return tokens
    x = logits[hot].float().cpu()  # (h, V) float32
    t = temperatures[hot].float().cpu().view(-1, 1)  # (h, 1)
    scaled = (x - x.amax(-1, keepdim=True)) / t  # (h, V): <= 0, the largest exactly 0
    probs = torch.softmax(scaled, dim=-1)  # (h, V)
    if top_k is not None and top_p is not None:
        k, p = top_k[hot].cpu(), top_p[hot].float().cpu()
        if bool((k > 0).any()) or bool((p < 1).any()):
            probs = truncate(probs, k, p)
    for row, i in enumerate(hot):
        tokens[i] = int(torch.multinomial(probs[row], 1, generator=generators[i]))
    return tokens


def sampling_inputs(seqs, emits: list[bool] | None = None):
    """``sample``'s arguments after the logits for ``seqs`` (``Sequence``s), one row each: the
    temperatures (n,), the generators, top_k (n,) and top_p (n,). A row whose ``emits`` is False
    gets no generator, so it does not draw."""
    emits = [True] * len(seqs) if emits is None else emits
    temperatures = torch.tensor([s.temperature for s in seqs], dtype=torch.float32)
    generators = [s.generator if e else None for s, e in zip(seqs, emits)]
    top_k = torch.tensor([s.top_k for s in seqs], dtype=torch.int64)
    top_p = torch.tensor([s.top_p for s in seqs], dtype=torch.float32)
    return temperatures, generators, top_k, top_p
