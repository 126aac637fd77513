"""Prefill attention's memory traffic, with the score matrix in HBM and with IO-aware tiling.

Causal attention over a prompt of T tokens does 2 D FLOPs per (query, key) pair and head for
Q K^T and 2 D for P V: 4 H D T (T + 1) / 2 FLOPs per layer (H query heads of dimension D).
What it moves depends on the kernel (Dao et al. 2022, Sec. 2-3; Theorem 2):

- **Standard** attention writes the T x T scores S = Q K^T of every head to HBM, reads them back
  for the softmax, writes the probabilities P, and reads them again for P V: 4 H T^2 numbers on
  top of reading Q, K, V and writing O once. Its intensity is about D / (2b) FLOP per byte
  (causal), whatever T: memory-bound on every GPU in ``data/hardware.csv``.
- **Tiled** (FlashAttention) attention keeps a tile of ``query_tile`` query rows on chip, streams
  K and V past it in tiles, and folds each tile of scores into a running (online) softmax, so S
  and P never reach HBM. HBM then sees Q read and O written once, and K and V read once per
  query tile that needs them: O(T^2 D^2 / M) accesses for an on-chip memory of M, Theorem 2's
  bound. If those re-reads come from HBM the intensity is about 2 x ``query_tile`` / b; if
  the L2 cache serves them (``kv_reuse=True``), K and V are read from HBM once and the intensity
  grows with T.
"""

from __future__ import annotations

from inferlab.analysis.formulas import causal_pairs
from inferlab.validation import positive, positive_ints


def prefill_attention_flops(tokens: int, n_heads: int, head_dim: int) -> int:
    """FLOPs of causal attention over ``tokens`` tokens in one layer: 4 H D T (T + 1) / 2."""
    positive_ints(tokens=tokens, n_heads=n_heads, head_dim=head_dim)
    return 4 * n_heads * head_dim * causal_pairs(tokens)


def standard_attention_bytes(tokens: int, n_heads: int, n_kv_heads: int, head_dim: int,
                             bytes_per_element: float = 2.0) -> float:
    """HBM bytes of one layer's prefill attention when S and P are materialised.

    Q and O: H T D numbers each; K and V: K T D each; S written and read, P written and read:
    4 H T^2 numbers (a masked kernel stores the full square, not only its causal half).
    """
    positive_ints(tokens=tokens, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
    positive(bytes_per_element=bytes_per_element)
    qkvo = (2 * n_heads + 2 * n_kv_heads) * tokens * head_dim
    scores = 4 * n_heads * tokens * tokens
    return (qkvo + scores) * bytes_per_element


def tiled_attention_bytes(tokens: int, n_heads: int, n_kv_heads: int, head_dim: int,
                          bytes_per_element: float = 2.0, query_tile: int = 128,
                          kv_reuse: bool = False) -> float:
    """HBM bytes of one layer's prefill attention with IO-aware tiling (FlashAttention).

    Q is read and O written once. Without ``kv_reuse`` every (query head, query tile) streams
    the keys and values its causal rows need from HBM: tile i needs min((i + 1) x tile, T) of
    them. With ``kv_reuse`` the re-reads hit on-chip memory and K, V come from HBM once.
    """
    positive_ints(tokens=tokens, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                  query_tile=query_tile)
    positive(bytes_per_element=bytes_per_element)
    qo = 2 * n_heads * tokens * head_dim
    if kv_reuse:
        kv = 2 * n_kv_heads * tokens * head_dim
    else:
        tiles = -(-tokens // query_tile)
        keys_read = sum(min((i + 1) * query_tile, tokens) for i in range(tiles))
        kv = 2 * n_heads * keys_read * head_dim
    return (qo + kv) * bytes_per_element


def prefill_attention_intensity(tokens: int, n_heads: int, n_kv_heads: int, head_dim: int,
                                bytes_per_element: float = 2.0, kernel: str = "standard",
                                query_tile: int = 128) -> float:
    """FLOP per HBM byte of prefill attention: ``kernel`` is "standard", "tiled" (K/V re-read
    from HBM for every query tile) or "tiled, K/V on chip"."""
    flops = prefill_attention_flops(tokens, n_heads, head_dim)
    if kernel == "standard":
        nbytes = standard_attention_bytes(tokens, n_heads, n_kv_heads, head_dim, bytes_per_element)
    elif kernel in ("tiled", "tiled, K/V on chip"):
        nbytes = tiled_attention_bytes(tokens, n_heads, n_kv_heads, head_dim, bytes_per_element,
                                       query_tile, kv_reuse=kernel != "tiled")
    else:
        raise ValueError(f"kernel must be 'standard', 'tiled' or 'tiled, K/V on chip', "
                         f"got {kernel!r}")
    return flops / nbytes
