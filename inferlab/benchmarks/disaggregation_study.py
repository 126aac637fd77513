"""Chapter 7's cluster study: colocated, chunked and disaggregated serving at equal GPU count.

    python -m inferlab.benchmarks.prefill_decode --skip-engine --goodput --out FILE.json

Everything here is a simulation (``inferlab.sim.disaggregation``) of Llama-2-13B (the shape of
the OPT-13B that DistServe and the PagedAttention paper evaluate) on A100 80GB GPUs at the
roofline (``StepModel``, efficiency 1: no real engine is faster), four GPUs a cluster:

1. ``goodput``: per-GPU goodput (the highest rate at which 90% of requests meet the SLO,
   after a warm-up; ``inferlab.sim.goodput``) of every design, for the chat-like and the
   long-document stream, at several trace durations: the steady state is where the answer
   stops moving, and the offered rate is reported beside the achieved one.
2. ``short``: the same for short prompts and answers (Alpaca-like lengths).
3. ``low_load``: one request a second on one colocated GPU against a 1P1D pair: what each
   request sees, and what each GPU does.
4. ``links``: the long-document stream's best split over every link of ``data/links.csv``.
5. ``failure``: a decode instance of the best chat split dies mid-run; its requests resume by
   recomputing or by re-sending the prompt's cache, and the cost of each is counted.

The SLOs are OUR choice (``SLOS``), tight enough that interference matters: the papers'
own SLOs belong to their models and hardware.
"""

from __future__ import annotations

import time

from inferlab.analysis.hardware import get_device_spec
from inferlab.analysis.request_time import link_bandwidths
from inferlab.model.config import ModelConfig
from inferlab.serving.metrics import SLO, largest_gap
from inferlab.sim.disaggregation import Failure, designs, simulate_cluster
from inferlab.sim.goodput import goodput_rate, steady_summary
from inferlab.sim.workloads import stream

MODEL, DEVICE, GPUS, LINK = "llama-2-13b", "A100 80GB SXM", 4, "NVLink A100"
SLOS = {"chat": SLO(ttft_s=0.25, tpot_s=0.025), "document": SLO(ttft_s=1.0, tpot_s=0.025),
        "short": SLO(ttft_s=0.25, tpot_s=0.025)}
TOKEN_BUDGET = 256
DURATIONS = (30.0, 60.0, 120.0, 240.0)
START = {"chat": 24.0, "document": 4.0, "short": 100.0}  # first rates tried (req/s, 4 GPUs)


def setup(link: str = LINK, gpus: int | None = None):
    config = ModelConfig.from_name(MODEL)
    spec = get_device_spec(DEVICE)
    return designs(config, spec, gpus or GPUS, link_bandwidths()[link],
                   token_budget=TOKEN_BUDGET)


def _goodput(kind: str, cluster, name: str, duration: float, start: float, step: float = 2.0):
    g = goodput_rate(lambda rate: stream(kind, rate, duration),
                     lambda reqs: simulate_cluster(reqs, cluster).run, SLOS[kind],
                     cluster.gpus, name, start=start, step=step, rel_tol=0.05)
    return {"design": name, "duration_s": duration, "rate": g.rate, "per_gpu": g.per_gpu,
            "attainment": g.attainment, "achieved": g.achieved}


def goodput_table(kind: str, durations=DURATIONS, log=print) -> list[dict]:
    """Every design's goodput for ``kind`` at each duration (warm-started from the last)."""
    rows, last = [], {}
    for duration in durations:
        for name, cluster in setup().items():
            t0 = time.perf_counter()
            start = last.get(name) or START[kind]
            row = _goodput(kind, cluster, name, duration, start, 1.25 if name in last else 2.0)
            last[name] = row["rate"] or START[kind] / 4
            rows.append(row)
            log(f"  {kind:8s} {duration:5.0f} s {name:10s} {row['per_gpu']:6.2f} req/s/GPU "
                f"(offered {row['rate']:6.2f}, achieved {row['achieved']:6.2f}, "
                f"{row['attainment']:.0%} in SLO) [{time.perf_counter() - t0:.0f} s]")
    return rows


def low_load(rate: float = 1.0, duration: float = 120.0) -> dict:
    """One colocated GPU against a 1P1D pair at a light chat load."""
    out = {}
    for name, cluster in (("1 colocated", setup(gpus=1)["colocated"]),
                          ("1P1D", setup(gpus=2)["1P1D"])):
        run = simulate_cluster(stream("chat", rate, duration), cluster).run
        s = steady_summary(run, SLOS["chat"])
        out[name] = {"gpus": cluster.gpus, "ttft_p50_s": s.ttft.p50, "tpot_p50_s": s.tpot.p50,
                     "latency_p50_s": s.latency.p50, "attainment": s.slo_attainment,
                     "requests_per_gpu_s": rate / cluster.gpus}
    return out


def links(duration: float = 60.0, log=print) -> list[dict]:
    """The long-document stream's goodput for each split over each link of the table."""
    rows = []
    for link in link_bandwidths():
        for name, cluster in setup(link).items():
            if "P" not in name:
                continue
            row = _goodput("document", cluster, name, duration, START["document"])
            rows.append({"link": link, **row})
            log(f"  {link:16s} {name}: {row['per_gpu']:.2f} req/s/GPU")
    return rows


def failure(split: str, rate: float, duration: float = 60.0, at_s: float = 30.0,
            down_s: float = 10.0) -> dict:
    """Decode instance 0 of ``split`` dies at ``at_s`` for ``down_s`` under a chat load: what
    its requests (the same ones in every mode: the runs agree until the failure) and the
    cluster saw, without a failure and with each way of resuming."""
    cluster = setup()[split]
    requests = stream("chat", rate, duration)
    runs = {"no failure": simulate_cluster(requests, cluster)}
    for mode in ("recompute", "retransfer"):
        runs[mode] = simulate_cluster(requests, cluster, Failure(0, at_s, mode, down_s))
    lost = runs["recompute"].lost
    out = {"split": split, "rate": rate, "at_s": at_s, "down_s": down_s, "lost": len(lost),
           "requests": len(requests)}
    for mode, r in runs.items():
        timings = [r.run.results[i].timing for i in lost]
        out[mode] = {
            "attainment": r.run.summary(SLOS["chat"]).slo_attainment,
            "recomputed_tokens": r.recomputed_tokens, "transfer_bytes": r.transfer_bytes,
            "lost_latency_mean_s": sum(t.latency for t in timings) / len(timings),
            "lost_largest_gap_mean_s": sum(largest_gap(t.token_times_s) for t in timings
                                           if t.n_tokens > 1) / max(1, sum(
                                               t.n_tokens > 1 for t in timings))}
    return out


def run(durations=None, log=print) -> dict:
    """The whole study; a dict for the benchmark's JSON record."""
    durations = tuple(durations or DURATIONS)
    record = {"model": MODEL, "device": DEVICE, "gpus": GPUS, "link": LINK,
              "token_budget": TOKEN_BUDGET, "durations": list(durations),
              "slos": {k: {"ttft_s": v.ttft_s, "tpot_s": v.tpot_s} for k, v in SLOS.items()}}
    t0 = time.perf_counter()
    for kind in ("chat", "document"):
        record[kind] = goodput_table(kind, durations, log)
    record["short"] = goodput_table("short", durations[-2:-1] or durations, log)
    record["low_load"] = low_load()
    record["links"] = links(log=log)
    last = [r for r in record["chat"] if r["duration_s"] == durations[-1] and "P" in r["design"]]
    best = max(last, key=lambda r: r["per_gpu"])
    record["failure"] = failure(best["design"], 0.8 * best["rate"])
    record["seconds"] = time.perf_counter() - t0
    return record
