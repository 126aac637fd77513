"""Chapter 4's metrics from a load's token times: the table, a JSON file, the plot.

The token times a client saw make ``RequestTiming``s (arrival = when it sent the request), so
TTFT, TPOT, end-to-end latency (E2E; vLLM's E2EL) and throughput come from
``inferlab.serving.metrics.summarize``, the same code that summarises the engine's own runs and
the simulator's. Inter-token latency (ITL) is every gap between two consecutive tokens of a
request, pooled over requests: TPOT is a request's mean gap, ITL shows the stalls a mean hides.
Each metric gets its mean, its standard deviation (of the population, numpy's default, as
``vllm bench serve`` prints it) and the chosen percentiles (``numpy.percentile``'s linear
interpolation). Several runs at different rates make the latency-throughput curve.

Token counts are the server's wherever it reports them: the ``usage`` of each stream gives the
prompt's tokens as the server counted them (a chat template's included) and the completion's; the
report says which count it used. Like ``vllm bench serve``'s result block, it counts the tokens
of the requests that finished and gives total-token throughput ((input + output) / duration)
beside output-token throughput.

Objectives: a request is *good* when it met every bound given, on TTFT, TPOT and E2E latency
(a one-token answer has no TPOT and meets that bound); the report gives the good requests per
second (``vllm bench serve --goodput`` calls this request goodput; DistServe's goodput is the
highest rate at which a target share of requests stays good, a search over rates) and their
share of every request sent, failed ones included. ``DEFAULT_SLO`` is the objective Chapter 9
measures its server against, and the command's default.

Failures are counted by kind: an HTTP status with its name (a 429 is the server refusing work
it has no room for) or the client's connection error.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from http import HTTPStatus
from pathlib import Path

import numpy as np

from inferlab.analysis.figures import legend_outside
from inferlab.serving.metrics import PERCENTILES, SLO, RequestTiming, summarize

DEFAULT_SLO = SLO(ttft_s=0.5, tpot_s=0.1)  # Chapter 9's: first token within 0.5 s, then 0.1 s each
METRICS = ("ttft", "tpot", "itl", "latency")  # the row's names; the command says e2el for latency
LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "latency": "E2E latency"}
OBJECTIVES = ("ttft", "tpot", "e2el")


def timings(outcomes) -> list[RequestTiming]:
    """A ``RequestTiming`` per request that streamed at least one token."""
    return [RequestTiming(o.sent_s, tuple(o.chunk_times_s)) for o in outcomes if o.ok]


def inter_token_latencies(outcomes) -> list[float]:
    return [b - a for o in outcomes if o.ok for a, b in zip(o.chunk_times_s, o.chunk_times_s[1:])]


def objectives(slo) -> dict[str, float]:
    """Bounds in seconds by name (``ttft``, ``tpot``, ``e2el``) from an ``SLO`` or a dict."""
    if slo is None:
        return {}
    if isinstance(slo, SLO):
        return {"ttft": slo.ttft_s, "tpot": slo.tpot_s}
    unknown = set(slo) - set(OBJECTIVES)
    if unknown or not all(v > 0 for v in slo.values()):
        raise ValueError(f"objectives are positive seconds on {', '.join(OBJECTIVES)}, got {slo}")
    return dict(slo)


def is_good(t: RequestTiming, bounds: dict[str, float]) -> bool:
    """Whether one finished request met every bound (vLLM's rule: at most, not below)."""
    values = {"ttft": t.ttft, "e2el": t.latency, "tpot": 0.0 if t.n_tokens == 1 else t.tpot}
    return all(values[k] <= v for k, v in bounds.items())


def _spread(name: str, values: list[float], percentiles) -> dict:
    xs = np.array([v for v in values if not math.isnan(v)], dtype=float)
    if not len(xs):
        return {f"{name}_{k}_s": math.nan for k in ("mean", "std", *(_p(q) for q in percentiles))}
    out = {f"{name}_mean_s": float(xs.mean()), f"{name}_std_s": float(xs.std())}
    out.update({f"{name}_{_p(q)}_s": float(np.percentile(xs, q)) for q in percentiles})
    return out


def _p(q: float) -> str:
    return f"p{q:g}"


def report(outcomes, slo=None, rate: float | None = None,
           percentiles=PERCENTILES) -> dict:
    """A load's results as one flat dictionary (seconds, per-second rates, token counts).

    ``slo``: the bounds a good request meets, an ``SLO`` (TTFT, TPOT) or a dict of seconds by
    ``ttft``, ``tpot``, ``e2el``; ``percentiles``: which ones each latency reports."""
    done = timings(outcomes)
    summary = summarize(done)
    row = {"rate_req_s": rate, "n_requests": summary.n_requests, "n_tokens": summary.n_tokens,
           "duration_s": summary.duration_s, "request_rate": summary.request_rate,
           "percentiles": [float(q) for q in percentiles]}
    values = {"ttft": [t.ttft for t in done], "tpot": [t.tpot for t in done],
              "latency": [t.latency for t in done], "itl": inter_token_latencies(outcomes)}
    for name in METRICS:
        row.update(_spread(name, values[name], percentiles))
    ok = [o for o in outcomes if o.ok]
    served = [o.prompt_tokens for o in ok]
    by_server = bool(ok) and all(n is not None for n in served)
    row["input_tokens"] = sum(served) if by_server else sum(len(o.request.prompt) for o in ok)
    row["input_counted_by"] = "server" if by_server else "client"
    row["prompt_tokens_sent"] = sum(len(o.request.prompt) for o in ok)
    row["output_tokens"] = sum(o.completion_tokens if o.completion_tokens is not None
                               else len(o.chunk_times_s) for o in ok)
    duration = summary.duration_s if summary.duration_s > 0 else math.nan
    row["throughput_tok_s"] = row["output_tokens"] / duration
    row["total_throughput_tok_s"] = (row["input_tokens"] + row["output_tokens"]) / duration
    bounds = objectives(slo)
    if bounds:
        good = sum(is_good(t, bounds) for t in done)
        row.update({f"slo_{k}_s": v for k, v in bounds.items()})
        row["slo_attainment"] = good / len(outcomes) if outcomes else math.nan
        row["in_slo_req_s"] = good / duration  # vllm bench serve's "request goodput"
    failures = Counter(o.failure for o in outcomes if not o.ok)
    row["failed"] = sum(failures.values())
    row["failures"] = dict(failures.most_common())
    row["statuses"] = sorted({o.status for o in outcomes if o.status is not None})
    return row


def detailed(outcomes) -> list[dict]:
    """Each request as sent and seen: the server's response id, the send time and every
    chunk's time on the load's clock (s), the token counts, the status, any error; what
    ``--detailed`` saves, so that a run can be matched request by request with a server's own
    records."""
    return [{"id": o.response_id, "prompt_tokens": len(o.request.prompt),
             "server_prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens,
             "max_tokens": o.request.max_tokens, "sent_s": o.sent_s,
             "chunk_times_s": list(o.chunk_times_s), "status": o.status, "error": o.error}
            for o in outcomes]


def failure_text(failures: dict) -> str:
    """``HTTP 429 Too Many Requests x 60, ConnectError x 9``: each kind of failure, named."""
    parts = []
    for kind, n in failures.items():
        code = kind.removeprefix("HTTP ")
        name = HTTPStatus(int(code)).phrase if code.isdigit() and int(code) in \
            HTTPStatus._value2member_map_ else ""
        parts.append(f"{kind}{' ' + name if name else ''} x {n}")
    return ", ".join(parts)


def table(row: dict, metrics=METRICS) -> str:
    """The Chapter 4 table of one run: each latency's mean, standard deviation and percentiles
    in ms, then the counts and rates."""
    qs = row.get("percentiles", PERCENTILES)
    cols = ["mean", "std", *(_p(q) for q in qs)]
    heads = [c for c in cols if f"ttft_{c}_s" in row]  # a row saved before std was reported
    lines = [f"{'metric':<12}" + "".join(f"{c:>9}" for c in heads) + "  (ms)"]
    for name in metrics:
        lines.append(f"{LABELS[name]:<12}" + "".join(f"{row[f'{name}_{c}_s'] * 1e3:>9.1f}"
                                                     for c in heads))
    failed = f", {row['failed']} failed" if row["failed"] else ", none failed"
    if row.get("failures"):
        failed += f" ({failure_text(row['failures'])})"
    lines.append(f"requests {row['n_requests']} done{failed}, in {row['duration_s']:.2f} s")
    if "input_tokens" in row:
        by = {"server": "the server's count", "client": "as sent"}.get(
            row.get("input_counted_by", "client"))
        lines.append(f"tokens {row['input_tokens']:,} in ({by}), "
                     f"{row.get('output_tokens', row['n_tokens']):,} out")
        lines.append(f"throughput {row['throughput_tok_s']:.1f} output tok/s, "
                     f"{row['total_throughput_tok_s']:.1f} total tok/s, "
                     f"{row['request_rate']:.2f} req/s")
    else:  # a row saved before input tokens were counted
        lines.append(f"{row['n_tokens']} tokens; throughput {row['throughput_tok_s']:.1f} "
                     f"tok/s, {row['request_rate']:.2f} req/s")
    if "in_slo_req_s" in row:
        bounds = [f"{n} <= {row[f'slo_{k}_s'] * 1e3:.0f} ms" for k, n in
                  (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2E")) if f"slo_{k}_s" in row]
        # a rate, vLLM's "request goodput"; not DistServe's goodput (the highest load at which
        # the share within the SLO holds), which takes a sweep of loads
        lines.append(f"in-SLO rate (vLLM's request goodput) {row['in_slo_req_s']:.2f} req/s "
                     f"({row['slo_attainment']:.0%} within {', '.join(bounds)})")
    return "\n".join(lines)


def arrivals_text(rate: float, burstiness: float = 1.0, given: str | None = None) -> str:
    """How a run's requests were sent, in words (never "rate inf/s")."""
    if given:
        return f"send times from {given}"
    if math.isinf(rate):
        return "all sent at once"
    kind = "Poisson" if burstiness == 1 else f"gamma, burstiness {burstiness:g},"
    return f"{kind} arrivals at {rate:g} req/s"


def write_json(path: str | Path, rows: list[dict], meta: dict) -> None:
    clean = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
              for k, v in r.items()} for r in rows]
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
        if all(key in r for r in rows):
            ax.plot(x, [r[key] for r in rows], style, label=label)
    for r in rows:
        if r.get("rate_req_s") is not None and "latency_p50_s" in r:
            ax.annotate(f"{r['rate_req_s']:g}/s", (r["throughput_tok_s"], r["latency_p50_s"]),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("throughput (output tokens/s)")
    ax.set_ylabel("latency (s)")
    ax.set_title(title or "latency against throughput")
    legend_outside(ax)
    return ax
