"""Shared-prefix attention against per-sequence decode attention, by prefix length.

    python -m inferlab.benchmarks.shared_prefix                 # Llama-3-8B's attention shape
    python -m inferlab.benchmarks.shared_prefix --batch 32 --suffix 64 --threads 1

One layer's decode step for ``--batch`` sequences that share a prefix of P tokens (the same
blocks in every block table, as a prefix cache leaves them) and each hold ``--suffix`` tokens of
their own, in a paged pool with the cache's layout. Two paths over the same pool:

- ``per_sequence``: the engine's decode path today (``paged_decode``: every row reads every
  block of its table where it lies, so the prefix's blocks are read once per row);
- ``shared_prefix``: the prefix's blocks gathered once and attended by all rows' queries
  together, each row's suffix blocks gathered and attended per row, the two merged by their
  log-sum-exp (``inferlab.serving.shared_prefix``).

It prints, per prefix length, the K/V bytes each path reads (``bytes_read``) and the median
time of each, and checks that both give the same output. Times are this machine's; nothing
asserts them.
"""

from __future__ import annotations

import argparse

import torch

from inferlab.serving.paged_cache import blocks_for
from inferlab.serving.paged_attention import (block_gather_index, decode_index, gather_blocks,
                                              paged_decode)
from inferlab.serving.shared_prefix import bytes_read, shared_prefix_decode
from inferlab.timing import time_fn


def pool_with_shared_prefix(batch: int, prefix: int, suffix: int, n_heads: int,
                            n_kv_heads: int, head_dim: int, block_size: int = 16,
                            seed: int = 0) -> dict:
    """A one-layer pool (keys (blocks, K, D, S), values (blocks, K, S, D)) holding a
    ``prefix``-token prefix once (whole blocks) and ``batch`` suffixes of ``suffix`` tokens, the
    block tables that share the prefix, and one query per row."""
    if prefix % block_size:
        raise ValueError(f"the prefix is shared in whole blocks: {prefix} is not a multiple of "
                         f"{block_size}")
    g = torch.Generator().manual_seed(seed)
    p_blocks, s_blocks = prefix // block_size, blocks_for(suffix, block_size)
    num_blocks = p_blocks + batch * s_blocks
    order = torch.randperm(num_blocks, generator=g).tolist()  # scattered, as a running pool is
    prefix_ids = order[:p_blocks]
    suffix_ids = [order[p_blocks + b * s_blocks:p_blocks + (b + 1) * s_blocks]
                  for b in range(batch)]
    K, D, S = n_kv_heads, head_dim, block_size
    k_pool = torch.randn(num_blocks, K, D, S, generator=g)
    v_pool = torch.randn(num_blocks, K, S, D, generator=g)
    tables = torch.tensor([prefix_ids + ids for ids in suffix_ids])
    width = p_blocks + s_blocks
    context = prefix + suffix
    mask = None
    if width * S != context:  # each row's last block is partly filled
        mask = (torch.arange(width * S) < context)[None, None].expand(batch, 1, -1)
    suffix_mask = (torch.arange(s_blocks * S) < suffix)[None].expand(batch, -1)
    return dict(q=torch.randn(batch, n_heads, 1, D, generator=g), k_pool=k_pool, v_pool=v_pool,
                tables=tables, mask=mask, suffix_mask=suffix_mask, prefix_blocks=p_blocks,
                prefix_tiles=block_gather_index(torch.tensor([prefix_ids]), K),
                suffix_tiles=block_gather_index(torch.tensor(suffix_ids), K))


def paths(x: dict) -> dict:
    """The two decode-attention paths over ``x`` (``pool_with_shared_prefix``), as functions of
    no arguments returning (B, H, D)."""
    q, k_pool, v_pool = x["q"], x["k_pool"], x["v_pool"]
    B, H, _, D = q.shape
    K = k_pool.shape[1]
    G = H // K
    key_rows, value_rows = decode_index(x["tables"], K, G, D, k_pool.shape[-1])
    pre_buf, suf_buf = {}, {}

    def per_sequence():
        return paged_decode(q, k_pool, v_pool, key_rows, value_rows, x["mask"])[:, :, 0]

    def shared_prefix():
        kp, vp = gather_blocks(k_pool, v_pool, x["prefix_tiles"], 1, pre_buf)  # (1, K, P, D)
        ks, vs = gather_blocks(k_pool, v_pool, x["suffix_tiles"], B, suf_buf)  # (B, K, L, D)
        return shared_prefix_decode(q[:, :, 0], kp[0], vp[0], ks, vs, x["suffix_mask"])

    return {"per_sequence": per_sequence, "shared_prefix": shared_prefix}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16, help="sequences (default 16)")
    p.add_argument("--suffix", type=int, default=128,
                   help="each sequence's own tokens (default 128)")
    p.add_argument("--prefixes", type=int, nargs="+", default=[256, 1024, 4096],
                   help="shared prefix lengths, multiples of 16 (default 256 1024 4096)")
    p.add_argument("--heads", type=int, default=32, help="query heads (default 32)")
    p.add_argument("--kv-heads", type=int, default=8, help="KV heads (default 8)")
    p.add_argument("--head-dim", type=int, default=128, help="head dimension (default 128)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    kv_bytes = 2 * args.kv_heads * args.head_dim * 4  # K and V, float32, one layer
    print(f"one layer, {args.batch} sequences, {args.suffix} own tokens each, "
          f"{args.heads}/{args.kv_heads} heads of {args.head_dim}, float32, "
          f"{torch.get_num_threads()} threads")
    print(f"{'prefix':>7} {'MB read':>9} {'split':>7} {'saved':>6} "
          f"{'ms each':>8} {'split':>7} {'speed-up':>8}")
    for prefix in args.prefixes:
        x = pool_with_shared_prefix(args.batch, prefix, args.suffix, args.heads, args.kv_heads,
                                    args.head_dim)
        fns = paths(x)
        a, b = fns["per_sequence"](), fns["shared_prefix"]()
        if not torch.allclose(a, b, atol=1e-4, rtol=1e-4):
            raise SystemExit(f"prefix {prefix}: the paths disagree by "
                             f"{(a - b).abs().max().item():.2e}")
        t = {name: time_fn(fn, min_run_time=0.3).median_s for name, fn in fns.items()}
        r = bytes_read(args.batch, prefix, args.suffix, kv_bytes)
        print(f"{prefix:>7,} {r['per_sequence'] / 1e6:>9.1f} {r['shared_prefix'] / 1e6:>7.1f} "
              f"{r['saved'] / r['per_sequence']:>6.0%} {t['per_sequence'] * 1e3:>8.2f} "
              f"{t['shared_prefix'] * 1e3:>7.2f} "
              f"{t['per_sequence'] / t['shared_prefix']:>7.2f}x")


if __name__ == "__main__":
    main()
