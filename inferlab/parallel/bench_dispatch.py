"""Expert parallelism's dispatch traffic, counted on 2 gloo ranks against the uniform prediction.

    python -m inferlab.parallel.bench_dispatch --out data/measurements/ep_dispatch_cpu.json

Builds a Mixtral-style MoE (``inferlab.model.moe``; random weights from a seed, or a checkpoint
with ``--checkpoint``), splits its experts over the ranks (``inferlab.parallel.expert``), runs
one forward of ``--tokens`` random tokens per rank, and reports the activation bytes each rank
sent to the other per token and layer, beside ``expected_dispatch_bytes_per_token``
(k (N - 1) / N x d x bytes per element, which assumes each expert is picked evenly). The router's
load per expert and imbalance over the same tokens come from ``inferlab.model.routing``.
Counts, not times: the traffic depends only on the routing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from inferlab.model.moe import MoEModelConfig, build_moe_model
from inferlab.model.weights import load_moe_checkpoint
from inferlab.model.routing import expert_load, imbalance, record_routing
from inferlab.parallel.expert import expected_dispatch_bytes_per_token
from inferlab.parallel.launch import run_ranks
from inferlab.parallel.runs import expert_parallel_run

# A small random MoE with 8 experts, top-2 (Mixtral's counts), at the course target's width.
DEFAULT_SHAPE = MoEModelConfig(n_layers=2, d_model=192, n_heads=6, n_kv_heads=2, ffn_dim=256,
                               vocab_size=1024, max_seq_len=512, n_experts=8,
                               experts_per_token=2, name="random-moe-8x2")


def measure(source, tokens: int, world_size: int = 2, seed: int = 0) -> dict:
    """Measured and predicted dispatch bytes per token and layer, and the router's imbalance."""
    model = build_moe_model(*source) if isinstance(source, tuple) else \
        load_moe_checkpoint(source, dtype=torch.float32)
    c = model.config
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, c.vocab_size, (1, tokens), generator=gen)
               for _ in range(world_size)]
    ranks = [r[0] for r in run_ranks(expert_parallel_run, world_size, [(source, prompts, 1)],
                                          timeout=120)]
    routed = sum(r["routed_tokens"] for r in ranks)  # token-layers over all ranks
    sent = sum(r["dispatch_bytes"] for r in ranks)
    load = expert_load(record_routing(model, torch.cat(prompts, dim=1)), c.n_experts)  # (L, E)
    return {"model": c.name, "d_model": c.d_model, "n_layers": c.n_layers,
            "n_experts": c.n_experts, "experts_per_token": c.experts_per_token,
            "ranks": world_size, "tokens_per_rank": tokens,
            "dispatch_bytes_per_token_layer": sent / routed,
            "predicted_bytes_per_token_layer": expected_dispatch_bytes_per_token(
                c.d_model, c.experts_per_token, world_size, 4),
            "load_per_expert": load.tolist(), "imbalance": imbalance(load).tolist()}


def main(argv=None) -> int:
    from inferlab.analysis.hardware import detect_device
    from inferlab.measurements import write_record

    parser = argparse.ArgumentParser(prog="python -m inferlab.parallel.bench_dispatch",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="a Mixtral-layout checkpoint directory")
    parser.add_argument("--seed", type=int, default=0, help="weights of the random model")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank")
    parser.add_argument("--out", type=Path, help="write the results here, with provenance")
    args = parser.parse_args(argv)
    source = args.checkpoint or (DEFAULT_SHAPE, args.seed)
    result = measure(source, args.tokens, seed=args.seed)
    print(f"{result['model']}: {result['n_experts']} experts, top-{result['experts_per_token']}, "
          f"d={result['d_model']}, {result['ranks']} ranks, {args.tokens} tokens per rank")
    print(f"dispatch bytes per token and layer: measured "
          f"{result['dispatch_bytes_per_token_layer']:.1f}, uniform-routing prediction "
          f"{result['predicted_bytes_per_token_layer']:.1f}")
    print("imbalance (busiest expert / mean) per layer: "
          + ", ".join(f"{x:.2f}" for x in result["imbalance"]))
    if args.out:
        record = {"benchmark": "ep_dispatch", "backend": "gloo", "dtype": "float32",
                  "command": " ".join(["python -m inferlab.parallel.bench_dispatch",
                                       *(argv or sys.argv[1:])]), **result}
        print(f"wrote {write_record(record, detect_device('cpu'), args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
