"""Shared-prefix attention: a decode batch reads a prefix its sequences share once, not once each.

A prefix cache (Chapter 3) lets many sequences hold the same blocks, so a system prompt of P
tokens costs memory once. Decode attention still reads it once *per sequence*: each of B rows
streams the same P keys and values from memory, B x P x (bytes per token) in all, which is the
bandwidth term this course is about. FlashInfer's cascade attention and Hydragen (Juravsky et
al. 2024) split the attention of such a batch in two:

- the shared prefix, attended by all B x H queries at once: the prefix's K/V are read once, and
  the B queries of a head become the rows of one matrix product (a GEMM, not B GEMVs);
- each sequence's own suffix, attended per row as before.

Each part is a softmax over part of the keys. Softmax over the union is recovered exactly from
each part's output and its log-sum-exp ``lse = log(sum(exp(scores)))`` (``merge``):

    out = (e^(lse1 - m) out1 + e^(lse2 - m) out2) / (e^(lse1 - m) + e^(lse2 - m)),
    m = max(lse1, lse2),

the same merge FlashAttention uses between tiles and FlashInfer between cascade levels; with m
subtracted, nothing overflows. The output equals per-sequence attention to rounding, which
``tests/test_shared_prefix.py`` checks over random prefixes, suffixes and batches.

Bytes: per layer, per-sequence attention reads B x (P + L) tokens' K/V; the split reads
P + B x L (L the suffix length): a saving of (B - 1) x P tokens' K/V, which grows with both the
batch and the prefix (``bytes_read``). It does not pay when the prefix is short against the
suffixes, or when the batch has one sequence; engines decide per batch.

Letters: B sequences, H query heads, K KV heads (G = H / K per KV head), D head dim, P prefix
tokens, L suffix keys per row (padded; ``suffix_mask`` says which are real).
"""

from __future__ import annotations

import math

import torch


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of q (..., M, D) over k, v (..., N, D), and the log-sum-exp of each
    query's scores (..., M); ``mask`` (broadcast to (..., M, N)) is True where a key counts.
    A query with no key counted gets output 0 and lse -inf (it then adds nothing to a merge)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse.unsqueeze(-1).clamp_min(torch.finfo(scores.dtype).min))
    return torch.nan_to_num(weights) @ v, lse


def merge(out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor,
          lse2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the union of two key sets, from each set's output (..., D) and
    log-sum-exp (...): exact, and safe from overflow."""
    m = torch.maximum(lse1, lse2)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # both parts empty
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    total = w1 + w2
    out = (w1.unsqueeze(-1) * out1 + w2.unsqueeze(-1) * out2) / total.clamp_min(
        torch.finfo(total.dtype).tiny).unsqueeze(-1)
    return out, m + torch.log(total)


def prefix_attention(q: torch.Tensor, k_prefix: torch.Tensor,
                     v_prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's queries q (B, H, D) over one shared prefix k_prefix, v_prefix (K, P, D), read
    once: per KV head, the G x B queries that share it are the rows of one product. Returns the
    output (B, H, D) and each query's log-sum-exp (B, H), to merge with the rest of its keys."""
    B, H, D = q.shape
    K = k_prefix.shape[0]
    G = H // K
    rows = q.reshape(B, K, G, D).permute(1, 2, 0, 3).reshape(K, G * B, D)
    out, lse = attention_with_lse(rows, k_prefix, v_prefix)               # (K, G*B, D), (K, G*B)
    return (out.view(K, G, B, D).permute(2, 0, 1, 3).reshape(B, H, D),
            lse.view(K, G, B).permute(2, 0, 1).reshape(B, H))


def shared_prefix_decode(q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor,
                         k_suffix: torch.Tensor, v_suffix: torch.Tensor,
                         suffix_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention of a batch whose sequences share a prefix: q (B, H, D); the prefix's
    k_prefix, v_prefix (K, P, D), stored once; each row's suffix k_suffix, v_suffix (B, K, L, D)
    with ``suffix_mask`` (B, L) True for its real keys. Returns (B, H, D), equal to attending
    each row over its prefix and suffix together."""
    B, H, D = q.shape
    K = k_prefix.shape[0]
    o_pre, lse_pre = prefix_attention(q, k_prefix, v_prefix)  # the prefix once
    # each row's suffix: its G query heads per KV head over its own keys
    mask = None if suffix_mask is None else suffix_mask[:, None, None, :]  # (B, 1, 1, L)
    o_suf, lse_suf = attention_with_lse(q.view(B, K, H // K, D), k_suffix, v_suffix, mask)
    out, _ = merge(o_pre, lse_pre, o_suf.reshape(B, H, D), lse_suf.reshape(B, H))
    return out


def per_sequence_decode(q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor,
                        k_suffix: torch.Tensor, v_suffix: torch.Tensor,
                        suffix_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: every row reads the prefix as if it were its own (B copies of it), as
    decode attention without the split does. Same arguments and result as
    ``shared_prefix_decode``."""
    B, H, D = q.shape
    K, P, _ = k_prefix.shape
    k = torch.cat([k_prefix.expand(B, K, P, D), k_suffix], dim=2)   # (B, K, P+L, D)
    v = torch.cat([v_prefix.expand(B, K, P, D), v_suffix], dim=2)
    mask = None
    if suffix_mask is not None:
        mask = torch.cat([suffix_mask.new_ones(B, P), suffix_mask], dim=1)[:, None, None, :]
    out, _ = attention_with_lse(q.view(B, K, H // K, 1, D).squeeze(3), k, v, mask)
    return out.reshape(B, H, D)


def bytes_read(batch: int, prefix: int, suffix: int, kv_bytes_per_token: int) -> dict:
    """K/V bytes one layer's decode attention reads: per sequence, and split (shared prefix
    once); ``kv_bytes_per_token``: K and V of one token in one layer, all KV heads."""
    each = batch * (prefix + suffix) * kv_bytes_per_token
    split = (prefix + batch * suffix) * kv_bytes_per_token
    return {"per_sequence": each, "shared_prefix": split, "saved": each - split,
            "ratio": each / split}
