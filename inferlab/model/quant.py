"""Weight quantization: fewer bytes per number, and where the numbers are turned back into floats.

A weight row is cut into groups of ``group_size`` numbers; each group keeps one float scale (and,
asymmetric, one float offset) and its numbers as small integers:

- **symmetric**: q = round(w / s) in [-(2^(b-1) - 1), 2^(b-1) - 1], s = max|w| / (2^(b-1) - 1),
  and w ~ q s. Zero stays exactly zero; one code (-2^(b-1)) goes unused.
- **asymmetric**: q = round((w - m) / s) in [0, 2^b - 1], m = min w, s = (max w - min w) /
  (2^b - 1), and w ~ q s + m. The offset m is kept as a float (many formats store an integer
  "zero point" instead), so a lopsided group uses every code.

Either way each number is off by at most half a step, s / 2: the round-trip error a property test
checks. One group per row is **per-channel** (the scale of LLM.int8's vector-wise quantization,
Dettmers et al. 2022); smaller groups (128, 32) follow a row's local range, at the price of one
more scale per group, as GPTQ (Frantar et al. 2023) and AWQ (Lin et al. 2024) store their int4
weights. Integers are kept one per int8 element here; ``Quantized.nbytes`` counts them packed,
b bits each (two int4 codes per byte), which is what a real kernel reads.

``Int8Linear`` is a weight-only int8 layer that never builds a float copy of its weight. On the
CPU it calls ``torch.ops.aten._weight_int8pack_mm(x, w_int8 (N, K), scales (N,))``: int8 weights
are widened inside the kernel, a tile at a time, and each output column multiplied by its scale.
That kernel is fast with bfloat16 activations (and slow with float32 ones on torch 2.13), so the
layer computes in bfloat16 and hands back its input's dtype. There is no CUDA kernel of that
name; on a GPU the layer writes ``linear(x, w.to(x.dtype)) * scales``, which ``torch.compile``
fuses into one kernel as gpt-fast does (eager mode would materialise the converted weight).

``int8_weight_only(model)`` swaps every ``nn.Linear`` of the course's Llama for an ``Int8Linear``;
``fake_quantize_(model, bits, group_size)`` rounds every linear weight in place to what a
quantized kernel would see, for measuring quality at formats this CPU has no kernel for (int4).
A model is quantized once: a second call is an error, since rounding twice adds error the
report would not show.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

BITS = (4, 8)  # the widths this module supports


@dataclass(frozen=True)
class Quantized:
    """Integer codes (N, K') stored one per int8, scales (N, G), offsets (N, G) or None.

    K' is the row padded to a multiple of ``group_size``; ``columns`` is the real row length.
    """

    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor | None
    bits: int
    group_size: int
    columns: int

    @property
    def symmetric(self) -> bool:
        return self.offset is None

    @property
    def nbytes(self) -> int:
        """Bytes a kernel reads: b-bit codes packed, plus every scale and offset."""
        codes = self.q.shape[0] * self.columns * self.bits // 8
        meta = self.scale.numel() * self.scale.element_size()
        if self.offset is not None:
            meta += self.offset.numel() * self.offset.element_size()
        return codes + meta

    @property
    def bytes_per_weight(self) -> float:
        return self.nbytes / (self.q.shape[0] * self.columns)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight the codes stand for, (N, K) in ``dtype``."""
        return dequantize(self, dtype)


def _check_bits(bits: int) -> None:
    if bits not in BITS:
        raise ValueError(f"bits={bits} is not supported: this module quantizes to "
                         f"{' or '.join(map(str, BITS))} bits")


def quantize(w: torch.Tensor, bits: int = 8, group_size: int | None = None,
             symmetric: bool = True, pad: bool = False) -> Quantized:
    """Quantize a float matrix ``w`` (N, K) per group of ``group_size`` columns (None: per row).

    A group size that does not divide K is an error, unless ``pad``: then each row is padded
    with zeros to a multiple of the group size and its last group holds fewer real numbers.
    """
    _check_bits(bits)
    if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point:
        kind = w.dtype if isinstance(w, torch.Tensor) else type(w).__name__
        raise TypeError(f"quantize takes a floating-point weight, got {kind}; integer codes are "
                        "already quantized (quantizing twice only adds error)")
    if w.dim() != 2:
        raise ValueError(f"quantize takes a (rows, columns) matrix, got shape {tuple(w.shape)}")
    N, K = w.shape
    G = K if group_size is None else int(group_size)
    if G <= 0:
        raise ValueError(f"group_size must be positive, got {group_size}")
    if K % G:
        if not pad:
            divisors = [g for g in (32, 64, 128, 256) if K % g == 0]
            raise ValueError(f"group_size={G} does not divide the row length {K}; choose a "
                             f"divisor (e.g. {divisors or [K]}) or pass pad=True to pad each "
                             "row with zeros")
        w = torch.nn.functional.pad(w, (0, G - K % G))
    groups = w.float().reshape(N, -1, G)  # (N, K'/G, G)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        scale = groups.abs().amax(-1) / qmax  # (N, K'/G)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero group
        q = torch.round(groups / scale[..., None]).clamp(-qmax, qmax)
        offset = None
    else:
        qmax = 2 ** bits - 1
        lo, hi = groups.amin(-1), groups.amax(-1)
        scale = (hi - lo) / qmax
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group
        q = torch.round((groups - lo[..., None]) / scale[..., None]).clamp(0, qmax)
        offset = lo
        q = q - 2 ** (bits - 1)  # codes 0..2^b-1 stored shifted so that they fit an int8
    return Quantized(q.reshape(N, -1).to(torch.int8), scale, offset, bits, G, K)


def dequantize(qt: Quantized, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """w ~ q s (symmetric) or q s + m (asymmetric), (N, K) in ``dtype``."""
    N = qt.q.shape[0]
    q = qt.q.float().reshape(N, -1, qt.group_size)  # (N, groups, G)
    if qt.offset is None:
        w = q * qt.scale[..., None]
    else:
        w = (q + 2 ** (qt.bits - 1)) * qt.scale[..., None] + qt.offset[..., None]
    return w.reshape(N, -1)[:, :qt.columns].to(dtype)


class Int8Linear(nn.Module):
    """``Int8Linear(linear)``: y = x W^T + b with W kept as int8 codes (N, K), one scale per row.

    The codes are ``linear``'s weight quantized per channel, symmetric (``quantize(w, 8)``); the
    float weight is not kept. Scales are stored in the compute dtype: bfloat16 on the CPU, the
    weight's own dtype elsewhere.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"Int8Linear takes an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        qt = quantize(w, bits=8)
        self.out_features, self.in_features = w.shape
        self.compute_dtype = torch.bfloat16 if w.device.type == "cpu" else w.dtype
        self.register_buffer("weight_int8", qt.q.contiguous())  # (N, K)
        self.register_buffer("scales", qt.scale[:, 0].to(self.compute_dtype).contiguous())  # (N,)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)

    @property
    def nbytes(self) -> int:
        """Bytes the layer reads per call: codes, scales and bias."""
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(self.compute_dtype)  # (B*T, K)
        if x2.device.type == "cpu":
            y = torch.ops.aten._weight_int8pack_mm(x2, self.weight_int8, self.scales)  # (B*T, N)
        else:  # fused into one kernel under torch.compile
            y = torch.nn.functional.linear(x2, self.weight_int8.to(x2.dtype)) * self.scales
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel"


_MARK = "_inferlab_quantized"


def _linears(model: nn.Module):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def _mark_once(model: nn.Module, how: str) -> None:
    done = getattr(model, _MARK, None)
    if done is not None or any(isinstance(m, Int8Linear) for m in model.modules()):
        raise ValueError(f"this model is already quantized ({done or 'it holds Int8Linear layers'});"
                         " quantizing again would round already-rounded weights: start from the "
                         "float checkpoint")
    setattr(model, _MARK, how)


@torch.no_grad()
def int8_weight_only(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` by an ``Int8Linear``, in place; returns the model."""
    _mark_once(model, "int8 weight-only")
    for name, linear in _linears(model):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Int8Linear(linear))
    return model


@torch.no_grad()
def fake_quantize_(model: nn.Module, bits: int, group_size: int | None = None,
                   symmetric: bool = True, pad: bool = False) -> nn.Module:
    """Round every linear weight of ``model`` in place to its ``bits``-bit, per-group value.

    The model still computes in floats: its outputs are those of a kernel that reads the codes
    and dequantizes exactly, which is how quality is measured at int4 on a CPU.
    """
    _check_bits(bits)
    how = f"int{bits} group {group_size or 'per channel'}{'' if symmetric else ' asymmetric'}"
    linears = _linears(model)
    for _, linear in linears:  # validate every shape before changing anything
        K = linear.weight.shape[1]
        if group_size is not None and K % group_size and not pad:
            quantize(linear.weight[:1].detach(), bits, group_size, symmetric)  # raises
    _mark_once(model, how)
    for _, linear in linears:
        w = linear.weight
        w.copy_(quantize(w.detach(), bits, group_size, symmetric, pad).dequantize(w.dtype))
    return model


def weight_bytes(model: nn.Module, bits: int | None = None, group_size: int | None = None,
                 symmetric: bool = True, pad: bool = False) -> int:
    """Bytes of every linear weight: as stored now (``bits`` None), or as ``bits``-bit codes per
    group with float32 scales (and offsets). Embeddings and norms are not counted."""
    total = 0
    for _, m in model.named_modules():
        if isinstance(m, Int8Linear):
            total += m.weight_int8.numel() + m.scales.numel() * m.scales.element_size()
        elif isinstance(m, nn.Linear):
            if bits is None:
                total += m.weight.numel() * m.weight.element_size()
            else:
                total += quantize(m.weight.detach(), bits, group_size, symmetric, pad).nbytes
    return total


class ThroughCache(nn.Module):
    """``model`` called through a fresh cache of class ``cache_cls`` on every forward pass.

    ``inferlab.model.quality`` scores a text with plain forward passes; wrapping the model this
    way scores it with every K and V stored in (and read back from) the cache, an
    ``Int8KVCache`` for instance, so the cache's rounding shows in the perplexity.
    """

    def __init__(self, model: nn.Module, cache_cls):
        super().__init__()
        self.inner, self.cache_cls = model, cache_cls
        self.config = model.config

    @property
    def device(self) -> torch.device:
        return self.inner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.dtype

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        c = self.config
        cache = self.cache_cls(c.n_layers, tokens.shape[0], c.n_kv_heads, tokens.shape[1],
                               c.head_dim, self.inner.dtype, self.inner.device)
        return self.inner(tokens, torch.arange(tokens.shape[1], device=tokens.device), cache)
