"""Reload a cached prefix from the second KV tier, or compute it again: measured, by length.

    python -m inferlab.benchmarks.kv_tier                       # the course's model, a file tier
    python -m inferlab.benchmarks.kv_tier --lengths 64 256 448 --threads 1

For each prefix length, with the course's trained model (``course-target``) on this machine's
CPU: the time to copy the prefix's blocks (all layers' K and V) back from the tier into the pool
(``KVTier.load``; a file tier, as the engine uses under a CPU pool), against the time to prefill
the same tokens (one forward pass over them). It prints both, the bytes moved and the tier's
achieved rate. Times are this machine's and nothing asserts them; Chapter 3 compares the same
choice on a GPU over PCIe with the roofline.
"""

from __future__ import annotations

import argparse

import torch

from inferlab.model.weights import checkpoint_path, load_checkpoint
from inferlab.serving.paged_cache import BlockManager, BlockTable, PagedKVCache
from inferlab.serving.kv_tier import FileTier
from inferlab.serving.paged_attention import prepare
from inferlab.timing import time_fn


def measure(model, length: int, block_size: int = 16) -> dict:
    """Seconds to reload ``length`` tokens' blocks from a file tier and to prefill them."""
    c = model.config
    n_blocks = length // block_size
    pool = PagedKVCache(c.n_layers, c.n_kv_heads, c.head_dim,
                        BlockManager(2 * n_blocks + 1, block_size), model.dtype, model.device,
                        use_triton=False, n_heads=c.n_heads)
    table = BlockTable(pool.allocator, block_size)
    table.append(length)
    tokens = torch.randint(3, c.vocab_size, (length,), generator=torch.Generator().manual_seed(0))

    def prefill():
        ids, positions, meta = prepare([table], [tokens.tolist()], [0], pool)
        return model(ids, positions, meta, logits_at=meta.last_index)

    with torch.inference_mode():
        prefill()  # the blocks now hold this prefix's K/V
        tier = FileTier(n_blocks, pool)
        for i, block in enumerate(table.blocks[:n_blocks]):
            tier.store(i, pool, block)

        def reload():
            for i, block in enumerate(table.blocks[:n_blocks]):
                tier.load(i, pool, block)

        t_reload = time_fn(reload, min_run_time=0.2).median_s
        t_prefill = time_fn(prefill, min_run_time=0.2).median_s
    moved = n_blocks * tier.slot_bytes
    tier.close()
    return {"tokens": n_blocks * block_size, "bytes": moved, "reload_s": t_reload,
            "prefill_s": t_prefill}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="course-target", help="checkpoint (default course-target)")
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 448],
                   help="prefix lengths in tokens, whole blocks of 16 (default 64 128 256 448)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_checkpoint(checkpoint_path(args.model))
    print(f"{args.model}, {torch.get_num_threads()} threads: reload from a file tier or "
          "prefill again")
    print(f"{'tokens':>7} {'KB':>8} {'reload ms':>10} {'prefill ms':>11} {'GB/s':>6} "
          f"{'prefill/reload':>14}")
    for n in args.lengths:
        r = measure(model, n)
        print(f"{r['tokens']:>7,} {r['bytes'] / 1e3:>8,.0f} {r['reload_s'] * 1e3:>10.2f} "
              f"{r['prefill_s'] * 1e3:>11.2f} {r['bytes'] / r['reload_s'] / 1e9:>6.2f} "
              f"{r['prefill_s'] / r['reload_s']:>13.1f}x")


if __name__ == "__main__":
    main()
