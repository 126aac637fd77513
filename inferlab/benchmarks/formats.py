"""Held-out perplexity of the course's trained model in every weight and KV-cache format.

    python -m inferlab.benchmarks.formats                                   # print the table
    python -m inferlab.benchmarks.formats --out data/measurements/formats_cpu.json

``course-target`` (trained by ``inferlab.model.train``, stored in bfloat16) is scored on the
first ``--docs`` documents of the test split (``inferlab.model.quality.score``) with its linear
weights rounded to each format (weights only; activations stay float32, except the W8A8 row,
which also rounds every linear layer's input to FP8 in DeepSeek-V3's 1 x 128 tiles), and, with
the stored weights, with its K and V kept in a quantized cache (``inferlab.model.quant
.ThroughCache``). Rows:

- 16-bit as stored, int8 per channel, int4 per group of 128 (rows padded) and 32
  (``inferlab.model.quant``);
- FP8 E4M3 per tensor and per channel, E5M2 per channel, E4M3 in 128 x 128 blocks, and the
  same with FP8 activation tiles; MXFP4 and NVFP4 (``inferlab.model.formats``);
- KV cache: int8 per token and head (``Int8KVCache``), FP8 E4M3 with one scale per layer's K
  and V set from the first batch, one per KV head, and all scales 1.0 (``Fp8KVCache``).

Bits per weight count the elements and every scale the format stores. All of it is emulation:
the rounding is exact, the speed is not measured (no CPU kernel computes in these formats).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import torch

from inferlab.analysis.hardware import detect_device
from inferlab.measurements import write_record
from inferlab.model import corpus, formats, quant
from inferlab.model.fp8_kv_cache import Fp8KVCache
from inferlab.model.kv_cache import Int8KVCache
from inferlab.model.quality import score
from inferlab.model.weights import checkpoint_path, load_checkpoint, load_tokenizer


def _int(bits, group, pad=False):
    def make(m):
        n = sum(x.weight.numel() for x in m.modules() if isinstance(x, torch.nn.Linear))
        nbytes = quant.weight_bytes(m, bits, group, pad=pad)
        quant.fake_quantize_(m, bits, group, pad=pad)
        return m, 8 * nbytes / n
    return make


def _fmt(name, activations=False):
    def make(m):
        info = formats.apply_weight_format_(m, name)
        if activations:
            formats.fp8_activations_(m)
        return m, info["bits"] / info["weights"]
    return make


def _kv(cache_cls):
    return lambda m: (quant.ThroughCache(m, cache_cls), 16.0)


ROWS = [
    ("bfloat16 (stored)", "weights", lambda m: (m, 16.0)),
    ("int8 per channel", "weights", _int(8, None)),
    ("int4 group 128 (padded)", "weights", _int(4, 128, pad=True)),
    ("int4 group 32", "weights", _int(4, 32)),
    ("fp8 e4m3 per tensor", "weights", _fmt("fp8 e4m3 per tensor")),
    ("fp8 e4m3 per channel", "weights", _fmt("fp8 e4m3 per channel")),
    ("fp8 e5m2 per channel", "weights", _fmt("fp8 e5m2 per channel")),
    ("fp8 e4m3 block 128x128", "weights", _fmt("fp8 e4m3 block 128x128")),
    ("fp8 W8A8 (128x128 weights, 1x128 activations)", "weights+activations",
     _fmt("fp8 e4m3 block 128x128", activations=True)),
    ("mxfp4 (32, E8M0 scale)", "weights", _fmt("mxfp4")),
    ("nvfp4 (16, E4M3 scale + FP32)", "weights", _fmt("nvfp4")),
    ("int8 KV, scale per token and head", "kv cache", _kv(Int8KVCache)),
    ("fp8 e4m3 KV, scale per tensor (first batch)", "kv cache", _kv(Fp8KVCache.variant("tensor"))),
    ("fp8 e4m3 KV, scale per KV head (first batch)", "kv cache", _kv(Fp8KVCache.variant("head"))),
    ("fp8 e4m3 KV, scales 1.0 (uncalibrated)", "kv cache", _kv(Fp8KVCache.variant("unit"))),
]


def kv_bits_per_element(head_dim: int) -> dict:
    """Bits per stored K or V number of each cache (int8 adds a float32 scale per vector)."""
    return {"kv cache int8": 8 + 32 / head_dim, "kv cache fp8": 8.0, "bfloat16": 16.0}


def measure(docs: int | None) -> list[dict]:
    path = checkpoint_path("course-target")
    base = load_checkpoint(path)
    tokenizer = load_tokenizer(path, model=base)
    texts = corpus.documents(corpus.held_out("test"))[:docs]
    rows = []
    for name, what, make in ROWS:
        t = time.perf_counter()
        model, bits = make(copy.deepcopy(base))
        s = score(model, tokenizer, texts)
        if what == "kv cache":
            bits = 8.0 + (32 / base.config.head_dim if "int8" in name else 0.0)
        rows.append({"format": name, "applies_to": what, "bits_per_number": bits,
                     "perplexity": s.perplexity, "bits_per_byte": s.bits_per_byte,
                     "tokens": s.tokens, "seconds": time.perf_counter() - t})
    ref = rows[0]["perplexity"]
    for r in rows:
        r["rise"] = r["perplexity"] / ref - 1
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.formats",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=10, help="test documents (default 10)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write a record here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    info = detect_device("cpu")
    t0, cpu0 = time.perf_counter(), time.process_time()
    rows = measure(args.docs)
    print(f"course-target on {rows[0]['tokens']:,} held-out test tokens (first {args.docs} "
          f"documents), {info.name}, torch {info.torch_version}")
    print(f"{'format':<48}{'bits':>7}{'perplexity':>12}{'rise':>9}")
    for r in rows:
        print(f"{r['format']:<48}{r['bits_per_number']:>7.3f}{r['perplexity']:>12.4f}"
              f"{r['rise']:>+9.2%}")
    total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(f"{total:.0f} s ({cpu:.0f} CPU s; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores)")
    if args.out:
        record = {"benchmark": "formats", "model": "course-target",
                  "command": " ".join(["python -m inferlab.benchmarks.formats",
                                       *(argv if argv is not None else sys.argv[1:])]),
                  "docs": args.docs, "seconds": total,
                  "cpu_seconds": cpu, "load_average_end": os.getloadavg(), "results": rows}
        print(f"wrote {write_record(record, info, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
