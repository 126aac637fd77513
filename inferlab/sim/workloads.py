"""Chapter 7's workloads: a mixed trace that makes prefills stall decodes, and two request streams.

- ``mixed_requests``: short-prompt requests that decode for a long time, all arriving at the
  start, and long prompts arriving one every ``gap_s`` while they decode. Every long prompt's
  prefill lands in the middle of everyone else's generation: the trace on which Chapter 7,
  Lab 7 and ``python -m inferlab.benchmarks.prefill_decode`` measure generation stalls
  (``inferlab.serving.metrics.largest_gap``) with and without chunked prefill.
- ``chat_like``: the ShareGPT-like lengths of ``inferlab.sim.traces`` (the published means of
  Kwon et al. 2023): prompts of a few hundred tokens, longer answers.
- ``short_prompts``: the Alpaca-like lengths of ``inferlab.sim.traces``: short instructions,
  short answers.
- ``long_document``: long prompts and short answers, as when a model summarises or answers
  questions about a document. No published trace is used: the lengths come from the same
  clipped log-normal family as the chat trace, with means and spreads that are OUR choice
  (``LONG_DOCUMENT``), so read its results as an illustration of the shape, not of a service.

``poisson_requests`` turns rows into ``Request``s arriving at a given rate, and ``stream`` draws
a fresh stream of either kind that arrives at a rate for a given time: a steady-state
experiment needs a trace whose length grows with the rate (``inferlab.sim.disaggregation``).
``Workload`` is the steady-state simulator's (``inferlab.sim.steady_state``): lengths to draw
from, and a Poisson trace of any length at any rate that a longer one extends. Every Poisson
trace of the package is built here or by ``inferlab.sim.traces.sharegpt_requests`` on the same
``traces.poisson_arrivals``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from inferlab.serving.request import Request
from inferlab.sim import traces

@dataclass(frozen=True)
class Workload:
    """Request lengths to draw from: ``rows`` of (prompt tokens, output tokens), uniformly."""

    name: str
    rows: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.rows or any(p < 1 or o < 1 for p, o in self.rows):
            raise ValueError(f"workload {self.name!r} needs rows of positive (prompt, output) "
                             "lengths")

    @classmethod
    def sharegpt(cls, scale: float = 1.0, max_len: int | None = None) -> "Workload":
        """The ShareGPT-like trace of ``inferlab.sim.traces``, lengths times ``scale`` (outputs
        cut so that a request fits ``max_len`` tokens, as ``scale_lengths`` does)."""
        rows = traces.sharegpt_like()
        if scale != 1.0 or max_len is not None:
            rows = traces.scale_lengths(rows, scale, max_len=max_len)
        name = "sharegpt_like" + ("" if scale == 1.0 else f" x{scale:g}")
        return cls(name, tuple((r.prompt_len, r.output_len) for r in rows))

    @classmethod
    def fixed(cls, prompt_len: int, output_len: int) -> "Workload":
        """Every request the same: ``prompt_len`` tokens in, ``output_len`` out."""
        return cls(f"{prompt_len} in / {output_len} out", ((int(prompt_len), int(output_len)),))

    @property
    def mean_lengths(self) -> tuple[float, float]:
        """Mean prompt and output length of the rows (what a long trace converges to)."""
        return (sum(p for p, _ in self.rows) / len(self.rows),
                sum(o for _, o in self.rows) / len(self.rows))

    def requests(self, n: int, rate: float, seed: int = 0) -> list[Request]:
        """``n`` requests arriving as a Poisson process at ``rate`` per second.

        Row ``i`` and arrival ``i`` do not depend on ``n``: a longer trace extends a shorter
        one. The same seed at another rate gives the same rows and arrivals scaled in time.
        """
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        picks = np.random.default_rng(seed + 1).integers(0, len(self.rows), size=n)
        arrivals = traces.poisson_arrivals(n, rate, seed=seed)
        return [Request((0,) * self.rows[k][0], self.rows[k][1], t, i)
                for i, (k, t) in enumerate(zip(picks.tolist(), arrivals))]


# The mixed trace at each device profile's sizes: the model, (chat requests, chat prompt, chat
# output, long prompts, long prompt, long output, seconds between long prompts), the largest
# batch and the token budgets to compare.
MIXED_TRACES = {
    "cpu": dict(model="tiny", trace=(8, 32, 128, 3, 1024, 8, 0.25), max_batch=16,
                budgets=(32, 64, 128, 256)),
    "small-gpu": dict(model="small", trace=(32, 128, 256, 4, 3072, 8, 0.25), max_batch=64,
                      budgets=(128, 256, 512, 1024)),
    "large-gpu": dict(model="small", trace=(64, 128, 512, 4, 4000, 8, 0.1), max_batch=128,
                      budgets=(256, 512, 1024, 2048)),
}

# Our assumption for the long-document stream: means and log-spreads of prompt and output.
LONG_DOCUMENT = dict(mean_in=3000.0, mean_out=150.0, sigma_in=0.5, sigma_out=0.6, seed=2025)


def mixed_requests(n_chat: int, chat_prompt: int, chat_output: int, n_long: int,
                   long_prompt, long_output: int, gap_s: float, first_s: float | None = None,
                   vocab_size: int = 1, seed: int | None = 0) -> list[Request]:
    """``n_chat`` requests (``chat_prompt`` tokens in, ``chat_output`` out) at time 0, then
    ``n_long`` long prompts, the first at ``first_s`` (default ``gap_s``), one every ``gap_s``;
    ``long_prompt`` is their length, or a list of lengths used in turn.

    With ``seed`` the prompts are random token ids below ``vocab_size``; without, zeros (enough
    for the simulator). Request ids say which kind each is: ``chat0``, ..., ``long0``, ...
    """
    gen = None if seed is None else torch.Generator().manual_seed(seed)

    def prompt(n: int) -> tuple[int, ...]:
        if gen is None:
            return (0,) * n
        return tuple(torch.randint(0, vocab_size, (n,), generator=gen).tolist())

    first = gap_s if first_s is None else first_s
    out = [Request(prompt(chat_prompt), chat_output, 0.0, f"chat{i}") for i in range(n_chat)]
    lengths = [long_prompt] if isinstance(long_prompt, int) else list(long_prompt)
    out += [Request(prompt(lengths[i % len(lengths)]), long_output, first + gap_s * i,
                    f"long{i}") for i in range(n_long)]
    return out


def chat_like(n: int, seed: int = 0, scale: float = 1.0) -> list[traces.TraceRow]:
    """``n`` ShareGPT-like rows, drawn afresh from the trace's distribution (the published
    means of Kwon et al. 2023; ``inferlab.sim.traces.make_trace``), lengths times ``scale``."""
    rows = traces.make_trace("sharegpt_like", n, seed=traces.WORKLOADS["sharegpt_like"]["seed"]
                             + seed)
    return rows if scale == 1.0 else traces.scale_lengths(rows, scale)


def long_document(n: int, seed: int = 0, max_len: int = 8192,
                  scale: float = 1.0) -> list[traces.TraceRow]:
    """``n`` long-prompt, short-answer rows (``LONG_DOCUMENT``'s lengths, capped so that prompt
    and answer fit ``max_len``), lengths times ``scale``."""
    w = LONG_DOCUMENT
    rng = np.random.default_rng(w["seed"] + seed)
    prompts = traces.sample_lengths(n, w["mean_in"], w["sigma_in"], max_len * 3 // 4, rng)
    outputs = traces.sample_lengths(n, w["mean_out"], w["sigma_out"], max_len // 4, rng)
    rows = [traces.TraceRow(i, int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs))]
    return rows if scale == 1.0 else traces.scale_lengths(rows, scale)


def poisson_requests(rows: list[traces.TraceRow], rate: float, seed: int = 0,
                     vocab_size: int = 1, token_seed: int | None = None) -> list[Request]:
    """``Request``s for ``rows`` arriving as a Poisson process at ``rate`` per second."""
    return traces.trace_requests(rows, traces.poisson_arrivals(len(rows), rate, seed=seed),
                                 vocab_size, seed=token_seed)


def short_prompts(n: int, seed: int = 0, scale: float = 1.0) -> list[traces.TraceRow]:
    """``n`` Alpaca-like rows (short instructions and answers; Kwon et al. 2023's means)."""
    rows = traces.make_trace("alpaca_like", n, seed=traces.WORKLOADS["alpaca_like"]["seed"] + seed)
    return rows if scale == 1.0 else traces.scale_lengths(rows, scale)


KINDS = {"chat": chat_like, "document": long_document, "short": short_prompts}


def stream(kind: str, rate: float, duration_s: float, seed: int = 0,
           scale: float = 1.0) -> list[Request]:
    """A ``kind`` ("chat", "document" or "short") stream arriving at ``rate`` per second for about
    ``duration_s`` seconds: ceil(rate x duration) requests, Poisson arrivals."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose one of {sorted(KINDS)}")
    n = max(1, math.ceil(rate * duration_s))
    return poisson_requests(KINDS[kind](n, seed=seed, scale=scale), rate, seed=seed)
