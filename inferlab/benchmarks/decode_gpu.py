"""Batch-1 decode of a Llama-2-7B-shaped model on a GPU, against the bandwidth floor.

    python -m inferlab.benchmarks.decode_gpu                  # eager, then compiled (CUDA graphs)
    python -m inferlab.benchmarks.decode_gpu --no-compile     # eager only
    python -m inferlab.benchmarks.decode_gpu --model medium --dtype float16   # a T4

Random weights (the speed does not depend on their values) in 16-bit. A decode step must read
every weight but the input embedding table (``formulas.decode_bytes_per_step``) plus the KV
cache; the floor is those bytes over the bandwidth, and the fraction reached is floor time over
measured time: gpt-fast's model-bandwidth utilisation, about 72% for Llama-2-7B on an A100
(PyTorch blog, 2023-11-30). Eager PyTorch launches each of a step's hundreds of kernels from
Python, and at batch 1 those launches take longer than the reads; ``torch.compile`` with
``mode="reduce-overhead"`` fuses them and replays the step as one CUDA graph.

The step is compiled over ``StaticKVCache``, whose shapes never change, and calls the model's
layers directly: ``Llama.forward`` checks token ids and positions on the host, which would make
the GPU wait at every step and split the graph. The run is written, with its provenance, to
``data/measurements/decode_gpu_<device>_<date>.json``. On a machine without CUDA it refuses.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from inferlab.analysis import formulas
from inferlab.device import check_dtype
from inferlab.analysis.hardware import detect_device, measure_bandwidth
from inferlab.model.kv_cache import StaticKVCache
from inferlab.measurements import write_record
from inferlab.model.llama import build_model
from inferlab.timing import time_fn


def decode_step(model, token: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
    """Logits (B, V) for one token per sequence (B, 1) at ``positions`` (1,).

    ``Llama.forward`` reads nothing on the host on a GPU or under torch.compile, so the whole
    step compiles into one graph (CUDA graphs with mode="reduce-overhead")."""
    return model(token, positions, cache)[:, -1]


def run(model, prompt_len: int = 16, new_tokens: int = 128, compile: bool = True,
        min_run_time: float = 1.0) -> dict:
    """Time batch-1 decode of ``model``: one steady-state step, and a loop of ``new_tokens``.

    Works on any device (the tests run it on a CPU without compiling); returns seconds and
    the bytes a step reads.
    """
    device = model.device
    total = prompt_len + new_tokens
    cache = StaticKVCache.for_model(model, batch=1, max_len=total)
    cache.checks = False  # no host syncs, in eager mode too: the caller owns the positions
    gen = torch.Generator(device=device).manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), device=device, generator=gen)
    step = decode_step
    if compile:
        torch._dynamo.mark_static_address(cache.k)  # the buffers are mutated in place
        torch._dynamo.mark_static_address(cache.v)
        step = torch.compile(decode_step, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():  # as gpt-fast does; inference_mode tensors and CUDA graphs mix less well
        model(prompt, torch.arange(prompt_len, device=device), cache)  # prefill, eager
        cache.length = prompt_len
        token = torch.zeros(1, 1, dtype=torch.long, device=device)
        position = torch.full((1,), prompt_len, dtype=torch.long, device=device)

        def one_step():  # the same slot every call: a steady state at prompt_len tokens
            return step(model, token, position, cache)

        def loop():  # a real generation: greedy tokens, positions advancing
            tok = token.clone()
            for p in range(prompt_len, total):
                position.fill_(p)
                tok = step(model, tok, position, cache).argmax(-1, keepdim=True)
            return tok

        for _ in range(3):  # compile, record the CUDA graph, warm up
            one_step()
        single = time_fn(one_step, min_run_time=min_run_time)
        whole = time_fn(loop, min_run_time=min_run_time)
    dtype = str(model.dtype).removeprefix("torch.")
    weights = formulas.decode_bytes_per_step(model.config, dtype)
    kv_mid = formulas.kv_bytes(model.config, prompt_len + new_tokens // 2, dtype)
    return {"prompt_len": prompt_len, "new_tokens": new_tokens, "compiled": compile,
            "step_s": single.median_s, "step_iqr_s": single.iqr_s,
            "loop_s_per_token": whole.median_s / new_tokens,
            "tokens_per_s": new_tokens / whole.median_s,
            "weight_bytes_per_step": weights,
            "kv_bytes_per_step": cache.nbytes,  # StaticKVCache reads its whole buffer
            "kv_bytes_needed_mid_loop": kv_mid}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.decode_gpu",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-2-7b", help="a row of data/models.csv")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--no-compile", action="store_true",
                        help="time eager PyTorch only (by default: eager, then compiled)")
    parser.add_argument("--min-run-time", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON file to write (default: data/measurements/decode_gpu_<device>_<date>.json)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_gpu times decode on a CUDA GPU and torch sees none here, so it measures "
              "nothing. On a CPU, try `python -m inferlab.benchmarks.kv_cache`, or Lab 1's "
              "decode cell.")
        return 0
    dtype = check_dtype(args.dtype, "cuda")
    info = detect_device("cuda")
    model = build_model(args.model, seed=0, device="cuda", dtype=dtype)
    bandwidth = measure_bandwidth("cuda")
    print(f"{args.model} ({dtype}) on {info.name}; measured bandwidth "
          f"{bandwidth.value / 1e9:,.0f} GB/s ({bandwidth.what})")
    rows, errors, out = [], {}, None
    for compiled in ([False] if args.no_compile else [False, True]):
        mode = "compiled (CUDA graphs)" if compiled else "eager"
        try:
            result = run(model, args.prompt_len, args.new_tokens, compile=compiled,
                         min_run_time=args.min_run_time)
        except Exception as error:  # a missing compiler toolchain must not lose the eager row
            errors[mode] = f"{type(error).__name__}: {error}"[:500]
            print(f"{mode}: failed ({errors[mode]})")
            continue
        read = result["weight_bytes_per_step"] + result["kv_bytes_needed_mid_loop"]
        per_token = result["loop_s_per_token"]
        row = {"mode": mode, **result, "bytes_per_token": read,
               "utilisation_of_measured_bandwidth":
                   formulas.bandwidth_utilisation(read, per_token, bandwidth.value)}
        if info.spec:
            row["utilisation_of_datasheet_bandwidth"] = \
                formulas.bandwidth_utilisation(read, per_token, info.spec.bandwidth)
        rows.append(row)
        print(f"{mode}: {result['tokens_per_s']:,.1f} tokens/s ({per_token * 1e3:.2f} ms/token; "
              f"one steady step {result['step_s'] * 1e3:.2f} ms); "
              f"{row['utilisation_of_measured_bandwidth']:.0%} of the measured bandwidth"
              + (f", {row['utilisation_of_datasheet_bandwidth']:.0%} of the datasheet's"
                 if info.spec else ""))
        # Recorded after every mode, so a run stopped while compiling keeps the eager row.
        out = write_record(_record(args, argv, dtype, bandwidth, rows, errors), info, args.out)
    if not rows:
        print("no mode ran; nothing recorded")
        return 1
    best = max(rows, key=lambda r: r["tokens_per_s"])
    if info.spec:
        floor = formulas.decode_time_floor(best["bytes_per_token"], info.spec.bandwidth)
        print(f"the floor at the datasheet's {info.spec.bandwidth / 1e9:,.0f} GB/s is "
              f"{1 / floor:,.1f} tokens/s")
    out = write_record(_record(args, argv, dtype, bandwidth, rows, errors), info, args.out)
    print(f"wrote {out}")
    return 0


def _record(args, argv, dtype, bandwidth, rows: list[dict], errors: dict) -> dict:
    best = max(rows, key=lambda r: r["tokens_per_s"])
    return {"benchmark": "decode_gpu",
            "command": "python -m inferlab.benchmarks.decode_gpu " + " ".join(argv or sys.argv[1:]),
            "model": args.model, "dtype": str(dtype).removeprefix("torch."), "batch": 1,
            "measured_bandwidth": bandwidth.value, "bandwidth_probe": bandwidth.what,
            "best_mode": best["mode"], "best_tokens_per_s": best["tokens_per_s"],
            "best_utilisation_of_measured_bandwidth": best["utilisation_of_measured_bandwidth"],
            "best_utilisation_of_datasheet_bandwidth":
                best.get("utilisation_of_datasheet_bandwidth"),
            "errors": errors, "results": rows}

if __name__ == "__main__":
    sys.exit(main())
