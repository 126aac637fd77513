"""``python -m inferlab.loadgen``: measure any OpenAI-compatible server with Chapter 4's metrics.

    python -m inferlab.loadgen --url http://127.0.0.1:8000 --trace sharegpt_like --rate 8 \\
        --num-requests 500 --scale 0.125 --max-len 512 --out results/load.json

    python -m inferlab.loadgen --trace random --random-input-len 256 --random-output-len 64 \
        --num-requests 64 --max-concurrency 8                       # vllm bench serve's basics

``--rate`` takes a comma-separated list (one run per rate, for the latency-throughput curve;
``inf`` sends everything at once); ``--arrivals-file`` replays given send times instead.
``--max-concurrency`` caps the requests in flight. ``--trace random`` (or ``--dataset-name
random``) makes vLLM's random dataset of the given lengths. The model name defaults to the first
one ``/v1/models`` lists; a server that does not answer there gets a one-line error, not a
traceback. Prints the table of each run and writes the JSON (and, with several runs or
``--plot``, the plot next to it); ``--detailed`` adds every request's id, send time and chunk
times, to match a run request by request with a server's own records. ``--endpoint
/v1/chat/completions`` drives the Chat Completions API instead of the (default) Completions one.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time

from inferlab.loadgen.client import (COMPLETIONS, ENDPOINTS, RANDOM, ServerUnreachable, make_load,
                                     run, served_model)
from inferlab.loadgen.report import DEFAULT_SLO, detailed, plot, report, table, write_json
from inferlab.serving.metrics import SLO


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m inferlab.loadgen",
                                description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000",
                   help="the server's base URL (default %(default)s)")
    p.add_argument("--model", default=None, help="default: the server's first model")
    p.add_argument("--api-key", default=None)
    p.add_argument("--trace", "--dataset-name", dest="trace", default="sharegpt_like",
                   help="sharegpt_like, alpaca_like or random (default %(default)s)")
    p.add_argument("--random-input-len", type=int, default=1024,
                   help="with --trace random: prompt tokens per request (default %(default)s)")
    p.add_argument("--random-output-len", type=int, default=128,
                   help="with --trace random: tokens to generate (default %(default)s)")
    p.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="with --trace random: lengths drawn from n(1 - r)..n(1 + r) "
                        "(default %(default)s: all equal)")
    p.add_argument("--rate", default="inf", help="requests/s, Poisson; a list makes a sweep")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="at most this many requests in flight; later arrivals wait "
                        "(default: no cap)")
    p.add_argument("--arrivals-file", default=None,
                   help="trace-driven arrivals: a file of send times in seconds, one a line "
                        "(replaces --rate; --num-requests defaults to its length)")
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--scale", type=float, default=1.0, help="multiply the trace's lengths")
    p.add_argument("--max-len", type=int, default=None, help="cut prompt + output to this")
    p.add_argument("--vocab-size", type=int, default=1000, help="prompt ids are below this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft", type=float, default=DEFAULT_SLO.ttft_s,
                   help="seconds to the first token (default %(default)s, Chapter 9's)")
    p.add_argument("--slo-tpot", type=float, default=DEFAULT_SLO.tpot_s,
                   help="seconds per later token (default %(default)s, Chapter 9's)")
    p.add_argument("--out", default=None, help="JSON file to write")
    p.add_argument("--plot", action="store_true", help="also write OUT with .png")
    p.add_argument("--detailed", action="store_true",
                   help="also save every request's id, send time and chunk times in the JSON")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--endpoint", default=COMPLETIONS, choices=ENDPOINTS,
                   help="the API to drive (default %(default)s; chat sends each prompt as one "
                        "user message)")
    a = p.parse_args(argv)
    if a.max_concurrency is not None and a.max_concurrency < 1:
        p.error("--max-concurrency must be at least 1")
    try:
        served = served_model(a.url, a.api_key)  # also: is anything there?
    except ServerUnreachable as e:
        sys.exit(f"python -m inferlab.loadgen: error: {e}")
    model = a.model or served
    slo = SLO(a.slo_ttft, a.slo_tpot)
    arrivals = None
    if a.arrivals_file:
        arrivals = [float(x) for x in open(a.arrivals_file).read().split()]
        a.num_requests, a.rate = len(arrivals), "nan"
    rows = []
    for rate in (float(r) for r in a.rate.split(",")):
        try:
            load = make_load(a.trace, a.num_requests, rate, a.scale, a.max_len, a.vocab_size,
                             a.seed, arrivals, a.random_input_len, a.random_output_len,
                             a.random_range_ratio)
        except ValueError as e:
            p.error(str(e))
        outcomes = run(a.url, model, load, api_key=a.api_key, progress=not a.no_progress,
                       max_concurrency=a.max_concurrency, endpoint=a.endpoint)
        if not any(o.ok for o in outcomes):
            first = next((o.error for o in outcomes if o.error), "no tokens streamed")
            sys.exit(f"python -m inferlab.loadgen: error: none of the {len(outcomes)} requests "
                     f"succeeded; the first said: {first}")
        row = report(outcomes, slo, None if math.isinf(rate) or math.isnan(rate) else rate)
        what = (f"random {a.random_input_len} in / {a.random_output_len} out"
                if a.trace == RANDOM else f"{a.trace} x{a.scale:g}")
        cap = f", at most {a.max_concurrency} in flight" if a.max_concurrency else ""
        print(f"\n{model} at {a.url}, {what}, {a.num_requests} requests, rate {rate:g}/s{cap}")
        print(table(row))
        rows.append({**row, "requests": detailed(outcomes)} if a.detailed else row)
    if a.out:
        meta = {"url": a.url, "model": model, "trace": a.trace, "scale": a.scale,
                "max_len": a.max_len, "num_requests": a.num_requests, "seed": a.seed,
                "max_concurrency": a.max_concurrency, "endpoint": a.endpoint,
                **({"random_input_len": a.random_input_len,
                    "random_output_len": a.random_output_len,
                    "random_range_ratio": a.random_range_ratio} if a.trace == RANDOM else {}),
                "client": platform.node(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                 time.gmtime())}
        write_json(a.out, rows, meta)
        if a.plot or len(rows) > 1:
            import matplotlib
            matplotlib.use("Agg")
            ax = plot(rows, f"{model}, {a.trace}")
            ax.figure.savefig(str(a.out).removesuffix(".json") + ".png", dpi=120,
                              bbox_inches="tight")
    return rows


if __name__ == "__main__":
    main()
