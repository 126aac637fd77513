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


def sample(logits: torch.Tensor, temperatures: torch.Tensor,
           generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of ``logits`` (n, V).

    ``temperatures`` (n,) holds each row's temperature; ``generators[i]`` is row i's random
    stream, or None for a row that must not draw (it is then greedy, whatever its temperature).
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
    hot = [i for i, g in enumerate(generators)
           if g is not None and not is_greedy(float(temperatures[i]))]
    if not hot:
        return tokens
    x = logits[hot].float().cpu()  # (h, V) float32
    t = temperatures[hot].float().cpu().view(-1, 1)  # (h, 1)
    scaled = (x - x.amax(-1, keepdim=True)) / t  # (h, V): <= 0, the largest exactly 0
    probs = torch.softmax(scaled, dim=-1)  # (h, V)
    for row, i in enumerate(hot):
        tokens[i] = int(torch.multinomial(probs[row], 1, generator=generators[i]))
    return tokens


def sampling_inputs(seqs, emits: list[bool] | None = None):
    """The temperatures (n,) and generators of ``seqs`` (``Sequence``s), one row each; a row
    whose ``emits`` is False gets no generator, so it does not draw."""
    emits = [True] * len(seqs) if emits is None else emits
    temperatures = torch.tensor([s.temperature for s in seqs], dtype=torch.float32)
    generators = [s.generator if e else None for s, e in zip(seqs, emits)]
    return temperatures, generators
