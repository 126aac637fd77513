"""Cached vs recomputed decoding: the time to produce one token as the context grows.

    python -m inferlab.benchmarks.kv_cache                      # 128, 512, 2048 tokens
    python -m inferlab.benchmarks.kv_cache --contexts 64 256 1024 --model small --batch 4

For each context length n, "recomputed" runs the whole sequence of n tokens through the model
to get the next token's logits (what generation without a cache does at every step), and
"cached" runs only the newest token against a KV cache already holding the n - 1 before it.
Both are timed with ``inferlab.timing.time_fn`` (``torch.utils.benchmark``), as medians, by
``inferlab.analysis.decode_timing``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from inferlab.analysis import formulas
from inferlab.analysis.decode_timing import cached_step_seconds, recompute_step_seconds
from inferlab.analysis.hardware import detect_device
from inferlab.device import check_dtype, choose_profile
from inferlab.measurements import write_record
from inferlab.model.llama import build_model

DEFAULT_CONTEXTS = (128, 512, 2048)


def measure(model, contexts=DEFAULT_CONTEXTS, batch: int = 1, min_run_time: float = 0.2,
            progress: bool = False) -> list[dict]:
    """One row per context: both times, the measured speed-up and the FLOP-count prediction."""
    rows = []
    iterator = contexts
    if progress:
        from tqdm.auto import tqdm
        iterator = tqdm(contexts, desc="contexts")
    for n in iterator:
        if n > model.config.max_seq_len:
            raise ValueError(f"context {n} exceeds the model's {model.config.max_seq_len} tokens")
        cached = cached_step_seconds(model, n, batch, min_run_time)
        recomputed = recompute_step_seconds(model, n, batch, min_run_time)
        rows.append({"context": n, "batch": batch, "cached_s": cached, "recomputed_s": recomputed,
                     "speedup": recomputed / cached,
                     "flop_ratio": formulas.recompute_flops(model.config, n)
                     / formulas.flops_per_token(model.config, n - 1)})
    return rows


def main(argv=None) -> int:
    profile = choose_profile()
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.kv_cache",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=list(DEFAULT_CONTEXTS))
    parser.add_argument("--model", default=profile.model, help="a row of data/models.csv")
    parser.add_argument("--dtype", default=str(profile.dtype).removeprefix("torch."))
    parser.add_argument("--device", default=profile.device, choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--min-run-time", type=float, default=profile.min_run_time)
    parser.add_argument("--json", type=Path, help="also write the results here, with provenance")
    args = parser.parse_args(argv)
    dtype = check_dtype(args.dtype, args.device)
    info = detect_device(args.device)
    model = build_model(args.model, seed=0, device=args.device, dtype=dtype)
    if max(args.contexts) > model.config.max_seq_len:
        model = build_model(model.config.scaled(max_seq_len=max(args.contexts)), seed=0,
                            device=args.device, dtype=dtype)
    print(f"model {args.model} ({dtype}), batch {args.batch}, on {info.name} "
          f"({info.threads} threads, torch {info.torch_version})")
    rows = measure(model, args.contexts, args.batch, args.min_run_time)
    print(f"{'context':>8} {'cached ms':>10} {'recomputed ms':>14} {'speed-up':>9} {'FLOP ratio':>11}")
    for r in rows:
        print(f"{r['context']:>8} {r['cached_s'] * 1e3:>10.3f} {r['recomputed_s'] * 1e3:>14.3f} "
              f"{r['speedup']:>8.1f}x {r['flop_ratio']:>10.1f}x")
    if args.json:
        record = {"benchmark": "kv_cache", "command": " ".join(["python -m inferlab.benchmarks.kv_cache",
                                                                *(argv or sys.argv[1:])]),
                  "model": args.model, "dtype": str(dtype).removeprefix("torch."),
                  "results": rows}
        out = write_record(record, info, args.json)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
