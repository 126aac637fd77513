"""Continuous vs static batching on the same Poisson trace, and the simulator's error.

    python -m inferlab.benchmarks.batching                    # sizes of this machine's profile
    python -m inferlab.benchmarks.batching --rates 5 10 20 40 # a latency-throughput curve too
    python -m inferlab.benchmarks.batching --threads 1        # on a CPU shared with others
    python -m inferlab.benchmarks.batching --profile large-gpu --out data/measurements/x.json

One trace (``inferlab.sim.workloads.sharegpt_requests``: ShareGPT-like lengths scaled to the device,
with Poisson arrivals; sizes from the device profile's ``serving``) is served twice by the same
engine and model: once with static batching, once with
continuous batching. The offered load is the same, high enough to keep both busy, so the
throughput ratio measures how much of the hardware each policy uses. Then the discrete-event
simulator predicts both runs, and its relative error in throughput is printed for two
calibrations of its step costs: prefill and decode step times the engine logged while serving
another (smaller) trace, and isolated step timings with ``torch.utils.benchmark``. Finally the simulator
extrapolates the full-size trace to a model and GPU from the tables (``--extrapolate``).

On a GPU the results are written, with provenance, to ``data/measurements/`` (on a CPU only with
``--out``). Timings on a machine that other programs are using are noisy: rerun on a quiet one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from inferlab.analysis.capacity import kv_blocks_for_device
from inferlab.analysis.hardware import detect_device, get_device_spec
from inferlab.device import check_dtype, choose_profile, get_profile
from inferlab.measurements import write_record
from inferlab.model.config import ModelConfig
from inferlab.model.llama import build_model
from inferlab.serving.config import BLOCK_SIZE, ServingConfig
from inferlab.serving.engine import pool_blocks, serve
from inferlab.serving.run import Run
from inferlab.serving.metrics import Summary
from inferlab.sim import traces, workloads
from inferlab.analysis.step_time import StepModel
from inferlab.sim.simulator import FittedCosts, measure_costs_for, simulate

COMPARED = ("static", "continuous")  # names in inferlab.serving.scheduler.POLICIES


def serve_both(model, requests, config: ServingConfig) -> dict[str, Run]:
    """Serve ``requests`` with each policy under ``config``: ``{policy: run}``.

    Each engine (and its KV cache) is dropped before the next one is built.
    """
    out = {}
    for policy in COMPARED:
        run = serve(model, requests, config.replace(policy=policy))
        bad = [r.error for r in run.results if not r.ok]
        if bad:
            raise ValueError(f"{len(bad)} requests were refused, e.g. {bad[0]}")
        out[policy] = run
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def simulator_error(costs: dict[str, FittedCosts], requests, measured: dict[str, Summary],
                    config: ServingConfig) -> dict[str, dict]:
    """Predicted vs measured throughput for each policy and each calibration.

    ``costs`` maps a calibration's name to its fitted step costs; the relative error is
    predicted / measured - 1.
    """
    out = {}
    for policy, summary in measured.items():
        row = {"measured_tok_s": summary.throughput}
        for name, c in costs.items():
            predicted = simulate(requests, c, config.replace(policy=policy)).summary()
            row[f"predicted_tok_s_{name}"] = predicted.throughput
            row[f"relative_error_{name}"] = predicted.throughput / summary.throughput - 1
        out[policy] = row
    return out


def extrapolate(model_name: str, device_name: str, n: int, rate: float, max_batch: int,
                block_size: int = BLOCK_SIZE, efficiency: float = 1.0, seed: int = 0) -> dict:
    """Simulate the full-size trace for a table model on a table GPU (roofline step times)."""
    config = ModelConfig.from_name(model_name)
    spec = get_device_spec(device_name)
    costs = StepModel.for_device(config, spec, efficiency=efficiency)
    num_blocks = kv_blocks_for_device(config, spec, block_size=block_size)
    rows = traces.sharegpt_like(n, seed=seed)
    requests = workloads.trace_requests(rows, workloads.poisson_arrivals(n, rate, seed=seed))
    out = {"model": model_name, "device": spec.name, "efficiency": efficiency,
           "num_blocks": num_blocks, "rate": rate}
    serving = ServingConfig(block_size=block_size, num_blocks=num_blocks, max_batch=max_batch)
    for policy in COMPARED:
        out[policy] = simulate(requests, costs, serving.replace(policy=policy)).summary().row()
    out["ratio"] = out["continuous"]["throughput_tok_s"] / out["static"]["throughput_tok_s"]
    return out


def _line(policy: str, s: Summary) -> str:
    return (f"  {policy:10s} {s.throughput:9.1f} tok/s | TTFT p50 {s.ttft.p50 * 1e3:8.1f} ms  "
            f"p99 {s.ttft.p99 * 1e3:8.1f} ms | latency p50 {s.latency.p50 * 1e3:8.1f} ms  "
            f"p99 {s.latency.p99 * 1e3:8.1f} ms")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.batching",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=None, help="cpu, small-gpu or large-gpu "
                        "(default: this machine's)")
    parser.add_argument("--device", default=None, help="override the profile's device")
    parser.add_argument("--dtype", default=None, help="override the profile's dtype")
    parser.add_argument("--model", default=None, help="a row of data/models.csv")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--scale", type=float, default=None, help="factor on trace lengths")
    parser.add_argument("--max-batch", type=int, default=None)
    parser.add_argument("--rate", type=float, default=None, help="requests per second")
    parser.add_argument("--rates", type=float, nargs="*", default=None,
                        help="also sweep these rates (the latency-throughput curve)")
    parser.add_argument("--block-size", type=int, default=BLOCK_SIZE)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--min-run-time", type=float, default=0.05,
                        help="seconds per calibration timing")
    parser.add_argument("--extrapolate", nargs=2, default=("llama-2-7b", "A100 80GB SXM"),
                        metavar=("MODEL", "DEVICE"), help="a table model and GPU to simulate")
    parser.add_argument("--extrapolate-rate", type=float, default=32.0,
                        help="requests per second in the extrapolation")
    parser.add_argument("--extrapolate-requests", type=int, default=1000,
                        help="full-size requests in the extrapolation")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args(argv)

    profile = get_profile(args.profile) if args.profile else choose_profile()
    sizes = profile.serving
    device = args.device or profile.device
    dtype = check_dtype(args.dtype or profile.dtype, device)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_name = args.model or sizes.model
    n = args.requests or sizes.requests
    scale = args.scale or sizes.length_scale
    max_batch = args.max_batch or sizes.max_batch
    rate = args.rate or sizes.rate
    bs = args.block_size
    info = detect_device(device)
    model = build_model(model_name, seed=0, device=device, dtype=dtype)
    ctx = model.config.max_seq_len
    print(f"{model_name} ({str(dtype).removeprefix('torch.')}) on {info.name}, "
          f"{torch.get_num_threads()} CPU thread(s); profile {profile.name}")

    requests = workloads.sharegpt_requests(n, scale, rate, model.config.vocab_size, ctx)
    config = ServingConfig(block_size=bs, max_batch=max_batch)
    config = config.replace(num_blocks=pool_blocks(model, requests, config))
    num_blocks = config.num_blocks
    mean_in = sum(len(r.prompt) for r in requests) / n
    mean_out = sum(r.max_new_tokens for r in requests) / n
    print(f"trace: {n} ShareGPT-like requests x{scale:g} (mean prompt {mean_in:.1f}, output "
          f"{mean_out:.1f} tokens), Poisson at {rate:g} req/s; max batch {max_batch}, "
          f"{num_blocks} blocks of {bs}")

    serve_both(model, requests[: min(n, 4)], config)  # warm-up
    start = time.perf_counter()
    runs = serve_both(model, requests, config)
    measured = {p: run.summary() for p, run in runs.items()}
    ratio = measured["continuous"].throughput / measured["static"].throughput
    print(f"served both in {time.perf_counter() - start:.1f} s:")
    for policy, s in measured.items():
        print(_line(policy, s))
    print(f"  continuous / static throughput: {ratio:.2f}x  (preemptions: "
          f"{runs['continuous'].num_preemptions})")

    # Calibrate the simulator twice: on step times the engine logged while serving ANOTHER
    # trace (in place, as the runs see them), and on isolated micro-benchmarks (time_fn).
    calibration = workloads.sharegpt_requests(max(8, n // 4), scale, rate, model.config.vocab_size,
                                           ctx, seed=1)
    cal_runs = serve_both(model, calibration, config)
    costs = {"calibration_run": FittedCosts.from_iterations(
                 cal_runs["static"].iterations + cal_runs["continuous"].iterations,
                 "fitted to the steps of a calibration run on another trace"),
             "microbenchmarks": measure_costs_for(model, requests, config, args.min_run_time)}
    errors = simulator_error(costs, requests, measured, config)
    for policy, e in errors.items():
        print(f"  simulator, {policy:10s}: measured {e['measured_tok_s']:9.1f} tok/s; predicted "
              f"{e['predicted_tok_s_calibration_run']:9.1f} when calibrated on a run of another "
              f"trace (error {e['relative_error_calibration_run']:+.1%}), "
              f"{e['predicted_tok_s_microbenchmarks']:9.1f} from micro-benchmarks "
              f"({e['relative_error_microbenchmarks']:+.1%})")

    curve = []
    for r in args.rates or ():
        reqs = workloads.sharegpt_requests(n, scale, r, model.config.vocab_size, ctx)
        for policy, run in serve_both(model, reqs, config).items():
            s = run.summary()
            curve.append({"rate": r, "policy": policy, **s.row()})
            print(f"rate {r:6.1f}/s" + _line(policy, s))

    ex_model, ex_device = args.extrapolate
    ex = extrapolate(ex_model, ex_device, args.extrapolate_requests, args.extrapolate_rate, 256, bs)
    print(f"simulated {ex_model} on {ex_device} at roofline speed, {args.extrapolate_requests} "
          f"full-size requests at "
          f"{ex['rate']:g} req/s, max batch 256, {ex['num_blocks']} blocks: continuous "
          f"{ex['continuous']['throughput_tok_s']:,.0f} tok/s vs static "
          f"{ex['static']['throughput_tok_s']:,.0f} ({ex['ratio']:.2f}x)")

    if args.out is not None or device == "cuda":  # a GPU run is always recorded
        record = {"benchmark": "batching",
                  "command": "python -m inferlab.benchmarks.batching " + " ".join(
                      argv if argv is not None else sys.argv[1:]),
                  "model": model_name, "dtype": str(dtype).removeprefix("torch."),
                  "requests": n, "length_scale": scale, "rate_req_s": rate,
                  "max_batch": max_batch, "block_size": bs, "num_blocks": num_blocks,
                  "preemptions": runs["continuous"].num_preemptions,
                  "throughput_ratio": ratio,
                  "static": measured["static"].row(), "continuous": measured["continuous"].row(),
                  "simulator": {"costs": {k: {"prefill": c.prefill, "decode": c.decode}
                                          for k, c in costs.items()}, **errors},
                  "results": curve, "extrapolation": ex}
        out = write_record(record, info, args.out)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
