"""Prefill and decode side by side with Hugging Face transformers, on the same weights.

    python -m inferlab.benchmarks.prefill                     # the 'small' shape, float32
    python -m inferlab.benchmarks.prefill --threads 1 --prompts 128 1024
    python -m inferlab.benchmarks.prefill --model tiny --dtype bfloat16
    python -m inferlab.benchmarks.prefill --threads 1 --write   # a record in data/measurements

An optional check, not part of the course's requirements: it needs ``pip install transformers``
and says so otherwise. The course's model (``inferlab.model.llama``) and transformers'
``LlamaForCausalLM`` with SDPA attention get the same weights (the parameter names are the same)
and the same thread count. For each prompt length it times prompt processing as generation
runs it (one forward of the prompt that fills a KV cache and returns the last token's logits)
and one batch-1 decode step after it, with ``inferlab.timing.time_fn``, alternating the two
implementations so that a machine whose load changes treats both alike, and checks first that
both give the same logits. A ratio above 1 means the course's model is slower.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import torch

from inferlab.analysis.hardware import detect_device
from inferlab.device import check_dtype
from inferlab.measurements import write_record
from inferlab.model.kv_cache import KVCache
from inferlab.model.llama import build_model
from inferlab.timing import time_fn


def require_transformers():
    """The transformers module, or None after saying that these comparisons need it (it is no
    requirement of the course)."""
    try:
        import transformers
    except ImportError:
        print("this comparison needs Hugging Face transformers (pip install transformers); it is "
              "not one of the course's requirements")
        return None
    return transformers


def hf_twin(model):
    """transformers' ``LlamaForCausalLM`` (SDPA attention) holding ``model``'s weights."""
    import transformers

    hf_config = transformers.LlamaConfig(**{k: v for k, v in model.config.to_hf_config().items()
                                            if k not in ("architectures", "model_type")})
    hf_config._attn_implementation = "sdpa"
    hf = transformers.LlamaForCausalLM(hf_config).to(model.device, model.dtype)
    hf.load_state_dict(model.state_dict())
    return hf.eval()


def steps(model, hf, prompt_len: int, seed: int = 0) -> dict:
    """The four timed calls for one prompt length, as functions of no arguments."""
    c = model.config
    gen = torch.Generator(device=model.device).manual_seed(seed)
    tokens = torch.randint(0, c.vocab_size, (1, prompt_len), device=model.device, generator=gen)
    positions = torch.arange(prompt_len, device=model.device)
    nxt = tokens[:, -1:]
    ours_cache = KVCache.for_model(model, 1, max_len=prompt_len + 1)

    @torch.inference_mode()
    def ours_prefill():
        ours_cache.length = 0
        return model(tokens, positions, ours_cache, last_only=True)[:, -1]

    @torch.inference_mode()
    def ours_decode():
        ours_cache.length = prompt_len  # overwrite the same slot every call: a steady state
        return model(nxt, positions[-1:] + 1, ours_cache)[:, -1]

    @torch.inference_mode()
    def hf_prefill():
        return hf(tokens, use_cache=True, logits_to_keep=1)

    hf_past = {}

    @torch.inference_mode()
    def hf_decode():
        if "cache" not in hf_past:
            hf_past["cache"] = hf_prefill().past_key_values
        cache = hf_past["cache"]
        extra = cache.get_seq_length() - prompt_len
        if extra:
            cache.crop(-extra)  # back to the prompt: a steady state
        with warnings.catch_warnings():  # newer releases rename past_key_values
            warnings.simplefilter("ignore", FutureWarning)
            return hf(nxt, past_key_values=cache, use_cache=True).logits[:, -1]

    return dict(ours_prefill=ours_prefill, hf_prefill=lambda: hf_prefill().logits[:, -1],
                ours_decode=ours_decode, hf_decode=hf_decode)


def compare(model, hf, prompt_lens=(128, 1024), min_run_time: float = 0.5,
            rounds: int = 3) -> list[dict]:
    """Median seconds of each call, best of ``rounds`` alternating rounds, per prompt length."""
    rows = []
    tol = 1e-4 if model.dtype == torch.float32 else 5e-2
    for n in prompt_lens:
        fns = steps(model, hf, n)
        for kind in ("prefill", "decode"):
            torch.testing.assert_close(fns[f"ours_{kind}"]().float(), fns[f"hf_{kind}"]().float(),
                                       atol=tol, rtol=tol)
        best = {name: float("inf") for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                best[name] = min(best[name], time_fn(fn, min_run_time=min_run_time).median_s)
        rows.append({"prompt": n, **{f"{k}_s": v for k, v in best.items()},
                     "prefill_ratio": best["ours_prefill"] / best["hf_prefill"],
                     "decode_ratio": best["ours_decode"] / best["hf_decode"]})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.prefill",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small", help="a row of data/models.csv")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--min-run-time", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true",
                        help="write a record to data/measurements/")
    args = parser.parse_args(argv)
    transformers = require_transformers()
    if transformers is None:
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = check_dtype(args.dtype, args.device)
    model = build_model(args.model, seed=0, device=args.device, dtype=dtype)
    hf = hf_twin(model)
    info = detect_device(args.device)
    print(f"'{args.model}' in {str(dtype).removeprefix('torch.')} on {info.name}, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}, transformers "
          f"{transformers.__version__} (SDPA); best of {args.rounds} alternating rounds")
    rows = compare(model, hf, args.prompts, args.min_run_time, args.rounds)
    for row in rows:
        print(f"  prompt {row['prompt']:5d}: prefill {row['ours_prefill_s'] * 1e3:8.1f} ms vs "
              f"{row['hf_prefill_s'] * 1e3:8.1f} ms ({row['prefill_ratio']:.2f}x) | decode "
              f"{row['ours_decode_s'] * 1e3:6.1f} ms vs {row['hf_decode_s'] * 1e3:6.1f} ms "
              f"({row['decode_ratio']:.2f}x)")
    if args.write:
        command = " ".join(["python -m inferlab.benchmarks.prefill",
                            *(argv if argv is not None else sys.argv[1:])])
        record = {"benchmark": "prefill_vs_transformers", "command": command,
                  "model": args.model, "dtype": str(dtype).removeprefix("torch."),
                  "transformers": transformers.__version__, "rounds": args.rounds,
                  "results": rows}
        print(f"  written to {write_record(record, info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
