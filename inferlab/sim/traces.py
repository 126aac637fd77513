"""Synthetic request traces: prompt and output lengths like ShareGPT's and Alpaca's, and arrivals.

Kwon et al. 2023 (Sec. 6.1, Fig. 11) evaluate vLLM on two workloads and publish their mean
lengths: ShareGPT conversations average 161.31 input and 337.99 output tokens, Alpaca
instructions 19.31 and 58.45. We do not ship either data set. Instead we draw lengths from a
distribution we chose and document, with the same means:

- each length is a log-normal variable rounded to an integer and clipped to [1, cap], with
  ``cap = max_len // 2`` (1,024 tokens for a 2,048-token context), so prompt + output always
  fits the context;
- the spreads (``sigma``, the standard deviation of the log-length) are OUR assumption, chosen to
  give long-tailed lengths: 1.0 for inputs and 0.8 for outputs in the ShareGPT-like trace, 0.7
  and 0.8 in the Alpaca-like one. The paper's means are the only published numbers used;
- ``mu`` is solved so that the mean of the clipped variable equals the published mean
  (``_clipped_lognormal_mean``); the sample is then rescaled so that its own mean matches too,
  and rounded (``data/traces/README.md`` reports the file's means).

The traces live in ``data/traces/`` as CSV files; ``python -m inferlab.sim.traces`` regenerates
them bit for bit. This module gives lengths only: arrivals (a Poisson process, as in the paper)
and the engine's ``Request``s are made from rows by ``inferlab.sim.workloads``.
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from inferlab.data import read_table

# Published means (Kwon et al. 2023, Sec. 6.1) and our chosen log-normal spreads.
WORKLOADS = {
    "sharegpt_like": dict(mean_in=161.31, mean_out=337.99, sigma_in=1.0, sigma_out=0.8, seed=2023),
    "alpaca_like": dict(mean_in=19.31, mean_out=58.45, sigma_in=0.7, sigma_out=0.8, seed=2024),
}
DEFAULT_ROWS = 4_000
DEFAULT_MAX_LEN = 2048  # the context of OPT and LLaMA-1, the models in the paper
SOURCE = "synthetic; means of kwon2023 Sec. 6.1"
SYSTEM_PROMPT = 341  # tokens of the shared 5-shot prefix in the paper's Sec. 6.4


@dataclass(frozen=True)
class TraceRow:
    """One request: how many prompt tokens it brings and how many it will generate."""

    request_id: int
    prompt_len: int
    output_len: int

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


def _phi(x: float) -> float:
    """Standard normal CDF."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _clipped_lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X = exp(N(mu, sigma^2)), in closed form."""
    z = (math.log(cap) - mu) / sigma
    return math.exp(mu + sigma**2 / 2) * _phi(z - sigma) + cap * (1.0 - _phi(z))


def solve_mu(mean: float, sigma: float, cap: float) -> float:
    """The log-normal ``mu`` whose variable, clipped at ``cap``, has mean ``mean`` (bisection)."""
    if not 0 < mean < cap:
        raise ValueError(f"the target mean {mean} must lie between 0 and the cap {cap}")
    lo, hi = -20.0, math.log(cap) + 10 * sigma
    for _ in range(200):  # the clipped mean increases with mu
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _clipped_lognormal_mean(mid, sigma, cap) < mean else (lo, mid)
    return (lo + hi) / 2


def sample_lengths(n: int, mean: float, sigma: float, cap: int, rng: np.random.Generator):
    """``n`` integer lengths in [1, cap] from the clipped log-normal with mean ``mean``.

    The draw is then rescaled (a few times, re-clipping each time) so that the SAMPLE mean, not
    only the distribution's, matches ``mean`` to within rounding.
    """
    mu = solve_mu(mean, sigma, cap)
    x = np.clip(rng.lognormal(mu, sigma, size=n), 1, cap)
    for _ in range(5):
        x = np.clip(x * mean / x.mean(), 1, cap)
    return np.clip(np.rint(x), 1, cap).astype(int)


def make_trace(workload: str, n: int = DEFAULT_ROWS, max_len: int = DEFAULT_MAX_LEN,
               seed: int | None = None) -> list[TraceRow]:
    """Draw a fresh trace of ``n`` requests for ``workload`` ("sharegpt_like" or "alpaca_like")."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {sorted(WORKLOADS)}")
    w = WORKLOADS[workload]
    rng = np.random.default_rng(w["seed"] if seed is None else seed)
    cap = max_len // 2
    prompts = sample_lengths(n, w["mean_in"], w["sigma_in"], cap, rng)
    outputs = sample_lengths(n, w["mean_out"], w["sigma_out"], cap, rng)
    return [TraceRow(i, int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs))]


def _load(workload: str, n: int | None, seed: int | None) -> list[TraceRow]:
    rows = [TraceRow(int(r["request_id"]), int(r["prompt_len"]), int(r["output_len"]))
            for r in read_table(f"traces/{workload}.csv")]
    if seed is not None:  # a seeded random subset, in random order
        order = np.random.default_rng(seed).permutation(len(rows))
        rows = [rows[i] for i in order]
    if n is not None:
        if not 0 < n <= len(rows):
            raise ValueError(f"n must be in 1..{len(rows)} (rows in the file), got {n}")
        rows = rows[:n]
    return rows


def sharegpt_like(n: int | None = None, seed: int | None = None) -> list[TraceRow]:
    """Rows of ``data/traces/sharegpt_like.csv``: the first ``n``, or a random ``n`` given ``seed``."""
    return _load("sharegpt_like", n, seed)


def alpaca_like(n: int | None = None, seed: int | None = None) -> list[TraceRow]:
    """Rows of ``data/traces/alpaca_like.csv``: the first ``n``, or a random ``n`` given ``seed``."""
    return _load("alpaca_like", n, seed)


def scale_lengths(rows: list[TraceRow], factor: float, max_len: int | None = None) -> list[TraceRow]:
    """Rows with both lengths multiplied by ``factor`` (at least 1 token each).

    Lets a CPU lab keep the trace's shape at a fraction of its cost, e.g. ``factor=1/8``. With
    ``max_len``, output lengths are cut so that prompt + output fits that context.
    """
    if factor <= 0:
        raise ValueError(f"factor must be positive, got {factor}")
    out = []
    for r in rows:
        p, o = max(1, round(r.prompt_len * factor)), max(1, round(r.output_len * factor))
        if max_len is not None:
            if p >= max_len:
                raise ValueError(f"request {r.request_id}: scaled prompt {p} does not fit "
                                 f"max_len={max_len}")
            o = min(o, max_len - p)
        out.append(replace(r, prompt_len=p, output_len=o))
    return out


def mean_lengths(rows: list[TraceRow]) -> tuple[float, float]:
    """Mean prompt and output length of ``rows``."""
    return (sum(r.prompt_len for r in rows) / len(rows), sum(r.output_len for r in rows) / len(rows))


def write_traces(folder: Path, n: int = DEFAULT_ROWS, max_len: int = DEFAULT_MAX_LEN) -> dict:
    """Write both traces as CSV into ``folder``; return their sample means."""
    folder.mkdir(parents=True, exist_ok=True)
    means = {}
    for workload in WORKLOADS:
        rows = make_trace(workload, n, max_len)
        with open(folder / f"{workload}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(["request_id", "prompt_len", "output_len", "source"])
            for r in rows:
                writer.writerow([r.request_id, r.prompt_len, r.output_len, SOURCE])
        means[workload] = mean_lengths(rows)
    return means


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the synthetic request traces.")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2]
                        / "data" / "traces", help="folder to write (default: data/traces)")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--max-len", type=int, default=DEFAULT_MAX_LEN)
    args = parser.parse_args(argv)
    for workload, (mi, mo) in write_traces(args.out, args.rows, args.max_len).items():
        w = WORKLOADS[workload]
        print(f"{workload}: mean prompt {mi:.2f} (target {w['mean_in']}), "
              f"mean output {mo:.2f} (target {w['mean_out']})")


if __name__ == "__main__":
    main()
