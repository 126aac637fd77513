"""The EAGLE-style head against the two-layer course-draft: acceptance, cost and speed-up at batch 1.

    python -m inferlab.benchmarks.eagle                                  # a few minutes on a CPU
    python -m inferlab.benchmarks.eagle --out data/measurements/eagle_cpu.json

On held-out prompts of the course corpus (the first 32 tokens of test files), for the head in
``data/models/course-eagle`` (``inferlab.model.train_eagle``) and the two-layer ``course-draft``:

1. the cost of one draft step over one target step, c, at 64 tokens of context, and of a target
   pass over k + 1 tokens (``inferlab.analysis.speculative_timing.step_costs``; the head's step
   is timed the same way, with its one-layer cache);
2. greedy acceptance a and emitted tokens per verification at each k, every output checked
   equal to the target's plain greedy output;
3. acceptance at temperatures 0, 0.5 and 1.0 (rejection sampling; k = 3);
4. the wall-clock time to generate the same tokens plainly and speculatively at each k, timed
   interleaved and the best round kept (``best_of``), and the speed-up over plain decoding.

One thread, so that the numbers are steadier on a shared machine; the load average is recorded.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from inferlab.analysis import speculation
from inferlab.analysis.hardware import detect_device
from inferlab.analysis.speculative_timing import (best_of, held_out_prompts, load_pair, merged,
                                                  step_costs)
from inferlab.measurements import write_record
from inferlab.model.eagle import EagleDrafter, FeatureTarget, load_head
from inferlab.model.generate import generate
from inferlab.model.kv_cache import KVCache
from inferlab.model.speculative import ModelDrafter, rollback, speculative_generate
from inferlab.model.weights import checkpoint_path

KS = (1, 2, 3, 4, 6)
TEMPERATURES = (0.0, 0.5, 1.0)


def runner_for(kind, target, draft, head, prompt_len, new_tokens, k):
    """(drafter, target_cache) for one generation with drafter ``kind``."""
    if kind == "eagle":
        runner = FeatureTarget(target, prompt_len + new_tokens + k)
        return EagleDrafter(head, runner), runner
    return ModelDrafter(draft), None


def run_one(kind, target, draft, head, prompt, new_tokens, k, temperature=0.0, seed=0):
    drafter, runner = runner_for(kind, target, draft, head, len(prompt), new_tokens, k)
    return speculative_generate(target, drafter, prompt, new_tokens, k=k, temperature=temperature,
                                seed=seed, target_cache=runner)


def acceptance(kind, target, draft, head, prompts, ks, new_tokens, temperature=0.0, plain=None):
    out = {}
    for k in ks:
        runs = []
        for i, p in enumerate(prompts):
            tokens, stats = run_one(kind, target, draft, head, p, new_tokens, k, temperature, i)
            if plain is not None and tokens != plain[i]:
                raise AssertionError(f"greedy speculation ({kind}, k={k}) differs from greedy")
            runs.append(stats)
        out[k] = merged(runs)
    return out


def head_step_cost(head, target, context: int = 64, rounds: int = 5) -> float:
    """Seconds of one head draft step after ``context`` cached slots (best of the rounds)."""
    c = head.config
    cache = KVCache(1, 1, c.n_kv_heads, context + 1, c.head_dim)
    with torch.inference_mode():
        head(torch.zeros(1, context, dtype=torch.long), torch.zeros(1, context, c.d_model),
             torch.arange(context), cache)
    x, f, pos = torch.ones(1, 1, dtype=torch.long), torch.zeros(1, 1, c.d_model), \
        torch.tensor([context])

    @torch.inference_mode()
    def step():
        rollback(cache, context)
        return head.logits(head(x, f, pos, cache)).argmax()
    return best_of({"head": step}, rounds, 1.0)["head"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.eagle",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--head", type=Path, default=None, help="default: data/models/course-eagle")
    parser.add_argument("--out", type=Path, default=None, help="also write a record here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    info = detect_device("cpu")
    load_start = os.getloadavg()
    target, draft, tok = load_pair()
    head = load_head(args.head or checkpoint_path("course-target").parent / "course-eagle", target)
    prompts = held_out_prompts(tok, args.prompts, 32)
    n = args.new_tokens
    plain = [generate(target, torch.tensor(p), n)[0].tolist() for p in prompts]

    costs = step_costs(target, draft, ks=KS, rounds=args.rounds)
    costs["head_s"] = head_step_cost(head, target, rounds=args.rounds)
    costs["c_head"] = costs["head_s"] / costs["target_s"]
    print(f"{info.name}, 1 thread, torch {info.torch_version}; target step "
          f"{costs['target_s'] * 1e3:.2f} ms; c: two-layer draft {costs['c']:.2f}, EAGLE head "
          f"{costs['c_head']:.2f}; verify k+1 / one step: "
          + ", ".join(f"k={k} {v:.2f}" for k, v in costs["verify_cost"].items()))

    kinds = ("eagle", "draft")
    greedy = {kd: acceptance(kd, target, draft, head, prompts, KS, n, plain=plain) for kd in kinds}
    temps = {kd: {t: acceptance(kd, target, draft, head, prompts, (3,), n, t)[3].acceptance_rate
                  for t in TEMPERATURES} for kd in kinds}

    def timed(kind, k):
        return lambda: [run_one(kind, target, draft, head, p, n, k) for p in prompts]
    fns = {"plain": lambda: [generate(target, torch.tensor(p), n) for p in prompts]}
    fns.update({f"{kd} k={k}": timed(kd, k) for kd in kinds for k in KS})
    best = best_of(fns, args.rounds, min_run_time=2.0 * args.rounds)

    rows = []
    for kd in kinds:
        c = costs["c_head"] if kd == "eagle" else costs["c"]
        for k in KS:
            s = greedy[kd][k]
            a = s.acceptance_rate
            rows.append({"drafter": kd, "k": k, "acceptance": a,
                         "tokens_per_verification": s.tokens_per_verification(k),
                         "formula": speculation.expected_tokens(a, k),
                         "speedup": best["plain"] / best[f"{kd} k={k}"],
                         "predicted_speedup": speculation.speedup(a, k, c,
                                                                  costs["verify_cost"][k])})
    print(f"\n{len(prompts)} held-out prompts x {n} tokens, greedy (outputs equal plain greedy)")
    print(f"{'drafter':<8}{'k':>3}{'accept':>8}{'tok/verif':>10}{'formula':>8}{'speed-up':>10}"
          f"{'model':>7}")
    for r in rows:
        print(f"{r['drafter']:<8}{r['k']:>3}{r['acceptance']:>8.3f}"
              f"{r['tokens_per_verification']:>10.3f}{r['formula']:>8.3f}{r['speedup']:>9.2f}x"
              f"{r['predicted_speedup']:>6.2f}x")
    print("acceptance against temperature (k = 3): " + "; ".join(
        f"{kd}: " + ", ".join(f"T={t} {a:.3f}" for t, a in temps[kd].items()) for kd in kinds))
    top = {kd: max((r for r in rows if r["drafter"] == kd), key=lambda r: r["speedup"])
           for kd in kinds}
    need = min(speculation.acceptance_needed(1.5, k, costs["c_head"], costs["verify_cost"][k])
               for k in KS)
    print("best speed-up: " + ", ".join(f"{kd} {r['speedup']:.2f}x at k={r['k']}"
                                        for kd, r in top.items())
          + f"; 1.5x with the head at these costs needs a >= {need:.3f}")
    if args.out:
        record = {"benchmark": "eagle", "model": "course-target + course-eagle / course-draft",
                  "command": " ".join(["python -m inferlab.benchmarks.eagle",
                                       *(argv if argv is not None else sys.argv[1:])]),
                  "threads": 1, "load_start": load_start, "load_end": os.getloadavg(),
                  "prompts": len(prompts), "new_tokens": n, "costs": costs,
                  "plain_s_per_token": best["plain"] / (len(prompts) * n),
                  "acceptance_by_temperature": {kd: {str(t): a for t, a in v.items()}
                                                for kd, v in temps.items()},
                  "acceptance_needed_for_1.5x": need, "results": rows}
        print(f"wrote {write_record(record, info, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
