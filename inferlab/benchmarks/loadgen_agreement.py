"""Does the load generator see what the engine does? Both clocks, request by request.

    python -m inferlab.benchmarks.loadgen_agreement [--regimes light,busy,queued] [--json [PATH]]

For each regime it starts the course server in this process (so the engine's own timing of
every request is at hand, ``app.state.records``), runs ``python -m inferlab.loadgen
--detailed`` against it as a separate process, as a user would, and matches the two by the
response id. It prints TTFT, TPOT, end-to-end latency and throughput as the load generator
measured them and as the engine stamped them, and the HTTP path: per request, the client's TTFT
minus the engine's. The engine's clock starts when the request's handler runs and stops when the
forward pass that made a token ends; the client's starts before it sends and stops when the
chunk arrives, so the difference is the connection, the request's parsing, the hand-over of the
token from the engine's thread to the server's event loop and the chunk's trip back. The server
also stamps when its handler passed the first chunk to the HTTP layer, which splits the
difference into the part inside the server (the hand-over) and the trips.

The regimes differ in what TTFT is made of. ``light``: few requests at once, so TTFT is one short
prefill (a few milliseconds on a CPU) and the HTTP path is a large share of it. ``busy``:
Chapter 9's load (8 requests a second, a batch of 16). ``queued``: a batch of 2 at 12 requests
a second, so most of TTFT is waiting in the engine's queue, as on a loaded production server.
TPOT and end-to-end latency agree to a few percent in every regime; TTFT agrees within 10% once it
is ten times the HTTP path, which is why a benchmark must say where it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

import numpy as np

from inferlab.serving.metrics import RequestTiming, summarize

METRICS = ("ttft", "tpot", "latency")


@dataclass(frozen=True)
class Regime:
    """A load: the server's batch, and the trace, rate and number of requests sent to it."""

    name: str
    max_batch: int
    rate: float
    num_requests: int
    trace: str = "sharegpt_like"
    scale: float = 0.125
    max_len: int = 512
    seed: int = 0

    def loadgen_args(self) -> list[str]:
        return ["--trace", self.trace, "--rate", f"{self.rate:g}",
                "--num-requests", str(self.num_requests), "--scale", f"{self.scale:g}",
                "--max-len", str(self.max_len), "--seed", str(self.seed)]


REGIMES = {r.name: r for r in (Regime("light", 16, 2.0, 16), Regime("busy", 16, 8.0, 32),
                               Regime("queued", 2, 12.0, 64))}


def compare(requests: list[dict], records) -> dict:
    """The load generator's view (``requests``: ``--detailed``'s rows) against the engine's
    (``records``: the server's ``app.state.records``), matched by response id.

    Returns the mean of each latency both ways and their relative difference, throughput both
    ways, and the HTTP path (client TTFT minus engine TTFT, per request) in seconds.
    """
    engine = {r["id"]: RequestTiming(r["arrival_s"], tuple(r["token_times_s"])) for r in records}
    ok = [r for r in requests if r["error"] is None and r["chunk_times_s"]]
    missing = [r["id"] for r in ok if r["id"] not in engine]
    if missing:
        raise ValueError(f"{len(missing)} requests have no engine record, e.g. {missing[0]!r}")
    client = [RequestTiming(r["sent_s"], tuple(r["chunk_times_s"])) for r in ok]
    inside = [engine[r["id"]] for r in ok]
    a, b = summarize(client), summarize(inside)
    out = {"n_requests": len(ok), "failed": len(requests) - len(ok)}
    for m in METRICS:
        x, y = getattr(a, m).mean, getattr(b, m).mean
        out[m] = {"loadgen_s": x, "engine_s": y, "difference": (x - y) / y}
    out["throughput"] = {"loadgen_tok_s": a.throughput, "engine_tok_s": b.throughput,
                         "difference": (a.throughput - b.throughput) / b.throughput}
    path = np.array([c.ttft - e.ttft for c, e in zip(client, inside)])
    out["http_path_s"] = _spread(path)
    # the client's clock holds the engine's, request by request: it starts before the handler
    # runs and stops after the last token's forward pass, so this is never negative
    out["e2e_path_s"] = _spread(np.array([c.latency - e.latency for c, e in zip(client, inside)]))
    # the part of it inside the server: from the forward pass's end to the handler passing the
    # first chunk to the HTTP layer (the token's hop from the engine's thread to the event loop,
    # detokenizing, JSON); the rest is the request's and the chunk's trips and parsing
    by_id = {r["id"]: r for r in records}
    firsts = [by_id[r["id"]].get("first_chunk_s") for r in ok]
    if firsts and all(f is not None for f in firsts):
        handover = np.array([f - e.token_times_s[0] for f, e in zip(firsts, inside)])
        out["handover_s"] = _spread(handover)
        out["trips_s"] = _spread(path - handover)   # the HTTP path outside the server
    return out


def _spread(x: np.ndarray) -> dict:
    return {"median": float(np.median(x)), "p90": float(np.quantile(x, 0.9)),
            "min": float(x.min()), "max": float(x.max())}


def measure(regime: Regime, threads: int = 1, model: str = "course-target") -> dict:
    """Serve ``model`` with ``regime``'s batch, load it with the load generator's command in a
    process of its own, and ``compare`` the two views."""
    import torch

    from inferlab.serve.__main__ import build
    from inferlab.serve.background import BackgroundServer

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    app = build(model, max_batch=regime.max_batch, num_blocks=256)
    with BackgroundServer(app) as srv, tempfile.TemporaryDirectory() as tmp:
        import httpx

        for _ in range(3):  # the first requests pay for lazy set-up on both sides
            httpx.post(srv.url + "/v1/completions", timeout=60,
                       json={"model": model, "prompt": [1, 2, 3], "max_tokens": 4})
        app.state.records.clear()
        out = os.path.join(tmp, "load.json")
        cmd = [sys.executable, "-m", "inferlab.loadgen", "--url", srv.url, "--model", model,
               *regime.loadgen_args(), "--detailed", "--no-progress", "--out", out]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
        with open(out) as f:
            [run] = json.load(f)["runs"]
        records = list(app.state.records)
    return {"regime": asdict(regime), **compare(run["requests"], records)}


def table(results: list[dict]) -> str:
    lines = [f"{'regime':<8}{'metric':<12}{'load generator':>16}{'engine':>12}{'difference':>12}"]
    for r in results:
        name = r["regime"]["name"]
        for m, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("latency", "E2E")):
            lines.append(f"{name:<8}{label:<12}{r[m]['loadgen_s'] * 1e3:>13.1f} ms"
                         f"{r[m]['engine_s'] * 1e3:>9.1f} ms{r[m]['difference']:>+12.1%}")
        t = r["throughput"]
        lines.append(f"{name:<8}{'throughput':<12}{t['loadgen_tok_s']:>10.0f} tok/s"
                     f"{t['engine_tok_s']:>6.0f} tok/s{t['difference']:>+12.1%}")
        h = r["http_path_s"]
        lines.append(f"{name:<8}HTTP path: client TTFT - engine TTFT per request, median "
                     f"{h['median'] * 1e3:.1f} ms, p90 {h['p90'] * 1e3:.1f} ms, max "
                     f"{h['max'] * 1e3:.1f} ms ({r['n_requests']} requests, {r['failed']} failed)")
        if "handover_s" in r:
            lines.append(f"{'':<8}of which inside the server (first token to first chunk "
                         f"handed to HTTP): median {r['handover_s']['median'] * 1e3:.1f} ms, p90 "
                         f"{r['handover_s']['p90'] * 1e3:.1f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.loadgen_agreement",
                                description=__doc__.split("\n")[0])
    p.add_argument("--regimes", default=",".join(REGIMES), help="comma-separated: "
                   + ", ".join(REGIMES))
    p.add_argument("--threads", type=int, default=1, help="the engine's torch threads")
    p.add_argument("--json", nargs="?", const="", default=None, metavar="PATH",
                   help="also write the results, with provenance, to PATH (default: "
                        "data/measurements/loadgen_agreement_<device>_<date>.json)")
    a = p.parse_args(argv)
    from inferlab.analysis.hardware import detect_device

    info = detect_device("cpu")
    names = [n.strip() for n in a.regimes.split(",") if n.strip()]
    unknown = sorted(set(names) - set(REGIMES))
    if unknown:
        p.error(f"unknown regime(s) {unknown}; use {sorted(REGIMES)}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{info.name}, {a.threads} engine thread(s), torch {info.torch_version}; "
          f"load average {load}")
    results = []
    for name in names:
        results.append(measure(REGIMES[name], a.threads))
        print(table(results[-1:]), flush=True)
    if a.json is not None:
        from inferlab.measurements import write_record

        record = {"benchmark": "loadgen_agreement", "model": "course-target",
                  "command": " ".join(["python -m inferlab.benchmarks.loadgen_agreement",
                                       *(argv if argv is not None else sys.argv[1:])]),
                  "threads": a.threads, "load_start": load,
                  "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
                  "results": results}
        print(f"wrote {write_record(record, info, a.json or None)}")
    worst = {m: max(abs(r[m]["difference"]) for r in results) for m in (*METRICS, "throughput")}
    print("largest difference: " + ", ".join(f"{m} {v:.1%}" for m, v in worst.items())
          + ("" if math.isfinite(sum(worst.values())) else " (some runs failed)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
