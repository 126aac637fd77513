"""Workloads: where request lengths come from, and every Poisson trace the package builds.

Lengths come from ``inferlab.sim.traces`` (the ShareGPT- and Alpaca-like traces with the
published means of Kwon et al. 2023) or from our own long-document family; this module turns
them into the engine's ``Request``s arriving in time. Every Poisson trace of the package is
built here, on ``poisson_arrivals``:

- ``poisson_arrivals`` (exponential gaps) and ``trace_requests`` (rows and arrival times into
  ``Request``s, with random prompt tokens when a real model will run them);
- ``Workload``: rows of (prompt, output) lengths to draw from, and ``Workload.requests(n,
  rate)``: ``n`` requests with Poisson arrivals, a longer trace extending a shorter one. The
  steady-state measurement (``inferlab.sim.steady_state``) serves these for Chapter 4's
  capacity, Chapter 7's goodput per GPU and Chapter 8's costs. ``Workload.chat``,
  ``Workload.document`` and ``Workload.short`` are Chapter 7's three streams:
- ``chat_like``: the ShareGPT-like lengths: prompts of a few hundred tokens, longer answers;
- ``short_prompts``: the Alpaca-like lengths: short instructions, short answers;
- ``long_document``: long prompts and short answers, as when a model summarises or answers
  questions about a document. No published trace is used: the lengths come from the same
  clipped log-normal family as the chat trace, with means and spreads that are OUR choice
  (``LONG_DOCUMENT``), so read its results as an illustration of the shape, not of a service;
- ``sharegpt_requests``: the scaled ShareGPT-like stream that Chapter 4, Lab 4 and the
  batching benchmark serve on a real model, and ``stream``: a fresh stream of one of Chapter
  7's kinds for a given number of seconds (Lab 7);
- ``mixed_requests``: short-prompt requests that decode for a long time, all arriving at the
  start, and long prompts arriving one every ``gap_s`` while they decode. Every long prompt's
  prefill lands in the middle of everyone else's generation: the trace on which Chapter 7,
  Lab 7 and ``python -m inferlab.benchmarks.prefill_decode`` measure generation stalls
  (``inferlab.serving.metrics.largest_gap``) with and without chunked prefill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from inferlab.serving.request import Request
from inferlab.sim import traces


def poisson_arrivals(n: int, rate_per_s: float, seed: int = 0) -> list[float]:
    """Arrival times in seconds of ``n`` requests at ``rate_per_s`` on average (exponential gaps)."""
    if n < 0 or rate_per_s <= 0:
        raise ValueError(f"need n >= 0 and a positive rate, got n={n}, rate={rate_per_s}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, size=n)
    return np.cumsum(gaps).tolist()


def trace_requests(rows, arrivals_s, vocab_size: int = 1, seed: int | None = None) -> list[Request]:
    """``Request``s from trace rows (``prompt_len``, ``output_len``) and arrival times.

    With ``seed``, prompts are random token ids below ``vocab_size`` (to run on a model);
    without, they are zeros (enough for the simulators).
    """
    arrivals_s = list(arrivals_s)
    if len(arrivals_s) != len(rows):
        raise ValueError(f"{len(rows)} rows but {len(arrivals_s)} arrival times")
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    out = []
    for row, t in zip(rows, arrivals_s):
        prompt = ((0,) * row.prompt_len if gen is None else
                  tuple(torch.randint(0, vocab_size, (row.prompt_len,), generator=gen).tolist()))
        out.append(Request(prompt, row.output_len, float(t), row.request_id))
    return out


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
    def of(cls, name: str, rows: list[traces.TraceRow]) -> "Workload":
        """A workload drawing from trace ``rows``."""
        return cls(name, tuple((r.prompt_len, r.output_len) for r in rows))

    @classmethod
    def chat(cls, n: int = 4000) -> "Workload":
        """Chapter 7's chat stream: ``n`` ShareGPT-like rows drawn afresh (``chat_like``)."""
        return cls.of("chat", chat_like(n))

    @classmethod
    def document(cls, n: int = 4000) -> "Workload":
        """Chapter 7's long-document stream: ``n`` rows of ``long_document``."""
        return cls.of("document", long_document(n))

    @classmethod
    def short(cls, n: int = 4000) -> "Workload":
        """Chapter 7's short-prompt stream: ``n`` Alpaca-like rows (``short_prompts``)."""
        return cls.of("short", short_prompts(n))

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
        arrivals = poisson_arrivals(n, rate, seed=seed)
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
    return trace_requests(rows, poisson_arrivals(len(rows), rate, seed=seed), vocab_size,
                          seed=token_seed)


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


def sharegpt_requests(n: int, scale: float, rate: float, vocab_size: int, max_len: int,
                      seed: int = 0) -> list[Request]:
    """``n`` ShareGPT-like requests, lengths times ``scale``, arriving at ``rate`` per second,
    with random prompt tokens (to run on a model of ``vocab_size`` and context ``max_len``)."""
    rows = traces.scale_lengths(traces.sharegpt_like(n, seed=seed), scale, max_len=max_len)
    return trace_requests(rows, poisson_arrivals(n, rate, seed=seed), vocab_size, seed=seed)
