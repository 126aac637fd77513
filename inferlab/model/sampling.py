"""Choosing the next token from the logits: greedy, or a seeded draw at a temperature.

One function, ``sample``, serves the engine's every forward pass and the labs' generation loops
(``inferlab.model.generate``). It takes logits (one row per sequence), ONE tensor of
temperatures and one generator per row:

- a row whose temperature is below ``GREEDY_BELOW`` (0 included), or that has no generator, takes
  the argmax: greedy decoding. vLLM draws the same line (``_SAMPLING_EPS = 1e-5`` in
  ``vllm/sampling_params.py``, read at commit 00388f65): below it a temperature is
  indistinguishable from 0, and dividing logits by, say, 1e-40 overflows float32 to infinity
  and the softmax to NaN;
- the other rows are sampled from softmax(logits / temperature), computed in float32 ON THE
  LOGITS' DEVICE and stabilised by subtracting each row's largest logit FIRST: every scaled
  logit is then <= 0 and the largest is exactly 0, so no temperature in [GREEDY_BELOW, inf) can
  overflow, and the softmax's sum is at least 1;
- a sampled row may narrow its choice to its ``top_k`` likeliest tokens and then to the
  smallest set of those holding ``top_p`` of the probability (nucleus sampling, Holtzman et al.,
  ICLR 2020, arXiv:1904.09751), always keeping the likeliest one;
- each sampled row draws from its own ``torch.Generator`` on the logits' device (the engine's
  runner keeps one per sequence): what a seeded request gets depends on its own logits and seed
  alone, not on which rows share the step. The caller passes ``None`` for a row whose token
  will be dropped (a prefill chunk that leaves part of its prompt for later), so that it does
  not draw: one draw per token the request emits.

The temperatures, top-k and top-p are request parameters the host already knows: they come as
host tensors, and which rows are greedy is read from the host's copy, never from the device.
The logits stay on the device: the tokens come back in ONE copy, with the check that every row
was finite. No row costs a ``.item()``. That one place, between the logits and the draw, is
also where a constrained decoder would mask the logits (a grammar's token bitmask).

A seed fixes the tokens on one device: serving a seeded request gives the tokens it gets when
served alone on the same device. Across devices (a CPU and a GPU, or two GPU models) the random
streams and the float32 softmax differ, so the same seed may give different tokens; that is
not promised.

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
    stays; rows are left unnormalised (``torch.multinomial`` normalises). Runs on ``probs``'s
    device."""
    V = probs.shape[-1]
    vals, idx = probs.sort(dim=-1, descending=True, stable=True)  # (h, V), ties by token id
    top_k, top_p = top_k.to(probs.device), top_p.to(probs.device)
    k = torch.where(top_k > 0, top_k, V).clamp(max=V).view(-1, 1)  # (h, 1)
    keep = torch.arange(V, device=probs.device).view(1, -1) < k  # (h, V): the top k
    kept = vals * keep
    kept = kept / kept.sum(-1, keepdim=True)
    keep &= (kept.cumsum(-1) - kept) < top_p.view(-1, 1)  # mass before it is still short of p
    keep[:, 0] = True  # the likeliest token stays, even for a top_p that rounds to 0 in float32
    return torch.zeros_like(probs).scatter(-1, idx, vals * keep)


def sample(logits: torch.Tensor, temperatures: torch.Tensor,
           generators: list[torch.Generator | None], top_k: torch.Tensor | None = None,
           top_p: torch.Tensor | None = None) -> list[int]:
    """One token per row of ``logits`` (n, V), as the module says: ``temperatures`` (n,) on the
    host; ``generators[i]`` row i's stream on the logits' device, None for a row that must not
    draw; ``top_k`` (n,) (0: off), ``top_p`` (n,) (1: off). Raises ``ValueError`` if some logits
    are not finite (a model fault: the engine ends those rows' requests with it)."""
    n = logits.shape[0]
    if temperatures.shape != (n,) or len(generators) != n:
        raise ValueError(f"{n} rows of logits, {tuple(temperatures.shape)} temperatures and "
                         f"{len(generators)} generators")
    finite = torch.isfinite(logits).all(-1)  # (n,): a NaN row would silently argmax to 0
    tokens = logits.argmax(-1)  # (n,): every row's greedy choice, on the device
    warm = (temperatures >= GREEDY_BELOW).tolist()  # one read of the host's tensor
    hot = [i for i, (g, w) in enumerate(zip(generators, warm)) if g is not None and w]
    if hot:  # the rows that draw, in float32; a faulty one must not reach a draw
        rows = torch.tensor(hot, device=logits.device)
        x = torch.where(finite[rows].view(-1, 1), logits[rows].float(), 0.0)  # (h, V)
        t = temperatures[hot].float().to(logits.device).view(-1, 1)  # (h, 1)
        probs = torch.softmax((x - x.amax(-1, keepdim=True)) / t, dim=-1)  # (h, V); the scaled
        # logits are <= 0 and the largest exactly 0
        if top_k is not None and top_p is not None:
            k, p = top_k[hot], top_p[hot].float()
            if bool((k > 0).any()) or bool((p < 1).any()):  # host tensors: no device read
                probs = truncate(probs, k, p)
        drawn = torch.cat([torch.multinomial(probs[r], 1, generator=generators[i])
                           for r, i in enumerate(hot)])  # (h,), a draw per row's own stream
        tokens = tokens.index_put((rows,), drawn)
    out = torch.cat([tokens, (~finite).long()]).tolist()  # ONE copy back: tokens and faults
    bad = [i for i, f in enumerate(out[n:]) if f]
    if bad:
        raise ValueError(f"the model produced logits that are not finite in rows {bad}")
    return out[:n]
