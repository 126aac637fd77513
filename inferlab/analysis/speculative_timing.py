"""Speculative decoding measured: step costs, acceptance and wall-clock time on this device.

What Chapter 6's lab and ``python -m inferlab.benchmarks.speculative`` measure with the course's
trained pair (``course-target``, ``course-draft``), kept apart from the benchmark's printing so
that the lab can call the same functions:

- ``load_pair`` and ``held_out_prompts``: the pair, its tokenizer and prompts from the held-out
  text of the course corpus;
- ``best_of``: the fastest run of each of several functions, timed interleaved in rounds with
  ``inferlab.timing.time_fn`` (a burst of load lengthens runs and never shortens one);
- ``step_costs``: one target step, one draft step and a target pass over k + 1 tokens, as the
  ratios the speed-up model needs (c and the verification's cost);
- ``acceptance``: the ``SpecStats`` of every prompt at each k, merged, with greedy outputs
  checked against plain greedy;
- ``wall_clock``: plain against speculative generation, and the speed-up of each k.

The speed-up model these numbers feed is ``inferlab.analysis.speculation`` (Leviathan et al. 2023).
"""

from __future__ import annotations

import math

import torch

from inferlab.model.kv_cache import KVCache
from inferlab.model.speculative import SpecStats, rollback, speculative_generate
from inferlab.timing import time_fn

KS = (1, 2, 3, 4, 6, 8)


def load_pair(dtype=torch.float32, device: str | torch.device = "cpu"):
    """The course's target and draft on ``device``, and their shared tokenizer."""
    from inferlab.model.weights import checkpoint_path, load_checkpoint, load_tokenizer

    target = load_checkpoint(checkpoint_path("course-target"), dtype=dtype, device=device)
    draft = load_checkpoint(checkpoint_path("course-draft"), dtype=dtype, device=device)
    return target, draft, load_tokenizer(checkpoint_path("course-target"), model=target)


def held_out_prompts(tokenizer, n: int, length: int, split: str = "test") -> list[list[int]]:
    """The first ``length`` tokens of each of ``n`` held-out files (those long enough)."""
    from inferlab.model.corpus import held_out

    out = []
    for doc in held_out(split):
        ids = list(tokenizer.encode(doc.text))
        if len(ids) >= length:
            out.append(ids[:length])
        if len(out) == n:
            break
    return out


def best_of(fns: dict, rounds: int, min_run_time: float) -> dict[str, float]:
    """The fastest run of each function, timed interleaved (A B C, A B C, ...) for ``rounds``
    rounds of ``min_run_time / rounds`` seconds each.

    A burst of load from other programs lengthens some runs and never shortens one, so on a
    shared machine the minimum is the time the code needs, and the ratio of two minimums taken
    in the same rounds is the most stable comparison there is.
    """
    best = {name: math.inf for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time_fn(fn, min_run_time=min_run_time / rounds, label=name)
            best[name] = min(best[name], t.min_s)
    return best


def step_costs(target, draft, ks=KS, context: int = 64, min_run_time: float = 1.0,
               rounds: int = 5) -> dict:
    """Seconds of one target step, one draft step and a target pass over k + 1 tokens, after
    ``context`` cached tokens, timed interleaved; c and each verify cost as ratios."""
    def step(model, n):
        dev = model.device
        cache = KVCache.for_model(model, 1, max_len=context + n)
        model(torch.zeros(1, context, dtype=torch.long, device=dev),
              torch.arange(context, device=dev), cache)
        x = torch.ones(1, n, dtype=torch.long, device=dev)
        pos = torch.arange(context, context + n, device=dev)

        @torch.inference_mode()
        def run():
            rollback(cache, context)
            return model(x, pos, cache)
        return run

    with torch.inference_mode():
        fns = {"target": step(target, 1), "draft": step(draft, 1)}
        fns.update({f"verify {k + 1}": step(target, k + 1) for k in ks})
        best = best_of(fns, rounds, min_run_time)
    base = best["target"]
    return {"target_s": base, "draft_s": best["draft"], "c": best["draft"] / base,
            "verify_cost": {k: best[f"verify {k + 1}"] / base for k in ks}}


def merged(stats: list[SpecStats]) -> SpecStats:
    out = SpecStats()
    for s in stats:
        out.drafted += s.drafted
        out.accepted += s.accepted
    return out


def acceptance(target, make_drafter, prompts, ks=KS, new_tokens: int = 64,
               temperature: float = 0.0, check_against=None) -> dict[int, SpecStats]:
    """The merged ``SpecStats`` of every prompt at each k; at temperature 0 each output is
    checked against ``check_against[i]`` (the plain greedy output) when given."""
    out = {}
    for k in ks:
        runs = []
        for i, prompt in enumerate(prompts):
            tokens, stats = speculative_generate(target, make_drafter(), prompt, new_tokens, k=k,
                                                 temperature=temperature, seed=i)
            if check_against is not None and tokens != check_against[i]:
                raise AssertionError(f"greedy speculation with k={k} differs from plain greedy")
            runs.append(stats)
        out[k] = merged(runs)
    return out


def wall_clock(target, make_drafter, prompts, ks=KS, new_tokens: int = 64, rounds: int = 5,
               min_run_time: float = 3.0) -> dict:
    """Seconds to generate ``new_tokens`` after every prompt: plain greedy and speculative at
    each k, timed interleaved, best run of each; the speed-up of each k over plain.

    Plain is the faster of ``generate`` and the speculative loop with k = 0 (the same loop with
    nothing drafted), so that no speed-up comes from a slower baseline loop.
    """
    from inferlab.model.generate import generate

    def plain():
        for p in prompts:
            generate(target, torch.tensor(p), new_tokens)

    def spec(k):
        def run():
            for p in prompts:
                speculative_generate(target, make_drafter(), p, new_tokens, k=k)
        return run

    fns = {"generate": plain, "k=0": spec(0), **{f"k={k}": spec(k) for k in ks}}
    t = best_of(fns, rounds, min_run_time)
    base = min(t["generate"], t["k=0"])
    return {"plain_s": base, "generate_s": t["generate"], "loop_k0_s": t["k=0"],
            "spec_s": {k: t[f"k={k}"] for k in ks},
            "speedup": {k: base / t[f"k={k}"] for k in ks}}
