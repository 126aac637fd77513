"""PagedAttention in numbers: memory per reservation policy, sharing, prefix hits, kernel cost.

    python -m inferlab.benchmarks.paged                   # everything, sizes from the profile
    python -m inferlab.benchmarks.paged --skip-kernels    # only the memory experiments (seconds)
    python -m inferlab.benchmarks.paged --batch 64 --context 2048 --heads 32 --head-dim 128
    python -m inferlab.benchmarks.paged --threads 1      # steadier on a CPU others share

Memory (device-independent; ``inferlab.sim.memory_sim``, ``inferlab.serving.prefix_cache``):
- the share of a KV pool holding real token states, and the sequences batched at once, under
  max-length, power-of-two, exact reservation and 16-token paging, for a pool of 12 GiB of
  Llama-2-13B-shaped KV (the paper's OPT-13B setting: 15.7K token slots,
  ``inferlab.analysis.capacity.paper_pool_slots``), on the synthetic ShareGPT-like and
  Alpaca-like traces, each served by the engine's scheduler and loop;
- the memory copy-on-write saves for parallel sampling;
- the block hit rate and prefill saved by prefix caching with a shared system prompt.

Kernels (timed with ``inferlab.timing.time_fn``): decode attention of ``--batch`` sequences of
``--context`` tokens (sizes from the device profile), contiguous
``scaled_dot_product_attention`` against the paged cache's gather-then-attend path
(``inferlab.serving.paged_attention``), and on a GPU with Triton the fused kernel
(``inferlab.serving.paged_triton``). On a GPU the run is recorded, with provenance, in
``data/measurements/paged_<device>_<date>.json`` (``--json`` picks another path).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from inferlab.analysis.capacity import paper_pool_slots
from inferlab.analysis.hardware import detect_device
from inferlab.device import check_dtype, choose_profile
from inferlab.measurements import write_record
from inferlab.serving.config import BLOCK_SIZE
from inferlab.benchmarks.attention_paths import attention_paths, kernel_inputs
from inferlab.sim.memory_sim import prefix_sharing_experiment
from inferlab.serving.reservation import RESERVATIONS
from inferlab.sim import memory_sim, traces
from inferlab.timing import time_fn


def memory_report(requests: int = 1000, block_size: int = BLOCK_SIZE, samples: int = 4) -> dict:
    """Every memory number of the chapter, on both synthetic traces."""
    capacity = paper_pool_slots()
    out = {"pool_slots": capacity, "block_size": block_size, "requests": requests}
    for name in traces.WORKLOADS:
        rows = getattr(traces, name)(requests)
        out[name] = {
            "policies": {p: vars(memory_sim.simulate_memory(rows, p, capacity,
                                                            block_size=block_size))
                         for p in RESERVATIONS},
            "sharing_saving": statistics.mean(
                memory_sim.sharing_saving(r.prompt_len, r.output_len, samples, block_size)
                for r in rows[:200]),
            "prefix": prefix_sharing_experiment([r.prompt_len for r in rows],
                                                traces.SYSTEM_PROMPT, block_size=block_size),
        }
    out["samples"] = samples
    return out


def time_kernels(x: dict, min_run_time: float = 0.2) -> dict:
    """Median seconds of each path, after checking that they all agree."""
    paths = attention_paths(x)
    reference = paths["contiguous"]().float()
    tol = 1e-4 if x["q"].dtype == torch.float32 else 2e-2
    for name, fn in paths.items():
        torch.testing.assert_close(fn().float(), reference, atol=tol, rtol=tol,
                                   msg=lambda m, name=name: f"{name} disagrees: {m}")
    kv_bytes = 2 * x["k"].numel() * x["k"].element_size()
    out = {}
    for name, fn in paths.items():
        seconds = time_fn(fn, min_run_time=min_run_time, label=name).median_s
        out[name] = {"median_s": seconds, "kv_gb_per_s": kv_bytes / seconds / 1e9,
                     "vs_contiguous": None}
    for name in out:
        out[name]["vs_contiguous"] = out[name]["median_s"] / out["contiguous"]["median_s"]
    return out


def _print_memory(report: dict) -> None:
    print(f"KV pool: {report['pool_slots']} token slots (12 GiB of Llama-2-13B-shaped fp16 KV), "
          f"{report['requests']} requests waiting, block size {report['block_size']}")
    for name in traces.WORKLOADS:
        r = report[name]
        print(f"\n{name}: reservation   tokens  reserved  internal  free-unusable  batched  "
              "preempted")
        for p, s in r["policies"].items():
            if s["mean_running"] == 0:  # MemoryUse averages only steps where someone waited
                print(f"  {p:>20}   the pool held every request at once: memory never limited "
                      "the batch (serve more requests)")
                continue
            print(f"  {p:>20} {s['token_fraction']:>7.1%} {s['reserved_fraction']:>9.1%} "
                  f"{s['internal_fraction']:>9.1%} {s['free_fraction']:>14.1%} "
                  f"{s['mean_running']:>8.2f} {s['preemptions']:>10}")
        print(f"  copy-on-write, {report['samples']} parallel samples: "
              f"{r['sharing_saving']:.1%} of KV memory saved (mean over 200 requests)")
        px = r["prefix"]
        print(f"  prefix caching, {traces.SYSTEM_PROMPT}-token shared system prompt: block hit rate "
              f"{px['hit_rate']:.1%}, prefill tokens saved {px['prefill_saved']:.1%}")


def main(argv=None) -> int:
    profile = choose_profile()
    sizes = profile.attention
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.paged",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="trace rows to serve")
    parser.add_argument("--block-size", type=int, default=BLOCK_SIZE)
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--device", default=profile.device, choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default=str(profile.dtype).removeprefix("torch."))
    parser.add_argument("--batch", type=int, default=sizes.batch)
    parser.add_argument("--context", type=int, default=sizes.context)
    parser.add_argument("--heads", type=int, default=sizes.n_heads)
    parser.add_argument("--kv-heads", type=int, default=None, help="default: --heads (MHA)")
    parser.add_argument("--head-dim", type=int, default=sizes.head_dim)
    parser.add_argument("--min-run-time", type=float, default=profile.min_run_time)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 is steadier on a machine others share)")
    parser.add_argument("--json", type=Path, help="write the results here, with provenance "
                        "(default on a GPU: data/measurements/paged_<device>_<date>.json)")
    args = parser.parse_args(argv)

    report = memory_report(args.requests, args.block_size)
    _print_memory(report)
    record = {"benchmark": "paged", "command": " ".join(["python -m inferlab.benchmarks.paged",
                                                         *(argv if argv is not None else sys.argv[1:])]),
              "memory": report}
    if args.threads:
        torch.set_num_threads(args.threads)
    info = detect_device(args.device)
    if not args.skip_kernels:
        dtype = check_dtype(args.dtype, args.device)
        shape = dict(batch=args.batch, context=args.context, n_heads=args.heads,
                     n_kv_heads=args.kv_heads or args.heads, head_dim=args.head_dim,
                     block_size=args.block_size)
        x = kernel_inputs(**shape, dtype=dtype, device=args.device)
        times = time_kernels(x, args.min_run_time)
        print(f"\ndecode attention, {shape}, {str(dtype).removeprefix('torch.')}, on {info.name} "
              f"({info.threads} threads, torch {info.torch_version}):")
        for name, t in times.items():
            print(f"  {name:>20}: {t['median_s'] * 1e3:8.3f} ms  {t['vs_contiguous']:5.2f}x "
                  f"contiguous  ({t['kv_gb_per_s']:.1f} GB/s of K/V)")
        if "triton_fused" not in times:
            print("  (no fused Triton kernel here: it needs Triton and a CUDA GPU)")
        record.update(shape=shape, dtype=str(dtype).removeprefix("torch."), kernels=times,
                      results=[{"path": k, **v} for k, v in times.items()])
    if args.json or args.device == "cuda":  # a GPU run is always recorded
        out = write_record(record, info, args.json)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
