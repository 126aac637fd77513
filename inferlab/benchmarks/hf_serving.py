"""The course's engine against Hugging Face transformers' continuous batching, on the same weights.

    python -m inferlab.benchmarks.hf_serving                       # 'small', float32, 1 thread
    python -m inferlab.benchmarks.hf_serving --model data/models/course-target --requests 64
    python -m inferlab.benchmarks.hf_serving --write               # a record in data/measurements

An optional check, not part of the course's requirements: it needs ``pip install transformers``
and says so otherwise. transformers ships its own continuous-batching engine
(``model.generate_batch``: a paged cache, a FIFO scheduler and a token budget per step). Both
engines get the same model (transformers' ``LlamaForCausalLM`` holding the course model's
weights, ``inferlab.benchmarks.prefill.hf_twin``), the same prompts, the same output length
(no end-of-sequence token, so every request produces exactly ``--output`` tokens), greedy
decoding, the same block size, number of blocks, batch cap and token budget per step
(transformers' ``max_batch_tokens``; the course's ``token_budget``, which selects chunked
prefill), and the same thread count. Every request is there from the start: this measures
offline throughput, the number ``generate_batch`` is for.

The outputs are compared token by token first (greedy decoding of the same weights should
agree; a reduction order that differs can flip a near tie, and the count says how often). Then
each engine serves the whole set ``--rounds`` times, alternating, after one untimed warm-up
each, and the best wall time of each is kept: a machine whose load changes treats both alike.
Throughput is output tokens over wall seconds; a ratio above 1 means the course's engine is
faster.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from inferlab.analysis.hardware import detect_device
from inferlab.device import check_dtype
from inferlab.measurements import default_path, write_record
from inferlab.model.llama import build_model
from inferlab.model.weights import load_checkpoint
from inferlab.benchmarks.prefill import hf_twin, require_transformers
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine, pool_blocks
from inferlab.serving.request import Request

COMMAND = "python -m inferlab.benchmarks.hf_serving"


def workload(vocab_size: int, n: int, shortest: int, longest: int, output: int,
             seed: int = 0) -> list[Request]:
    """``n`` prompts of lengths drawn uniformly from [shortest, longest] (token ids from 1 up,
    seeded), each asking for exactly ``output`` tokens (no end-of-sequence token)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (n,), generator=gen).tolist()
    return [Request(tuple(torch.randint(1, vocab_size, (length,), generator=gen).tolist()),
                    output) for length in lengths]


def load(name: str, dtype: torch.dtype):
    """A preset of data/models.csv with seeded weights, or a checkpoint folder."""
    if Path(name).is_dir():
        return load_checkpoint(name, dtype=dtype)
    return build_model(name, seed=0, dtype=dtype)


class Pair:
    """The two engines over one model, sized alike; ``run_ours()`` and ``run_hf()`` serve the
    whole workload once and return each request's tokens."""

    def __init__(self, model, requests: list[Request], max_batch: int, token_budget: int,
                 block_size: int = 16):
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        self.requests = requests
        config = ServingConfig(block_size=block_size, max_batch=max_batch,
                               token_budget=token_budget)
        num_blocks = pool_blocks(model, requests, config)  # the engine's one sizing rule
        self.config = config.replace(num_blocks=num_blocks)
        self.engine = Engine(model, self.config)
        self.hf = hf_twin(model)
        output = requests[0].max_new_tokens
        self.generation = GenerationConfig(max_new_tokens=output, do_sample=False,
                                           eos_token_id=-1, pad_token_id=0)
        self.batching = ContinuousBatchingConfig(page_size=block_size, num_blocks=num_blocks,
                                                 max_batch_tokens=token_budget,
                                                 max_requests_per_batch=max_batch)
        self.prompts = [list(r.prompt) for r in requests]

    def run_ours(self) -> list[list[int]]:
        run = self.engine.run(self.requests)
        return [list(r.tokens) for r in run.results]

    def run_hf(self) -> list[list[int]]:
        out = self.hf.generate_batch(self.prompts, generation_config=self.generation,
                                     continuous_batching_config=self.batching)
        return [list(o.generated_tokens) for o in out.values()]


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict:
    """How many requests got the same tokens, and the first request and position that differ."""
    same = sum(a == b for a, b in zip(ours, theirs))
    first = next(((i, next((j for j, (x, y) in enumerate(zip(a, b)) if x != y),
                           min(len(a), len(b))))
                  for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    return {"identical": same, "requests": len(ours), "first_difference": first}


def compare(pair: Pair, rounds: int = 3) -> dict:
    """Outputs compared, then the best of ``rounds`` alternating timed runs of each engine."""
    check = agreement(pair.run_ours(), pair.run_hf())  # doubles as each engine's warm-up
    best = {"ours": float("inf"), "transformers": float("inf")}
    for _ in range(rounds):
        for name, fn in (("transformers", pair.run_hf), ("ours", pair.run_ours)):
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    tokens = sum(r.max_new_tokens for r in pair.requests)
    return {**check, "output_tokens": tokens,
            "ours_s": best["ours"], "transformers_s": best["transformers"],
            "ours_tok_s": tokens / best["ours"],
            "transformers_tok_s": tokens / best["transformers"],
            "throughput_ratio": best["transformers"] / best["ours"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small",
                        help="a row of data/models.csv, or a checkpoint folder")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt", type=int, nargs=2, default=[32, 256],
                        metavar=("SHORTEST", "LONGEST"))
    parser.add_argument("--output", type=int, default=64, help="tokens each request produces")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--token-budget", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true",
                        help="write a record to data/measurements/")
    args = parser.parse_args(argv)
    transformers = require_transformers()
    if transformers is None:
        return 0
    transformers.logging.set_verbosity_error()
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
    torch.set_num_threads(args.threads)
    dtype = check_dtype(args.dtype, "cpu")
    model = load(args.model, dtype)
    requests = workload(model.config.vocab_size, args.requests, *args.prompt, args.output)
    pair = Pair(model, requests, args.max_batch, args.token_budget)
    info = detect_device("cpu")
    print(f"'{model.config.name}' in {str(dtype).removeprefix('torch.')} on {info.name}, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}, transformers "
          f"{transformers.__version__}: {args.requests} requests, prompts "
          f"{args.prompt[0]}-{args.prompt[1]} tokens, {args.output} tokens each, max batch "
          f"{args.max_batch}, {args.token_budget} tokens a step, {pair.config.num_blocks} blocks "
          f"of {pair.config.block_size}")
    result = compare(pair, args.rounds)
    print(f"  identical outputs: {result['identical']} of {result['requests']}"
          + (f" (first difference: request {result['first_difference'][0]}, token "
             f"{result['first_difference'][1]})" if result["first_difference"] else ""))
    print(f"  course engine {result['ours_tok_s']:8.1f} tok/s ({result['ours_s']:.2f} s) | "
          f"transformers {result['transformers_tok_s']:8.1f} tok/s "
          f"({result['transformers_s']:.2f} s) | {result['throughput_ratio']:.2f}x")
    if args.write:
        record = {"benchmark": "hf_serving", "command": " ".join([COMMAND, *(argv or sys.argv[1:])]),
                  "model": model.config.name, "dtype": str(dtype).removeprefix("torch."),
                  "transformers": transformers.__version__, "requests": args.requests,
                  "prompt_tokens": args.prompt, "output_tokens_each": args.output,
                  "max_batch": args.max_batch, "token_budget": args.token_budget,
                  "rounds": args.rounds, **result}
        path = default_path(f"hf_serving_{model.config.name}", info)  # one file per model
        print(f"  written to {write_record(record, info, path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
