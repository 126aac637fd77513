"""Speculative decoding with the course's trained pair at batch 1: acceptance, tokens per
verification against the formula, and the wall-clock speed-up against k.

    python -m inferlab.benchmarks.speculative                 # about two minutes on a 2-core CPU
    python -m inferlab.benchmarks.speculative --quick         # fewer prompts and rounds
    python -m inferlab.benchmarks.speculative --json out.json # also write a record

It measures, on held-out text of the course corpus (``data/corpus/test.jsonl``):

1. the cost of a draft step over a target step, c, and of verifying k + 1 tokens over one target
   step, timed interleaved and the fastest run kept
   (``inferlab.analysis.speculative_timing``; the models are tiny, so a step
   is mostly fixed overhead on a CPU: c is measured, never taken from the parameter counts);
2. the acceptance rate a of the draft (greedy, and sampled at temperature 1), and the emitted
   tokens per verification against (1 - a^(k+1)) / (1 - a) at the measured a;
3. the time to generate the same tokens plainly and speculatively for each k, in rounds
   interleaved, the best round kept; the acceptance that 1.5x would need at the measured costs
   (``inferlab.analysis.speculation.acceptance_needed``);
4. the same with prompt-lookup drafting on long code prompts, which repeat themselves.

Greedy speculative output is asserted equal to the target's greedy output on every run.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch

from inferlab.analysis import speculation
from inferlab.analysis.hardware import detect_device
from inferlab.analysis.speculative_timing import (KS, acceptance, held_out_prompts, load_pair,
    step_costs, wall_clock)
from inferlab.measurements import write_record
from inferlab.model.speculative import ModelDrafter, PromptLookup, SpecStats

BAR_SPEEDUP, BAR_FORMULA = 1.5, 0.10


def _load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def _table(title, stats: dict[int, SpecStats], speed: dict | None, costs: dict | None) -> list[dict]:
    print(title)
    print(f"{'k':>3} {'accept a':>9} {'tok/verif':>10} {'formula':>8} {'error':>7} "
          f"{'speed-up':>9} {'model':>7}")
    rows = []
    for k, s in stats.items():
        a = s.acceptance_rate
        measured = s.tokens_per_verification(k)
        formula = speculation.expected_tokens(a, k) if a == a else float("nan")
        row = {"k": k, "acceptance": a, "tokens_per_verification": measured, "formula": formula,
               "error": measured / formula - 1}
        line = (f"{k:>3} {a:>9.3f} {measured:>10.3f} {formula:>8.3f} {row['error']:>+7.1%}")
        if speed:
            row["speedup"] = speed["speedup"][k]
            line += f" {row['speedup']:>8.2f}x"
        if costs:
            row["predicted_speedup"] = speculation.speedup(a, k, costs["c"], costs["verify_cost"][k])
            line += f" {row['predicted_speedup']:>6.2f}x"
        print(line)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.speculative",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=6, help="held-out files to prompt with")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadiest)")
    parser.add_argument("--quick", action="store_true", help="3 prompts, 2 rounds")
    parser.add_argument("--json", type=Path, help="also write the results here, with provenance")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.rounds = 3, 2
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    info = detect_device("cpu")
    load_start = _load()
    print(f"{info.name}, {args.threads} thread(s), torch {info.torch_version}; {load_start}")
    target, draft, tok = load_pair()
    prompts = held_out_prompts(tok, args.prompts, 32)
    from inferlab.model.generate import generate
    from inferlab.model.quality import agreement
    from inferlab.model.corpus import held_out

    plain = [generate(target, torch.tensor(p), args.new_tokens)[0].tolist() for p in prompts]
    agree = agreement(draft, target, tok, [d.text for d in held_out("test")], limit=4096)
    print(f"teacher-forced agreement of the draft's and the target's greedy choice on held-out "
          f"text: {agree:.3f}")

    costs = step_costs(target, draft)
    print(f"target step {costs['target_s'] * 1e3:.2f} ms, draft step {costs['draft_s'] * 1e3:.2f} "
          f"ms: c = {costs['c']:.2f}; verify k+1 tokens / one step: "
          + ", ".join(f"k={k}: {v:.2f}" for k, v in costs["verify_cost"].items()))

    drafter = lambda: ModelDrafter(draft)  # noqa: E731
    greedy = acceptance(target, drafter, prompts, KS, args.new_tokens, check_against=plain)
    sampled = acceptance(target, drafter, prompts, KS, args.new_tokens, temperature=1.0)
    speed = wall_clock(target, drafter, prompts, KS, args.new_tokens, args.rounds)
    n_tok = len(prompts) * args.new_tokens
    print(f"plain greedy: generate {speed['generate_s'] / n_tok * 1e3:.2f} ms per token, the "
          f"speculative loop with k=0 {speed['loop_k0_s'] / n_tok * 1e3:.2f} ms (the faster is "
          "the baseline; all times are the best of the interleaved runs)")
    rows = _table(f"\ndraft model, greedy, {len(prompts)} held-out prompts x {args.new_tokens} "
                  "tokens (speed-up: measured; model: E / (k c + verify cost))", greedy, speed, costs)
    samp_rows = _table("\ndraft model, sampled at temperature 1 (no timing)", sampled, None, None)
    best = max(rows, key=lambda r: r["speedup"])
    need = {k: speculation.acceptance_needed(BAR_SPEEDUP, k, costs["c"], costs["verify_cost"][k])
            for k in KS}
    k_easy = min(need, key=need.get)
    print(f"best k = {best['k']}: {best['speedup']:.2f}x (bar {BAR_SPEEDUP}x: "
          f"{'met' if best['speedup'] >= BAR_SPEEDUP else 'not met'}). "
          f"{BAR_SPEEDUP}x at these costs needs a >= {need[k_easy]:.3f} (at k={k_easy}); "
          f"measured a = {best['acceptance']:.3f}")
    worst = max(abs(r["error"]) for r in rows + samp_rows)
    print(f"tokens per verification vs formula: worst error {worst:.1%} (bar {BAR_FORMULA:.0%}: "
          f"{'met' if worst <= BAR_FORMULA else 'not met'})")

    code = held_out_prompts(tok, max(2, args.prompts // 2), 384)
    code_plain = [generate(target, torch.tensor(p), args.new_tokens)[0].tolist() for p in code]
    lookup_ks = (2, 4, 8)
    lookup = acceptance(target, PromptLookup, code, lookup_ks, args.new_tokens,
                        check_against=code_plain)
    lookup_speed = wall_clock(target, PromptLookup, code, lookup_ks, args.new_tokens, args.rounds)
    print(f"\nprompt lookup (no draft model), {len(code)} code prompts of 384 tokens:")
    print(f"{'k':>3} {'accept a':>9} {'drafted/verif':>14} {'tok/verif':>10} {'speed-up':>9} "
          f"{'model':>6}  (model: tokens per verification / verify cost, drafting free)")
    lookup_rows = []
    for k, s in lookup.items():
        r = {"k": k, "acceptance": s.acceptance_rate, "drafted": sum(s.drafted) / s.verifications,
             "tokens_per_verification": s.tokens_per_verification(),
             "speedup": lookup_speed["speedup"][k],
             "predicted_speedup": s.tokens_per_verification() / costs["verify_cost"][k]}
        lookup_rows.append(r)
        print(f"{k:>3} {r['acceptance']:>9.3f} {r['drafted']:>14.2f} "
              f"{r['tokens_per_verification']:>10.2f} {r['speedup']:>8.2f}x "
              f"{r['predicted_speedup']:>5.2f}x")
    print(_load())
    if args.json:
        record = {"benchmark": "speculative",
                  "command": " ".join(["python -m inferlab.benchmarks.speculative",
                                       *(argv if argv is not None else sys.argv[1:])]),
                  "threads": args.threads, "load_start": load_start, "load": _load(),
                  "agreement": agree, "costs": costs,
                  "plain_s_per_token": speed["plain_s"] / (len(prompts) * args.new_tokens),
                  "results": rows, "sampled": samp_rows, "prompt_lookup": lookup_rows,
                  "model": "course-target + course-draft",
                  "acceptance_needed": {k: (None if math.isinf(v) else v) for k, v in need.items()}}
        print(f"wrote {write_record(record, info, args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
