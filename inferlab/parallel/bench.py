"""The all-reduce of tensor parallelism, counted and timed on the link this machine has.

    python -m inferlab.parallel.bench                       # course-target shape, 2 gloo ranks
    python -m inferlab.parallel.bench --tokens 1 8 64 --out data/measurements/tp_allreduce_cpu.json

A tensor-parallel forward all-reduces one d-wide activation per token twice per layer, so each
rank puts 2 x layers x d x bytes-per-element into all-reduces per token
(``inferlab.parallel.tensor.all_reduce_bytes_per_token``). This command starts the ranks, times
one all-reduce of a (tokens, d) tensor for each token count, and reports the time per call, the
bytes per call, and the all-reduce time a whole forward would spend per step (2 x layers calls).
On the CPU the ranks use gloo over 127.0.0.1, whose cost is mostly fixed per call (process
wake-ups and the loopback stack), not bytes over a wire; the chapter scales the bytes to NVLink
and InfiniBand with the step-time model.

Reading the times the way NCCL's own tests do (nccl-tests ``doc/PERFORMANCE.md``, sections
"Time" and "AllReduce"): a call costs a fixed overhead plus size over bandwidth, so
``fit_overhead_bandwidth`` fits t = overhead + S / algbw over the sizes measured; an all-reduce
of S bytes over n ranks moves 2 (n - 1) / n x S bytes through each rank's link, so the "bus
bandwidth" comparable with a link's peak is algbw x 2 (n - 1) / n.

The ranks must call the collective the same number of times, so each rank times a fixed number
of calls with ``torch.utils.benchmark.Timer.timeit`` (not ``blocked_autorange``, which picks its
own count and would leave one rank waiting for a call the other never makes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from inferlab.device import bytes_per_element, parse_dtype
from inferlab.parallel.launch import run_ranks
from inferlab.parallel.tensor import all_reduce_bytes_per_token

DEFAULT_TOKENS = (1, 8, 64, 512, 4096)


def time_all_reduce(rank: int, world_size: int, d_model: int, tokens: list[int], dtype: str,
                    calls: int, blocks: int) -> list[dict]:
    """Rank program: median over ``blocks`` of the mean time of ``calls`` all-reduces, per size."""
    import torch.distributed as dist
    import torch.utils.benchmark as benchmark

    rows = []
    for t in tokens:
        x = torch.ones(t, d_model, dtype=parse_dtype(dtype))
        timer = benchmark.Timer(stmt="dist.all_reduce(x)", globals={"dist": dist, "x": x})
        dist.barrier()
        per_call = [timer.timeit(calls).mean for _ in range(blocks)]
        rows.append({"tokens": t, "bytes_per_call": x.numel() * x.element_size(),
                     "seconds_per_call": statistics.median(per_call),
                     "seconds_per_call_min": min(per_call)})
    return rows


def fit_overhead_bandwidth(rows: list[dict]) -> tuple[float, float]:
    """Least-squares t = overhead + bytes / algbw over ``rows``: (overhead s, algbw bytes/s)."""
    size = torch.tensor([float(r["bytes_per_call"]) for r in rows], dtype=torch.float64)
    t = torch.tensor([r["seconds_per_call"] for r in rows], dtype=torch.float64)
    design = torch.stack([torch.ones_like(size), size], dim=1)  # (n, 2)
    overhead, per_byte = torch.linalg.lstsq(design, t[:, None]).solution[:, 0].tolist()
    return overhead, (1.0 / per_byte if per_byte > 0 else float("inf"))


def bus_factor(world_size: int) -> float:
    """Bytes through each rank's link per byte all-reduced: 2 (n - 1) / n (nccl-tests)."""
    return 2 * (world_size - 1) / world_size


def measure(d_model: int, n_layers: int, tokens=DEFAULT_TOKENS, world_size: int = 2,
            dtype: str = "float32", calls: int = 50, blocks: int = 5) -> list[dict]:
    """One row per token count: rank 0's time per all-reduce and the per-step totals."""
    ranks = run_ranks(time_all_reduce, world_size, d_model, list(tokens), dtype, calls, blocks,
                      timeout=120)
    rows = ranks[0]
    for row in rows:
        row["calls_per_step"] = 2 * n_layers
        row["all_reduce_seconds_per_step"] = 2 * n_layers * row["seconds_per_call"]
        row["bytes_per_token"] = 2 * n_layers * d_model * bytes_per_element(dtype)
        row["busbw_bytes_per_s"] = (row["bytes_per_call"] / row["seconds_per_call"]
                                    * bus_factor(world_size))
    return rows


def main(argv=None) -> int:
    from inferlab.analysis.hardware import detect_device
    from inferlab.measurements import write_record
    from inferlab.model.config import ModelConfig

    parser = argparse.ArgumentParser(prog="python -m inferlab.parallel.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="course-target", help="a row of data/models.csv")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(DEFAULT_TOKENS))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--calls", type=int, default=50, help="all-reduces per timed block")
    parser.add_argument("--out", type=Path, help="write the results here, with provenance")
    args = parser.parse_args(argv)
    config = ModelConfig.from_name(args.model)
    info = detect_device("cpu")
    rows = measure(config.d_model, config.n_layers, args.tokens, args.ranks, args.dtype,
                   args.calls)
    per_token = all_reduce_bytes_per_token(config, bytes_per_element(args.dtype))
    print(f"{args.model}: d={config.d_model}, {config.n_layers} layers, {args.dtype}; "
          f"{args.ranks} gloo ranks on {info.name}")
    print(f"all-reduce bytes per token per rank: 2 x {config.n_layers} x {config.d_model} x "
          f"{bytes_per_element(args.dtype)} = {per_token:,}")
    print(f"{'tokens':>7} {'bytes/call':>11} {'us/call':>9} {'all-reduce ms/step':>19}")
    for r in rows:
        print(f"{r['tokens']:>7} {r['bytes_per_call']:>11,} {r['seconds_per_call'] * 1e6:>9.1f} "
              f"{r['all_reduce_seconds_per_step'] * 1e3:>19.3f}")
    overhead, algbw = fit_overhead_bandwidth(rows)
    print(f"fit t = overhead + bytes / algbw: overhead {overhead * 1e6:.1f} us, algbw "
          f"{algbw / 1e9:.2f} GB/s (bus bandwidth {algbw * bus_factor(args.ranks) / 1e9:.2f} GB/s)")
    if args.out:
        record = {"benchmark": "tp_allreduce", "model": args.model, "dtype": args.dtype,
                  "backend": "gloo", "ranks": args.ranks, "link": "127.0.0.1 (loopback)",
                  "command": " ".join(["python -m inferlab.parallel.bench", *(argv or sys.argv[1:])]),
                  "all_reduce_bytes_per_token": per_token, "fit_overhead_s": overhead,
                  "fit_algbw_bytes_per_s": algbw,
                  "fit_busbw_bytes_per_s": algbw * bus_factor(args.ranks), "results": rows}
        print(f"wrote {write_record(record, info, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
