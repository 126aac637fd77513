"""PagedAttention in numbers: memory per reservation policy, sharing, prefix hits, kernel cost.

    python -m inferlab.benchmarks.paged                   # everything, sizes from the profile
    python -m inferlab.benchmarks.paged --skip-kernels    # only the memory experiments (seconds)
    python -m inferlab.benchmarks.paged --batch 64 --context 2048 --heads 32 --head-dim 128

Memory (device-independent; ``inferlab.sim.memory_sim``, ``inferlab.serving.prefix_cache``):
- the share of a KV pool holding real token states, and the sequences batched at once, under
  max-length, power-of-two, exact reservation and 16-token paging, for a pool of 12 GiB of
  Llama-2-13B-shaped KV (the paper's OPT-13B setting: 15.7K token slots), on the synthetic
  ShareGPT-like and Alpaca-like traces;
- the memory copy-on-write saves for parallel sampling;
- the block hit rate and prefill saved by prefix caching with a shared system prompt.

Kernels (timed with ``inferlab.timing.time_fn``): decode attention of ``--batch`` sequences of
``--context`` tokens, contiguous ``scaled_dot_product_attention`` against the paged cache's
gather-then-attend path, and on a GPU with Triton the fused kernel
(``inferlab.serving.paged_triton``). On a GPU the run is recorded, with provenance, in
``data/measurements/paged_<device>_<date>.json`` (``--json`` picks another path).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from inferlab.analysis import formulas
from inferlab.sim import memory_sim, traces
from inferlab.serving import paged_triton
from inferlab.device import check_dtype, choose_profile
from inferlab.analysis.hardware import detect_device
from inferlab.model.config import ModelConfig
from inferlab.serving.block_manager import BlockAllocator, BlockTable
from inferlab.serving.paged_cache import gather_index, gather_kv
from inferlab.serving.prefix_cache import prefix_sharing_experiment
from inferlab.timing import time_fn
from inferlab.measurements import write_record

PAPER_KV_GIB = 12  # KV memory of OPT-13B on one A100-40GB (Kwon et al. 2023, Table 1 / Sec. 3)
SYSTEM_PROMPT = 341  # tokens of the shared 5-shot prefix in the paper's Sec. 6.4


def paper_pool_slots() -> int:
    """Token slots in 12 GiB of KV for a 13B model of OPT-13B's shape (Llama-2-13B, fp16)."""
    config = ModelConfig.from_name("llama-2-13b")
    return PAPER_KV_GIB * 2**30 // formulas.kv_bytes_per_token(config, "float16")


def memory_report(requests: int = 1000, block_size: int = 16, samples: int = 4) -> dict:
    """Every memory number of the chapter, on both synthetic traces."""
    capacity = paper_pool_slots()
    out = {"pool_slots": capacity, "block_size": block_size, "requests": requests}
    for name in traces.WORKLOADS:
        rows = getattr(traces, name)(requests)
        out[name] = {
            "policies": {p: vars(memory_sim.simulate(rows, p, capacity, block_size=block_size))
                         for p in memory_sim.POLICIES},
            "sharing_saving": statistics.mean(
                memory_sim.sharing_saving(r.prompt_len, r.output_len, samples, block_size)
                for r in rows[:200]),
            "prefix": prefix_sharing_experiment([r.prompt_len for r in rows], SYSTEM_PROMPT,
                                                block_size=block_size),
        }
    out["samples"] = samples
    return out


def kernel_inputs(batch: int, context: int, n_heads: int, n_kv_heads: int, head_dim: int,
                  block_size: int = 16, dtype=torch.float32, device="cpu", seed: int = 0) -> dict:
    """The same K/V stored twice: contiguous (B, K, N, D), and paged with scattered blocks."""
    g = torch.Generator().manual_seed(seed)
    blocks_each = -(-context // block_size)
    num_blocks = batch * blocks_each
    alloc = BlockAllocator(num_blocks)
    alloc._free = type(alloc._free)(torch.randperm(num_blocks, generator=g).tolist())  # scatter
    tables = []
    for _ in range(batch):
        t = BlockTable(alloc, block_size)
        t.append(context)
        tables.append(t)
    q = torch.randn(batch, n_heads, 1, head_dim, generator=g).to(device, dtype)
    k = torch.randn(batch, n_kv_heads, context, head_dim, generator=g).to(device, dtype)
    v = torch.randn(batch, n_kv_heads, context, head_dim, generator=g).to(device, dtype)
    k_pool = torch.zeros(num_blocks * block_size, n_kv_heads, head_dim, dtype=dtype, device=device)
    v_pool = torch.zeros_like(k_pool)
    index = gather_index(tables, [context] * batch, device)  # (B, N)
    k_pool[index] = k.transpose(1, 2)  # (B, N, K, D) into the slots
    v_pool[index] = v.transpose(1, 2)
    block_table = torch.tensor([t.blocks for t in tables], dtype=torch.int32, device=device)
    return dict(q=q, k=k, v=v, k_pool=k_pool, v_pool=v_pool, index=index, block_size=block_size,
                block_table=block_table, mask=torch.ones(batch, 1, 1, context, dtype=torch.bool,
                                                         device=device),
                context_lens=torch.full((batch,), context, dtype=torch.int32, device=device))


def attention_paths(x: dict) -> dict:
    """The decode-attention implementations to compare, as functions of no arguments."""
    gqa = x["q"].shape[1] != x["k"].shape[1]
    k_buf, v_buf = torch.empty_like(x["k_pool"]), torch.empty_like(x["v_pool"])  # as the cache reuses its own
    paths = {
        "contiguous": lambda: F.scaled_dot_product_attention(x["q"], x["k"], x["v"],
                                                             enable_gqa=gqa),
        "gather_then_attend": lambda: F.scaled_dot_product_attention(
            x["q"], gather_kv(x["k_pool"], x["index"], k_buf),
            gather_kv(x["v_pool"], x["index"], v_buf),
            attn_mask=x["mask"], enable_gqa=gqa),
    }
    if paged_triton.available(x["q"].device):
        K, D = x["k"].shape[1], x["k"].shape[3]
        k_cache = x["k_pool"].view(-1, x["block_size"], K, D)
        v_cache = x["v_pool"].view(-1, x["block_size"], K, D)
        paths["triton_fused"] = lambda: paged_triton.paged_decode_attention(
            x["q"], k_cache, v_cache, x["block_table"], x["context_lens"])
    return paths


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
        print(f"\n{name}: policy        tokens  reserved  internal  free-unusable  batched  "
              "preempted")
        for p, s in r["policies"].items():
            print(f"  {p:>20} {s['token_fraction']:>7.1%} {s['reserved_fraction']:>9.1%} "
                  f"{s['internal_fraction']:>9.1%} {s['free_fraction']:>14.1%} "
                  f"{s['mean_running']:>8.2f} {s['preemptions']:>10}")
        print(f"  copy-on-write, {report['samples']} parallel samples: "
              f"{r['sharing_saving']:.1%} of KV memory saved (mean over 200 requests)")
        px = r["prefix"]
        print(f"  prefix caching, {SYSTEM_PROMPT}-token shared system prompt: block hit rate "
              f"{px['hit_rate']:.1%}, prefill tokens saved {px['prefill_saved']:.1%}")


def main(argv=None) -> int:
    profile = choose_profile()
    gpu = profile.device == "cuda"
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.paged",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="trace rows to serve")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--device", default=profile.device, choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default=str(profile.dtype).removeprefix("torch."))
    parser.add_argument("--batch", type=int, default=32 if gpu else 8)
    parser.add_argument("--context", type=int, default=2048 if gpu else 1024)
    parser.add_argument("--heads", type=int, default=32 if gpu else 8)
    parser.add_argument("--kv-heads", type=int, default=None, help="default: --heads (MHA)")
    parser.add_argument("--head-dim", type=int, default=128 if gpu else 64)
    parser.add_argument("--min-run-time", type=float, default=profile.min_run_time)
    parser.add_argument("--json", type=Path, help="write the results here, with provenance "
                        "(default on a GPU: data/measurements/paged_<device>_<date>.json)")
    args = parser.parse_args(argv)

    report = memory_report(args.requests, args.block_size)
    _print_memory(report)
    record = {"benchmark": "paged", "command": " ".join(["python -m inferlab.benchmarks.paged",
                                                         *(argv if argv is not None else sys.argv[1:])]),
              "memory": report}
    if not args.skip_kernels:
        dtype = check_dtype(args.dtype, args.device)
        info = detect_device(args.device)
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
        if not paged_triton.available(args.device):
            print("  (no fused Triton kernel here: it needs Triton and a CUDA GPU)")
        record.update(shape=shape, dtype=str(dtype).removeprefix("torch."), kernels=times,
                      results=[{"path": k, **v} for k, v in times.items()])
    if args.json or args.device == "cuda":  # a GPU run is always recorded
        out = write_record(record, info, args.json)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
