"""A fused paged-decode attention kernel in Triton: K/V read straight through the block table.

The portable path (``inferlab.serving.paged_attention``) gathers each sequence's scattered
blocks into a contiguous tensor and then attends: every K/V byte is moved twice (gather, then
attention). This kernel reads each block where it lies, looking its physical id up in the block table, and keeps a
running softmax (the online-softmax recurrence of Milakov & Gimelshein 2018, used by
FlashAttention) so the scores never go to memory: one read of K/V per query head, one write of
the output. It has the structure of the kernel of Kwon et al. 2023, Sec. 5.1 (one program per
(sequence, query head) walking the block table), but not its softmax: vLLM's kernel, adapted
from FasterTransformer, keeps all of a sequence's scores in shared memory and reduces them in
separate passes (its v2 splits long sequences into 512-token partitions and merges them). This
one is the simplest online-softmax version: one block of ``block_size`` tokens per loop step,
no partitions.

Importing this module never fails: Triton is optional. CUDA builds of torch ship it; the
course's pinned CPU environment installs it too, so that the tests run the kernel on the CPU
under Triton's interpreter (``TRITON_INTERPRET=1``, slow but exact). ``available()`` says
whether the kernel can run on a device; ``paged_decode_attention`` raises a clear error where it
cannot. The cache uses it by default only on a GPU. The benchmark
``python -m inferlab.benchmarks.paged`` times it against gather-then-attend and contiguous
attention on a GPU.
"""

from __future__ import annotations

import math
import os

import torch

try:  # CUDA builds of torch ship Triton; the CPU wheel does not depend on it.
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the installation
    triton = tl = None
    HAVE_TRITON = False


def available(device: str | torch.device = "cuda") -> bool:
    """Whether the fused kernel can run on ``device``: Triton installed, and a CUDA GPU for a
    "cuda" device or Triton's interpreter (``TRITON_INTERPRET=1``) for a "cpu" one."""
    device = torch.device(device)
    if not HAVE_TRITON:
        return False
    if device.type == "cuda":
        return torch.cuda.is_available()
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"  # for testing


if HAVE_TRITON:
    @triton.jit
    def _paged_decode_kernel(Q, K_cache, V_cache, Out, Block_table, Context_lens, scale,
                             stride_qb, stride_qh, stride_kb, stride_kh, stride_ks, stride_kd,
                             stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_tb,
                             GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
        b = tl.program_id(0)   # sequence
        h = tl.program_id(1)   # query head
        kv_head = h // GROUP   # grouped-query attention: GROUP query heads share a KV head
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        q = tl.load(Q + b * stride_qb + h * stride_qh + d, mask=d_ok, other=0.0).to(tl.float32)
        context = tl.load(Context_lens + b)
        offs = tl.arange(0, BLOCK_SIZE)
        # Running maximum, running sum of exp, running weighted sum of V (online softmax).
        m_i = tl.max(tl.full([BLOCK_SIZE], float("-inf"), tl.float32), axis=0)
        l_i = tl.sum(tl.zeros([BLOCK_SIZE], tl.float32), axis=0)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for i in range(0, tl.cdiv(context, BLOCK_SIZE)):
            block = tl.load(Block_table + b * stride_tb + i).to(tl.int64)  # physical block id
            tok_ok = i * BLOCK_SIZE + offs < context
            kt = (block * stride_kb + kv_head * stride_kh + offs[:, None] * stride_ks
                  + d[None, :] * stride_kd)
            ok = tok_ok[:, None] & d_ok[None, :]
            k = tl.load(K_cache + kt, mask=ok, other=0.0).to(tl.float32)  # (BLOCK_SIZE, D)
            s = tl.sum(k * q[None, :], axis=1) * scale                      # (BLOCK_SIZE,)
            s = tl.where(tok_ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp(m_i - m_new)  # rescales what was summed under the old maximum
            p = tl.exp(s - m_new)
            vt = block * stride_vb + kv_head * stride_vh + offs[:, None] * stride_vs + d[None, :]
            v = tl.load(V_cache + vt, mask=ok, other=0.0).to(tl.float32)  # (BLOCK_SIZE, D)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m_i = m_new
        out = acc / l_i
        tl.store(Out + b * stride_ob + h * stride_oh + d, out.to(Out.dtype.element_ty), mask=d_ok)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None) -> torch.Tensor:
    """Decode attention of q (B, H, 1, D) over a paged cache, without gathering.

    ``k_cache``: one layer's keys, (num_blocks, K, D, block_size); ``v_cache``: its values,
    (num_blocks, K, block_size, D); both contiguous (the layout of
    ``inferlab.serving.paged_cache``: one block of one KV head is one tile, keys transposed).
    ``block_table``: (B, max_blocks) int32 or int64 physical block ids (padding never read).
    ``context_lens``: (B,) int32 or int64, how many tokens each row attends over.
    Returns (B, H, 1, D), equal to ``scaled_dot_product_attention`` over the gathered K/V.
    """
    if not available(q.device):
        raise RuntimeError("the fused paged-decode kernel needs Triton and a CUDA GPU; use the "
                           "gather path (PagedKVCache(..., use_triton=False)) on this machine")
    B, H, T, D = q.shape
    if T != 1:
        raise ValueError(f"paged_decode_attention handles decode (one query token), got T={T}")
    num_blocks, K, Dk, block_size = k_cache.shape
    if Dk != D or H % K or v_cache.shape != (num_blocks, K, block_size, D):
        raise ValueError(f"q has {H} heads of dim {D}; the cache has {K} KV heads of dim {Dk}")
    if block_size & (block_size - 1):
        raise ValueError(f"the kernel needs a power-of-two block_size, got {block_size}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous (one layer of the pool)")
    q2 = q[:, :, 0]  # (B, H, D)
    if q2.stride(-1) != 1:
        q2 = q2.contiguous()
    out = torch.empty((B, H, D), dtype=q.dtype, device=q.device)
    _paged_decode_kernel[(B, H)](
        q2, k_cache, v_cache, out, block_table, context_lens,
        1.0 / math.sqrt(D) if scale is None else scale,
        q2.stride(0), q2.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(3),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), block_table.stride(0),
        GROUP=H // K, BLOCK_SIZE=block_size, HEAD_DIM=D, BLOCK_D=triton.next_power_of_2(D))
    return out[:, :, None]  # (B, H, 1, D)
