"""``python -m inferlab.loadgen``: measure any OpenAI-compatible server with Chapter 4's metrics.

    python -m inferlab.loadgen --url http://127.0.0.1:8000 --trace sharegpt_like --rate 8 \\
        --num-requests 500 --scale 0.125 --max-len 512 --out results/load.json

``--rate`` takes a comma-separated list (one run per rate, for the latency-throughput curve;
``inf`` sends everything at once); ``--arrivals-file`` replays given send times instead. The model name defaults to the first one ``/v1/models``
lists. Prints the table of each run and writes the JSON (and, with several runs or ``--plot``,
the plot next to it); ``--detailed`` adds every request's id, send time and chunk times, to
match a run request by request with a server's own records.
"""

from __future__ import annotations

import argparse
import math
import platform
import time

from inferlab.loadgen.client import make_load, run, served_model
from inferlab.loadgen.report import detailed, plot, report, table, write_json
from inferlab.serving.metrics import SLO


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m inferlab.loadgen",
                                description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="default: the server's first model")
    p.add_argument("--api-key", default=None)
    p.add_argument("--trace", default="sharegpt_like", help="sharegpt_like or alpaca_like")
    p.add_argument("--rate", default="inf", help="requests/s, Poisson; a list makes a sweep")
    p.add_argument("--arrivals-file", default=None,
                   help="trace-driven arrivals: a file of send times in seconds, one a line "
                        "(replaces --rate; --num-requests defaults to its length)")
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--scale", type=float, default=1.0, help="multiply the trace's lengths")
    p.add_argument("--max-len", type=int, default=None, help="cut prompt + output to this")
    p.add_argument("--vocab-size", type=int, default=1000, help="prompt ids are below this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft", type=float, default=1.0, help="seconds")
    p.add_argument("--slo-tpot", type=float, default=0.1, help="seconds")
    p.add_argument("--out", default=None, help="JSON file to write")
    p.add_argument("--plot", action="store_true", help="also write OUT with .png")
    p.add_argument("--detailed", action="store_true",
                   help="also save every request's id, send time and chunk times in the JSON")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    model = a.model or served_model(a.url, a.api_key)
    slo = SLO(a.slo_ttft, a.slo_tpot)
    arrivals = None
    if a.arrivals_file:
        arrivals = [float(x) for x in open(a.arrivals_file).read().split()]
        a.num_requests, a.rate = len(arrivals), "nan"
    rows = []
    for rate in (float(r) for r in a.rate.split(",")):
        load = make_load(a.trace, a.num_requests, rate, a.scale, a.max_len, a.vocab_size,
                         a.seed, arrivals)
        outcomes = run(a.url, model, load, api_key=a.api_key, progress=not a.no_progress)
        row = report(outcomes, slo, None if math.isinf(rate) or math.isnan(rate) else rate)
        print(f"\n{model} at {a.url}, {a.trace} x{a.scale:g}, {a.num_requests} requests, "
              f"rate {rate:g}/s")
        print(table(row))
        rows.append({**row, "requests": detailed(outcomes)} if a.detailed else row)
    if a.out:
        meta = {"url": a.url, "model": model, "trace": a.trace, "scale": a.scale,
                "max_len": a.max_len, "num_requests": a.num_requests, "seed": a.seed,
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
