"""Prefill and decode apart: chunked prefill measured on the engine, disaggregation simulated.

    python -m inferlab.benchmarks.prefill_decode --threads 1         # the engine part (CPU: ~1 min)

The engine part serves a mixed trace (``inferlab.sim.workloads.mixed_requests``: short prompts
that decode for a long time, and long prompts arriving while they do) without chunking and at
several token budgets, ``--repeats`` times in interleaved order, and prints each configuration's
median largest generation stall, TPOT p50/p99, throughput and the long prompts' TTFT
(``inferlab.analysis.interference``). Then it calibrates the simulator on the steps of runs of
ANOTHER mixed trace (``FittedCosts.from_iterations``) and prints its error in throughput and
TPOT on this one. It ends with the two bars of Chapter 7: the stall cut by at least 3x at a
budget whose throughput is within 10% of unchunked serving, and the simulator within 15%.

With ``--out`` (always on a GPU) the results are written, with provenance, as a JSON record.
Chapter 7's cluster study (per-GPU goodput of colocated, chunked and disaggregated serving) is a
simulation, stored apart: ``python -m inferlab.sim.cluster_study --write``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from inferlab.analysis.hardware import detect_device
from inferlab.analysis.interference import chunk_sweep, interference, simulator_error
from inferlab.device import check_dtype, choose_profile, get_profile
from inferlab.measurements import write_record
from inferlab.model.llama import build_model
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import pool_blocks, serve
from inferlab.sim.simulator import FittedCosts, simulate
from inferlab.sim.workloads import MIXED_TRACES, mixed_requests

SIZES = MIXED_TRACES  # each device profile's mixed trace, model, batch and budgets
STALL_BAR, THROUGHPUT_BAR, SIMULATOR_BAR = 3.0, 0.10, 0.15


def trace(sizes: dict, vocab_size: int, seed: int = 0):
    """The profile's mixed trace."""
    n_chat, chat_in, chat_out, n_long, long_in, long_out, gap = sizes["trace"]
    return mixed_requests(n_chat, chat_in, chat_out, n_long, long_in, long_out, gap, gap * 0.6,
                          vocab_size=vocab_size, seed=seed)


def calibration_trace(sizes: dict, vocab_size: int):
    """Another mixed trace to fit the simulator's costs on: other tokens, shorter answers,
    and long prompts of three lengths around the measured trace's."""
    n_chat, chat_in, chat_out, n_long, long_in, long_out, gap = sizes["trace"]
    return mixed_requests(n_chat, chat_in, chat_out * 3 // 4, 3,
                          [long_in * 3 // 4, long_in, long_in * 5 // 4], long_out, gap, gap / 2,
                          vocab_size=vocab_size, seed=1)


def engine_part(model, sizes: dict, repeats: int, log=print) -> dict:
    """Measure the chunk sweep on the engine; calibrate and check the simulator."""
    requests = trace(sizes, model.config.vocab_size)
    config = ServingConfig(max_batch=sizes["max_batch"])
    config = config.replace(num_blocks=pool_blocks(model, requests, config))
    run_engine = lambda reqs, c: serve(model, reqs, c)  # noqa: E731
    run_engine(requests[:2], config)  # warm-up
    t0 = time.perf_counter()
    measured = chunk_sweep(run_engine, requests, config, sizes["budgets"], repeats)
    log(f"served {len(requests)} requests x {len(measured)} configurations x {repeats} in "
        f"{time.perf_counter() - t0:.1f} s (medians):")
    for m in measured:
        log(f"  {m.label:14s} stall {m.stall_s * 1e3:7.1f} ms | TPOT p50 {m.tpot_p50_s * 1e3:6.2f} "
            f"p99 {m.tpot_p99_s * 1e3:6.2f} ms | {m.throughput:7.1f} tok/s | long TTFT "
            f"{m.long_ttft_s * 1e3:7.1f} ms | {m.steps} forward passes")
    # the simulator, calibrated on the steps of runs of another (shorter) trace
    other = calibration_trace(sizes, model.config.vocab_size)
    logged = []
    for c in (config, *(config.replace(policy="chunked", token_budget=b)
                        for b in sizes["budgets"])):
        logged += serve(model, other, c).iterations
    costs = FittedCosts.from_iterations(logged, "steps of runs of another mixed trace")
    sim = lambda reqs, c: simulate(reqs, costs, c)  # noqa: E731
    predicted = chunk_sweep(sim, requests, config, sizes["budgets"], repeats=1)
    errors = simulator_error(measured, predicted)
    for e in errors:
        log(f"  simulator, {e['label']:14s}: throughput {e['predicted_tok_s']:7.1f} vs "
            f"{e['measured_tok_s']:7.1f} tok/s ({e['throughput_error']:+.1%}), mean TPOT "
            f"{e['predicted_tpot_s'] * 1e3:6.2f} vs {e['measured_tpot_s'] * 1e3:6.2f} ms "
            f"({e['tpot_error']:+.1%})")
    return {"config": {"max_batch": config.max_batch, "num_blocks": config.num_blocks,
                       "block_size": config.block_size},
            "trace": dict(zip(("n_chat", "chat_prompt", "chat_output", "n_long", "long_prompt",
                               "long_output", "gap_s"), sizes["trace"])),
            "repeats": repeats, "results": [m.row() for m in measured],
            "simulator": {"prefill": costs.prefill, "decode": costs.decode, "mixed": costs.mixed,
                          "errors": errors},
            "bars": bars(measured, errors)}


def bars(measured, errors) -> dict:
    """Chapter 7's bars: the best stall cut at a budget within 10% of unchunked throughput, and
    the simulator's largest error."""
    whole, chunked = measured[0], measured[1:]
    fair = [m for m in chunked if m.throughput >= (1 - THROUGHPUT_BAR) * whole.throughput]
    best = min(fair, key=lambda m: m.stall_s) if fair else None
    cut = whole.stall_s / best.stall_s if best else 0.0
    worst = max(max(abs(e["throughput_error"]), abs(e["tpot_error"])) for e in errors)
    return {"stall_cut": cut, "at": best.label if best else None,
            "throughput_ratio": best.throughput / whole.throughput if best else None,
            "stall_bar_met": cut >= STALL_BAR, "simulator_worst_error": worst,
            "simulator_bar_met": worst <= SIMULATOR_BAR}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.prefill_decode",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=None, help="cpu, small-gpu or large-gpu")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args(argv)

    profile = get_profile(args.profile) if args.profile else choose_profile()
    device = args.device or profile.device
    dtype = check_dtype(args.dtype or profile.dtype, device)
    if args.threads:
        torch.set_num_threads(args.threads)
    info = detect_device(device)
    record = {"benchmark": "prefill_decode", "profile": profile.name,
              "load_average_before": list(os.getloadavg()),
              "command": "python -m inferlab.benchmarks.prefill_decode " + " ".join(
                  argv if argv is not None else sys.argv[1:])}
    if not args.skip_engine:
        sizes = SIZES[profile.name]
        model = build_model(sizes["model"], seed=0, device=device, dtype=dtype)
        print(f"{sizes['model']} ({str(dtype).removeprefix('torch.')}) on {info.name}, "
              f"{torch.get_num_threads()} thread(s); load average {os.getloadavg()[0]:.2f}")
        record.update(model=sizes["model"], dtype=str(dtype).removeprefix("torch."),
                      engine=engine_part(model, sizes, args.repeats))
        b = record["engine"]["bars"]
        if b["at"] is None:
            stall = (f"no token budget kept throughput within {THROUGHPUT_BAR:.0%} of unchunked "
                     "serving: NOT met")
        else:
            stall = (f"largest stall cut {b['stall_cut']:.1f}x at {b['at']} (throughput "
                     f"{b['throughput_ratio']:.2f}x of unchunked): "
                     f"{'met' if b['stall_bar_met'] else 'NOT met'}")
        print(f"bars: {stall}; simulator's worst error {b['simulator_worst_error']:.1%}: "
              f"{'met' if b['simulator_bar_met'] else 'NOT met'}")
    record["load_average_after"] = list(os.getloadavg())
    if args.out is not None or device == "cuda":
        print(f"wrote {write_record(record, info, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
