"""The engine oracle that Labs 4 and 7 share: a model, and what it generates for a request alone.

A check that lets a learner's scheduling policy drive the real engine compares every output with
generating that request by itself, through the contiguous KV cache of ``inferlab.model.generate``.
The model is a 2-layer version of ``tiny`` in float64 on the CPU, whatever the learner's device:
batched and single-row matmuls round differently, and in float64 that can never flip a greedy
choice, so "identical to generating it alone" is exact.

The grader runs this file anew beside the lab's checks (``inferlab.course.verify.load_checks``),
like the checks themselves.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def tiny_model():
    """The oracle's model (built once): ``tiny`` with 2 layers and 256 positions, float64."""
    import torch

    from inferlab.model.config import ModelConfig
    from inferlab.model.llama import build_model

    config = ModelConfig.from_name("tiny").scaled(n_layers=2, max_seq_len=256)
    return build_model(config, seed=0).to(torch.float64)


@lru_cache(maxsize=None)
def alone(prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The ``n`` tokens ``tiny_model`` generates greedily after ``prompt``, with nothing beside it."""
    import torch

    from inferlab.model.generate import generate

    return tuple(generate(tiny_model(), torch.tensor(prompt), n)[0, len(prompt):].tolist())
