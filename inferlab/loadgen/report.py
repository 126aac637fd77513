"""Chapter 4's metrics from a load's token times: the table, a JSON file, the plot.

The token times a client saw make ``RequestTiming``s (arrival = when it sent the request), so
TTFT, TPOT, end-to-end latency, throughput and the rate within an SLO come from
``inferlab.serving.metrics.summarize``, the same code that summarises the engine's own runs
and the simulator's. Inter-token latency (ITL) is every gap between two consecutive tokens of
a request, pooled over requests: TPOT is a request's mean gap, ITL shows the stalls a mean
hides. Several runs at different rates make the latency-throughput curve.

Like ``vllm bench serve``'s result block, the report counts the input tokens of the requests
that finished and gives total-token throughput ((input + output) / duration) beside output-token
throughput. ``DEFAULT_SLO`` is the objective Chapter 9 measures its server against, and the
command's default.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from inferlab.analysis.figures import legend_outside
from inferlab.serving.metrics import SLO, Percentiles, RequestTiming, Summary, summarize

DEFAULT_SLO = SLO(ttft_s=0.5, tpot_s=0.1)  # Chapter 9's: first token within 0.5 s, then 0.1 s each


def timings(outcomes) -> list[RequestTiming]:
    """A ``RequestTiming`` per request that streamed at least one token."""
    return [RequestTiming(o.sent_s, tuple(o.chunk_times_s)) for o in outcomes if o.ok]


def inter_token_latencies(outcomes) -> list[float]:
    return [b - a for o in outcomes if o.ok for a, b in zip(o.chunk_times_s, o.chunk_times_s[1:])]


def report(outcomes, slo: SLO | None = None, rate: float | None = None) -> dict:
    """A load's results: the summary, ITL, failures, as one flat dictionary (seconds)."""
    summary = summarize(timings(outcomes), slo)
    itl = Percentiles.of(inter_token_latencies(outcomes))
    input_tokens = sum(len(o.request.prompt) for o in outcomes if o.ok)
    row = {"rate_req_s": rate, **summary.row(),
           "input_tokens": input_tokens, "output_tokens": summary.n_tokens,
           "total_throughput_tok_s": (input_tokens + summary.n_tokens) / summary.duration_s
           if summary.duration_s > 0 else math.inf,
           "itl_mean_s": itl.mean, "itl_p50_s": itl.p50, "itl_p95_s": itl.p95,
           "itl_p99_s": itl.p99,
           "failed": sum(not o.ok for o in outcomes),
           "statuses": sorted({o.status for o in outcomes if o.status is not None})}
    return row


def detailed(outcomes) -> list[dict]:
    """Each request as sent and seen: the server's response id, the send time and every
    chunk's time on the load's clock (s), the status, any error; what ``--detailed`` saves, so
    that a run can be matched request by request with a server's own records."""
    return [{"id": o.response_id, "prompt_tokens": len(o.request.prompt),
             "max_tokens": o.request.max_tokens, "sent_s": o.sent_s,
             "chunk_times_s": list(o.chunk_times_s), "status": o.status, "error": o.error}
            for o in outcomes]


def table(row: dict) -> str:
    """The Chapter 4 table of one run: each latency's mean and percentiles in ms, then rates."""
    lines = [f"{'metric':<14}{'mean':>10}{'p50':>10}{'p95':>10}{'p99':>10}  (ms)"]
    for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"),
                        ("latency", "E2E latency")):
        vals = [row[f"{name}_{k}_s"] * 1e3 for k in ("mean", "p50", "p95", "p99")]
        lines.append(f"{label:<14}" + "".join(f"{v:>10.1f}" for v in vals))
    lines.append(f"requests {row['n_requests']} done, {row['failed']} failed, in "
                 f"{row['duration_s']:.2f} s")
    if "input_tokens" in row:
        lines.append(f"tokens {row['input_tokens']:,} in (prompts), {row['n_tokens']:,} out")
        lines.append(f"throughput {row['throughput_tok_s']:.1f} output tok/s, "
                     f"{row['total_throughput_tok_s']:.1f} total tok/s, "
                     f"{row['request_rate']:.2f} req/s")
    else:  # a row saved before input tokens were counted
        lines.append(f"{row['n_tokens']} tokens; throughput {row['throughput_tok_s']:.1f} "
                     f"tok/s, {row['request_rate']:.2f} req/s")
    if "in_slo_req_s" in row:
        lines.append(f"within the SLO {row['in_slo_req_s']:.2f} req/s ({row['slo_attainment']:.0%} "
                     f"within TTFT <= {row['slo_ttft_s'] * 1e3:.0f} ms and TPOT <= "
                     f"{row['slo_tpot_s'] * 1e3:.0f} ms)")
    return "\n".join(lines)


def write_json(path: str | Path, rows: list[dict], meta: dict) -> None:
    clean = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
             for r in rows]
    Path(path).write_text(json.dumps({"meta": meta, "runs": clean}, indent=2) + "\n")


def plot(rows: list[dict], title: str = "", ax=None):
    """Latency against throughput, one point per run (rate): p50 and p99 end-to-end latency,
    and p50 TTFT."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    x = [r["throughput_tok_s"] for r in rows]
    for key, label, style in (("latency_p50_s", "E2E p50", "o-"),
                              ("latency_p99_s", "E2E p99", "s--"),
                              ("ttft_p50_s", "TTFT p50", "^:")):
        ax.plot(x, [r[key] for r in rows], style, label=label)
    for r in rows:
        if r.get("rate_req_s") is not None:
            ax.annotate(f"{r['rate_req_s']:g}/s", (r["throughput_tok_s"], r["latency_p50_s"]),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("throughput (output tokens/s)")
    ax.set_ylabel("latency (s)")
    ax.set_title(title or "latency against throughput")
    legend_outside(ax)
    return ax
