"""``python -m inferlab.loadgen``: measure any OpenAI-compatible server with Chapter 4's metrics.

    python -m inferlab.loadgen --url http://127.0.0.1:8000 --trace sharegpt_like --rate 8 \\
        --num-requests 500 --scale 0.125 --max-len 512 --out results/load.json

    python -m inferlab.loadgen --trace random --random-input-len 256 --random-output-len 64 \\
        --num-requests 64 --max-concurrency 8 --goodput ttft:500 tpot:50   # vllm bench serve's

The options follow ``vllm bench serve`` where a learner comparing the two would look for them
(vllm/benchmarks/serve.py and datasets/random.py, read at the commits named in
data/engine_facts.csv): ``--burstiness``, ``--goodput``, ``--metric-percentiles``,
``--percentile-metrics``, ``--num-warmups``, ``--ready-check-timeout-sec``,
``--random-prefix-len``, the sampling parameters, ``--ignore-eos``, ``--label`` and
``--metadata``. Where the course chose otherwise, the help says so: ``--ignore-eos`` is on by
default (a trace's output lengths are the workload; vLLM turns it on for its random dataset
only), arrivals at a rate are not rescaled to end at exactly n / rate, and ``--rate`` takes a
list (one run per rate: the latency-throughput curve). Prints each run's table and writes the
JSON (and, with several runs or ``--plot``, the plot next to it).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time

from inferlab.loadgen.client import (CHAT, COMPLETIONS, ENDPOINTS, ServerUnreachable, run,
                                     wait_until_ready)
from inferlab.loadgen.dataset import RANDOM, PromptTokenizer, make_load
from inferlab.loadgen.report import (DEFAULT_SLO, METRICS, arrivals_text, detailed, plot,
                                     report, table, write_json)
from inferlab.sim import traces

SAMPLING = {"temperature": float, "top_p": float, "top_k": int, "min_p": float,
            "frequency_penalty": float, "presence_penalty": float, "repetition_penalty": float}
DEFAULT_GOODPUT = [f"ttft:{DEFAULT_SLO.ttft_s * 1e3:g}", f"tpot:{DEFAULT_SLO.tpot_s * 1e3:g}"]
METRIC_NAMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "latency"}


def key_values(items: list[str] | None, what: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} takes KEY=VALUE pairs, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def parse_goodput(pairs: list[str]) -> dict[str, float]:
    """``["ttft:500", "e2el:2000"]`` (milliseconds, as vllm bench serve takes them) to bounds in
    seconds by name."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = math.nan
        if not sep or name not in ("ttft", "tpot", "e2el") or not ms > 0:
            raise ValueError(f"--goodput takes NAME:MILLISECONDS with NAME one of ttft, tpot, "
                             f"e2el and a positive number, got {pair!r}")
        out[name] = ms / 1e3
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m inferlab.loadgen",
        description="Measure any OpenAI-compatible server (the course's, vLLM, SGLang) with "
                    "Chapter 4's metrics: TTFT, TPOT, inter-token and end-to-end latency, "
                    "throughput and goodput, as a client sees them.",
        epilog="example: python -m inferlab.loadgen --trace random --random-input-len 256 "
               "--random-output-len 64 --num-requests 64 --rate 4,8 --out load.json")
    a = p.add_argument
    a("--url", default="http://127.0.0.1:8000", help="the server's base URL (default %(default)s)")
    a("--model", default=None, help="the model to ask for (default: the first one the server's "
      "/v1/models lists)")
    a("--api-key", default=None, help="sent as a bearer token (default: none)")
    a("--label", default=None, help="a name for this measurement, printed and saved in the JSON "
      "(default: the model's name)")
    a("--metadata", nargs="*", metavar="KEY=VALUE", default=None,
      help="facts about the run to save in the JSON, e.g. gpu=H100 tp=2 (default: none)")
    a("--trace", "--dataset-name", dest="trace", default="sharegpt_like",
      choices=[*traces.WORKLOADS, RANDOM], help="the requests' lengths: a trace of "
      "inferlab.sim.traces or vLLM's random dataset (default %(default)s)")
    a("--random-input-len", type=int, default=1024,
      help="with --trace random: prompt tokens per request, after the prefix (default "
      "%(default)s)")
    a("--random-output-len", type=int, default=128,
      help="with --trace random: tokens to generate (default %(default)s)")
    a("--random-range-ratio", type=float, default=0.0,
      help="with --trace random: lengths drawn from n(1 - r) to n(1 + r) (default %(default)s: "
      "all equal)")
    a("--random-prefix-len", type=int, default=0,
      help="with --trace random: tokens of one shared prefix every prompt starts with, as a "
      "common system prompt (default %(default)s)")
    a("--rate", default="inf", help="requests per second; a comma-separated list makes one run "
      "per rate; inf sends every request at once (default %(default)s)")
    a("--burstiness", type=float, default=1.0,
      help="the shape of the gaps between arrivals at a finite rate: 1 is Poisson, below 1 "
      "burstier, above 1 more even, inf evenly spaced (default %(default)s)")
    a("--max-concurrency", type=int, default=None,
      help="at most this many requests in flight; later arrivals wait (default: no cap)")
    a("--arrivals-file", default=None,
      help="replay given send times instead of --rate: a file of seconds, one a line; "
      "--num-requests becomes its length (default: none)")
    a("--num-requests", type=int, default=100, help="requests per run (default %(default)s)")
    a("--scale", type=float, default=1.0,
      help="multiply a trace's lengths by this (default %(default)s)")
    a("--max-len", type=int, default=None,
      help="cut each request's prompt + output to this many tokens (default: no cut)")
    a("--vocab-size", type=int, default=1000,
      help="without a tokenizer, prompt ids are drawn below this (default %(default)s)")
    a("--tokenizer", default=None,
      help="the served model's tokenizer: a tokenizer.json, a folder with one, a course model's "
      "name or a Hugging Face Hub id (fetched). Chat prompts need it (text of an exact token "
      "count); prompt ids are then drawn from its ordinary tokens (default: the course's own "
      "when it serves one of its models; for chat, else the model's name)")
    a("--seed", type=int, default=0, help="seed of lengths, prompts and arrivals (default "
      "%(default)s)")
    a("--endpoint", default=COMPLETIONS, choices=ENDPOINTS,
      help="the API to drive; chat sends each prompt as one user message (default %(default)s)")
    a("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
      help="ask the server to generate every requested token (vLLM's ignore_eos; the course's "
      "server takes it too), so the trace's output lengths are the workload (default: on; "
      "vllm bench serve sets it for its random dataset only)")
    sampling = p.add_argument_group("sampling parameters (default: not sent, the server decides)")
    for name, kind in SAMPLING.items():
        sampling.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                              help=f"{name}, sent with every request (default: not sent)")
    a("--goodput", nargs="+", metavar="NAME:MS", default=DEFAULT_GOODPUT,
      help="bounds a good request meets, in milliseconds, on ttft, tpot and e2el; the report "
      "gives good requests per second and their share (default "
      f"{' '.join(DEFAULT_GOODPUT)}, Chapter 9's SLO)")
    a("--metric-percentiles", default="50,95,99",
      help="comma-separated percentiles of each latency (default %(default)s)")
    a("--percentile-metrics", default="ttft,tpot,itl,e2el",
      help="comma-separated latencies the table shows, of ttft, tpot, itl, e2el (default "
      "%(default)s; the JSON keeps all)")
    a("--num-warmups", type=int, default=0,
      help="copies of the first request sent before each run and not counted (default "
      "%(default)s)")
    a("--ready-check-timeout-sec", type=float, default=0.0,
      help="wait up to this long for a server that is still starting (default %(default)s: "
      "ask once)")
    a("--out", default=None, help="the JSON file to write (default: none)")
    a("--plot", action="store_true",
      help="also write the latency-throughput plot, OUT with .png (default: only with "
      "several rates)")
    a("--detailed", action="store_true",
      help="also save every request's id, send time, chunk times and token counts in the JSON "
      "(default: off)")
    a("--no-progress", action="store_true", help="no progress bar (default: shown)")
    return p


def tokenizer_for(args, model: str, p: argparse.ArgumentParser) -> PromptTokenizer | None:
    """The served model's tokenizer: ``--tokenizer``; else the course's own model's; else, for
    chat, the model's name (vllm bench serve's default, which may fetch it)."""
    name = args.tokenizer
    if name is None:
        try:
            return PromptTokenizer.load_local(model)
        except FileNotFoundError:
            if args.endpoint != CHAT:
                return None
            name = model
    try:
        return PromptTokenizer.load(name)
    except Exception as e:  # a path that is not there, a hub id without a network
        if args.endpoint == CHAT:
            p.error(f"chat prompts are texts of an exact token count, which needs the served "
                    f"model's tokenizer: pass --tokenizer (could not load {name!r}: "
                    f"{type(e).__name__}: {e})")
        p.error(f"--tokenizer {name!r}: {type(e).__name__}: {e}")


def main(argv: list[str] | None = None) -> list[dict]:
    p = parser()
    a = p.parse_args(argv)
    try:
        extra_meta = key_values(a.metadata, "--metadata")
        goodput = parse_goodput(a.goodput)
        percentiles = [float(q) for q in a.metric_percentiles.split(",")]
        shown = [METRIC_NAMES[m.strip()] for m in a.percentile_metrics.split(",")]
        rates = [float(r) for r in a.rate.split(",")]
    except (ValueError, KeyError) as e:
        p.error(f"{e}")
    if not all(0 <= q <= 100 for q in percentiles):
        p.error("--metric-percentiles are between 0 and 100")
    if a.max_concurrency is not None and a.max_concurrency < 1:
        p.error("--max-concurrency must be at least 1")
    if not a.burstiness > 0 or a.num_warmups < 0 or a.random_prefix_len < 0:
        p.error("--burstiness must be positive, --num-warmups and --random-prefix-len not "
                "negative")
    try:
        served = wait_until_ready(a.url, a.api_key, a.ready_check_timeout_sec)
    except ServerUnreachable as e:
        sys.exit(f"python -m inferlab.loadgen: error: {e}")
    model = a.model or served
    tokenizer = tokenizer_for(a, model, p)
    sampling = {k: getattr(a, k) for k in SAMPLING if getattr(a, k) is not None}
    arrivals = None
    if a.arrivals_file:
        arrivals = [float(x) for x in open(a.arrivals_file).read().split()]
        a.num_requests, rates = len(arrivals), [math.nan]
    label = a.label or model
    rows = []
    for rate in rates:
        try:
            load = make_load(a.trace, a.num_requests, rate, a.scale, a.max_len, a.vocab_size,
                             a.seed, arrivals, a.random_input_len, a.random_output_len,
                             a.random_range_ratio, prefix_len=a.random_prefix_len,
                             burstiness=a.burstiness, tokenizer=tokenizer,
                             text=a.endpoint == CHAT)
        except ValueError as e:
            p.error(str(e))
        outcomes = run(a.url, model, load, api_key=a.api_key, progress=not a.no_progress,
                       max_concurrency=a.max_concurrency, endpoint=a.endpoint,
                       ignore_eos=a.ignore_eos, sampling=sampling, warmups=a.num_warmups)
        if not any(o.ok for o in outcomes):
            first = next((o.error for o in outcomes if o.error), "no tokens streamed")
            sys.exit(f"python -m inferlab.loadgen: error: none of the {len(outcomes)} requests "
                     f"succeeded; the first said: {first}")
        row = report(outcomes, goodput, None if math.isinf(rate) or math.isnan(rate) else rate,
                     percentiles)
        what = (f"random {a.random_input_len} in / {a.random_output_len} out"
                + (f" after a shared {a.random_prefix_len}" if a.random_prefix_len else "")
                if a.trace == RANDOM else f"{a.trace} x{a.scale:g}")
        cap = f", at most {a.max_concurrency} in flight" if a.max_concurrency else ""
        sent = arrivals_text(rate, a.burstiness, a.arrivals_file)
        print(f"\n{label}: {model} at {a.url}{a.endpoint}, {what}, {a.num_requests} requests, "
              f"{sent}{cap}")
        print(table(row, shown))
        rows.append({**row, "requests": detailed(outcomes)} if a.detailed else row)
    if a.out:
        meta = {"label": label, "metadata": extra_meta, "url": a.url, "model": model,
                "endpoint": a.endpoint, "tokenizer": tokenizer.name if tokenizer else None,
                "trace": a.trace, "scale": a.scale, "max_len": a.max_len,
                "num_requests": a.num_requests, "seed": a.seed, "burstiness": a.burstiness,
                "max_concurrency": a.max_concurrency, "arrivals_file": a.arrivals_file,
                "ignore_eos": a.ignore_eos, "sampling": sampling,
                "goodput_ms": {k: v * 1e3 for k, v in goodput.items()},
                "num_warmups": a.num_warmups,
                **({"random_input_len": a.random_input_len,
                    "random_output_len": a.random_output_len,
                    "random_range_ratio": a.random_range_ratio,
                    "random_prefix_len": a.random_prefix_len} if a.trace == RANDOM else {}),
                "command": "python -m inferlab.loadgen " + shlex.join(
                    sys.argv[1:] if argv is None else argv),
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        write_json(a.out, rows, meta)
        if a.plot or len(rows) > 1:
            import matplotlib
            matplotlib.use("Agg")
            ax = plot(rows, f"{label}, {a.trace}")
            ax.figure.savefig(str(a.out).removesuffix(".json") + ".png", dpi=120,
                              bbox_inches="tight")
    return rows


if __name__ == "__main__":
    main()
