"""Int8 weight-only decode against float, and what each weight format costs in perplexity.

    python -m inferlab.benchmarks.quant                    # CPU: the `small` model, 1 and 2 threads
    python -m inferlab.benchmarks.quant --docs 40          # quality on the first 40 test documents
    python -m inferlab.benchmarks.quant --device cuda      # GPU: the 7B-shaped model, bf16 vs int8

**Speed.** Batch-1 decode of the decode-timing model (the profile's ``decode_model``: ``small``
on a CPU, random weights) at float32 (the CPU profile's dtype) and with every linear layer an
``inferlab.model.quant.Int8Linear``; on a CPU also torchao's ``Int8WeightOnlyConfig`` in eager
mode, when torchao is installed. One decode step against a KV cache of ``--context`` tokens,
timed interleaved (``inferlab.timing.compare``) at each thread count, with the machine's load
average printed before and after. The predicted speed-up is the ratio of the bytes a step
reads (``quant.weight_bytes`` plus the embedding row and the cache).

**Quality.** Held-out perplexity and bits per byte of ``course-target`` (the course's trained
model, ``inferlab.model.quality``) as stored (bfloat16 weights), with its linear weights as int8
per channel (the ``Int8Linear`` that is timed), int4 per group of 128 (the model's rows of 192
are padded to 256: their last group holds 64 numbers) and of 32, and with an int8 KV cache.

**Bars (issue 12).** On the CPU, int8 decode at least 1.5x faster than float32 and perplexity
less than 1% above the 16-bit model's. On a GPU (``--device cuda``) the 7B-shaped model is timed
at bfloat16 and int8, each compiled into CUDA graphs (``decode_gpu.run``), and recorded in
``data/measurements/``. Quality needs no GPU and is measured on the CPU either way.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import sys
import warnings
from pathlib import Path

import torch

from inferlab.analysis import formulas
from inferlab.analysis.decode_timing import cached_step
from inferlab.analysis.hardware import detect_device
from inferlab.device import check_dtype, choose_profile
from inferlab.measurements import write_record
from inferlab.model import corpus, quant
from inferlab.model.kv_cache import Int8KVCache
from inferlab.model.llama import build_model
from inferlab.model.quality import score
from inferlab.model.weights import checkpoint_path, load_checkpoint, load_tokenizer
from inferlab.timing import compare

SPEED_BAR, QUALITY_BAR = 1.5, 0.01


def torchao_int8(model):
    """``model`` with torchao's int8 weight-only config applied in place, or None without torchao."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)  # it reports optional CUDA libraries it cannot load
            from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        return None
    finally:
        logging.disable(logging.NOTSET)
    quantize_(model, Int8WeightOnlyConfig())
    return model


def step_bytes(model, context: int) -> int:
    """Bytes one decode step reads: linear weights, one embedding row, norms, the KV cache."""
    c = model.config
    kv = formulas.kv_bytes(c, context, "float32")
    norms = (2 * c.n_layers + 1) * c.d_model * 4
    return quant.weight_bytes(model) + c.d_model * 4 + norms + kv


def speed(model_name: str, context: int, threads: list[int], min_run_time: float,
          with_torchao: bool = True) -> dict:
    """Decode-step medians of float32, Int8Linear (and torchao) at each thread count."""
    base = build_model(model_name, seed=0)
    models = {"float32": base, "int8 (Int8Linear)": quant.int8_weight_only(copy.deepcopy(base))}
    if with_torchao:
        ao = torchao_int8(copy.deepcopy(base))
        if ao is not None:
            models["int8 (torchao, eager)"] = ao
    steps = {name: cached_step(m, context) for name, m in models.items()}
    out = {"model": model_name, "context": context,
           "bytes_per_step": {n: step_bytes(m, context) for n, m in models.items()
                              if "torchao" not in n},
           "load_before": os.getloadavg(), "threads": {}}
    with torch.inference_mode():
        for n in threads:
            torch.set_num_threads(n)
            timings = compare(steps, rounds=3, min_run_time=min_run_time, num_threads=n)
            out["threads"][n] = {name: t.median_s for name, t in timings.items()}
    out["load_after"] = os.getloadavg()
    return out


def quality(docs: int | None) -> list[dict]:
    """Perplexity and bits per byte of course-target at each format, on the test split."""
    path = checkpoint_path("course-target")
    base = load_checkpoint(path)
    tokenizer = load_tokenizer(path, model=base)
    texts = corpus.documents(corpus.held_out("test"))[:docs]
    f32 = quant.weight_bytes(base)
    formats = [
        ("bfloat16 (stored)", lambda m: m, f32 / 2),
        ("int8 per channel", quant.int8_weight_only, None),
        ("int4 group 128 (padded)", lambda m: quant.fake_quantize_(m, 4, 128, pad=True),
         quant.weight_bytes(base, 4, 128, pad=True)),
        ("int4 group 32", lambda m: quant.fake_quantize_(m, 4, 32),
         quant.weight_bytes(base, 4, 32)),
        ("int8 KV cache", lambda m: quant.ThroughCache(m, Int8KVCache), f32 / 2),
    ]
    rows = []
    torch.set_num_threads(1)
    for name, make, nbytes in formats:
        model = make(copy.deepcopy(base))
        s = score(model, tokenizer, texts)
        nbytes = quant.weight_bytes(model) if nbytes is None else nbytes
        rows.append({"format": name, "weight_bytes": int(nbytes), "perplexity": s.perplexity,
                     "bits_per_byte": s.bits_per_byte, "tokens": s.tokens})
    ref = rows[0]["perplexity"]
    for r in rows:
        r["rise"] = r["perplexity"] / ref - 1
    return rows


def gpu_speed(model_name: str, new_tokens: int, min_run_time: float,
              dtype: torch.dtype = torch.bfloat16) -> dict:
    """16-bit and int8 weight-only batch-1 decode on CUDA, each compiled (``decode_gpu.run``)."""
    from inferlab.benchmarks.decode_gpu import run

    model = build_model(model_name, seed=0, device="cuda", dtype=dtype)
    label = str(dtype).removeprefix("torch.")
    rows = {label: run(model, new_tokens=new_tokens, min_run_time=min_run_time)}
    torch._dynamo.reset()
    quant.int8_weight_only(model)  # in place: the 16-bit weights are freed layer by layer
    rows["int8 weight-only"] = run(model, new_tokens=new_tokens, min_run_time=min_run_time)
    return {"model": model_name, "dtype": label, "results": rows,
            "speedup": rows[label]["loop_s_per_token"]
            / rows["int8 weight-only"]["loop_s_per_token"]}


def main(argv=None) -> int:
    profile = choose_profile()
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.quant",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default=None, help="decode model (default: the profile's)")
    parser.add_argument("--dtype", default="bfloat16", help="the 16-bit dtype on a GPU")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--min-run-time", type=float, default=2.0)
    parser.add_argument("--docs", type=int, default=None, help="test documents (default: all)")
    parser.add_argument("--no-quality", action="store_true")
    parser.add_argument("--no-torchao", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="also write a record here "
                        "(on a GPU: default data/measurements/quant_<device>_<date>.json)")
    args = parser.parse_args(argv)
    command = "python -m inferlab.benchmarks.quant " + " ".join(argv or sys.argv[1:])
    record = {"benchmark": "quant", "command": command.strip()}
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("--device cuda needs a CUDA GPU and torch sees none here; run without it "
                  "for the CPU measurement.")
            return 0
        info = detect_device("cuda")
        name = args.model or "llama-2-7b"
        g = gpu_speed(name, 64, min(args.min_run_time, 1.0), check_dtype(args.dtype, "cuda"))
        for mode, r in g["results"].items():
            print(f"{name} {mode}: {r['tokens_per_s']:,.1f} tokens/s")
        print(f"int8 weight-only over {g['dtype']}: {g['speedup']:.2f}x")
        record.update(device="cuda", gpu=g)
    else:
        info = detect_device("cpu")
        name = args.model or profile.decode_model
        s = speed(name, args.context, args.threads, args.min_run_time, not args.no_torchao)
        b = s["bytes_per_step"]
        predicted = b["float32"] / b["int8 (Int8Linear)"]
        print(f"decode of `{name}` (random weights), batch 1, {args.context} tokens of context, "
              f"on {info.name}, torch {info.torch_version}")
        print(f"load average before {s['load_before'][0]:.2f}, after {s['load_after'][0]:.2f} "
              f"({os.cpu_count()} cores)")
        print(f"bytes per step: float32 {b['float32'] / 1e6:.0f} MB, int8 "
              f"{b['int8 (Int8Linear)'] / 1e6:.0f} MB: predicted speed-up {predicted:.2f}x")
        best = 0.0
        for n, t in s["threads"].items():
            f = t["float32"]
            parts = [f"{k} {v * 1e3:.2f} ms ({f / v:.2f}x)" for k, v in t.items()]
            print(f"  {n} thread{'s' if n > 1 else ''}: " + "; ".join(parts))
            best = max(best, f / t["int8 (Int8Linear)"])
        met = min(f["float32"] / f["int8 (Int8Linear)"] for f in s["threads"].values())
        print(f"speed bar (int8 >= {SPEED_BAR}x float32 at every thread count): "
              f"{'met' if met >= SPEED_BAR else 'NOT met'} (worst {met:.2f}x, best {best:.2f}x)")
        record.update(device="cpu", speed=s, predicted_speedup=predicted, worst_speedup=met)
    if not args.no_quality:
        rows = quality(args.docs)
        print(f"\ncourse-target on {rows[0]['tokens']:,} held-out test tokens"
              f"{'' if args.docs is None else f' (first {args.docs} documents)'}:")
        print(f"{'format':<26}{'weight MB':>10}{'perplexity':>12}{'bits/byte':>11}{'rise':>9}")
        for r in rows:
            print(f"{r['format']:<26}{r['weight_bytes'] / 1e6:>10.3f}{r['perplexity']:>12.4f}"
                  f"{r['bits_per_byte']:>11.4f}{r['rise']:>+9.2%}")
        rise = rows[1]["rise"]
        print(f"quality bar (int8 perplexity < {QUALITY_BAR:.0%} above 16-bit): "
              f"{'met' if rise < QUALITY_BAR else 'NOT met'} ({rise:+.3%})")
        record["quality"] = rows
    if args.out or args.device == "cuda":
        print(f"wrote {write_record(record, info, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
