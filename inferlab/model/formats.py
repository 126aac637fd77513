"""Floating-point formats of 8 and 4 bits, emulated on the CPU: FP8, block-wise FP8, MXFP4, NVFP4.

``inferlab.model.quant`` stores integers with a float scale per group. The formats that Hopper
and Blackwell GPUs compute in are small *floats* with scales:

- **FP8** (OCP 8-bit floating point): E4M3 (largest finite 448, no infinity) and E5M2 (largest
  finite 57,344, more range, fewer digits). torch holds both (``torch.float8_e4m3fn``,
  ``torch.float8_e5m2``) and converts to them on the CPU. A float scale maps the tensor into the
  format's range: one per tensor, one per output channel, or, as DeepSeek-V3 trains and serves
  (technical report arXiv:2412.19437, FP8 training; its released ``config.json`` has
  ``quantization_config`` fmt e4m3, ``weight_block_size: [128, 128]``, dynamic activations), one
  per 128 x 128 block of a weight and one per 1 x 128 tile of an activation (each token, each
  128 channels), computed on the fly as amax / 448.
- **MXFP4** (OCP Microscaling Formats v1.0): blocks of 32 FP4 E2M1 elements share one scale that
  is a power of two, stored as an 8-bit exponent (E8M0, bias 127, code 255 = NaN). The spec's
  scale is X = 2^(floor(log2(max |v|)) - emax), emax = 2 for E2M1 (its largest value, 6, is
  1.5 x 2^2); elements v / X are rounded to E2M1, those beyond 6 clamped to 6. A block holding a
  NaN or an infinity gets the NaN scale and decodes as NaN (the spec's rule as torchao's
  ``mx_tensor.py`` implements it, "section 6.3", FLOOR mode). Rounding the exponent down puts
  each block's largest magnitude at [4, 8) times X, so the block always uses at least two thirds
  of the grid, but values in (6, 8) X clip to 6 X. torchao 0.18.0's ``ScaleCalculationMode``
  (``prototype/mx_formats/config.py``) also offers RCEIL, X = 2^ceil(log2(max |v| / 6)) (the
  cuBLAS rule): nothing clips, and the largest magnitude lands in (3, 6] X, as little as half
  the grid. ``mxfp4_quantize(w, scale_mode="rceil")`` computes it; ``mxfp4_clipping`` counts
  what the spec's rule clips.
- **NVFP4** (NVIDIA, Blackwell): blocks of 16 E2M1 elements, each block with an FP8 E4M3 scale,
  and one FP32 scale per tensor that places the block scales in E4M3's range: tensor scale
  amax / (6 x 448), block scale (block amax / 6) / tensor scale rounded to E4M3 (torchao's
  ``nvfp4_tensor.py`` recipe).

E2M1 has 1 sign, 2 exponent and 1 mantissa bit: the magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
Rounding is to the nearest, ties to the value with an even mantissa bit, as IEEE rounding does.
Every quantizer here returns the dequantized float tensor (what a kernel would compute with)
and the storage it stands for, so ``bits_per_weight`` is computed from what is stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes; codes 0..7
E2M1_MAX, E2M1_EMAX = 6.0, 2
E8M0_BIAS, E8M0_NAN = 127, 255


def fp8_max(fmt: str) -> float:
    return float(torch.finfo(FP8[fmt]).max)


def to_fp8(x: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    """Round ``x`` to FP8 (nearest, ties to even), saturating: finite values beyond the largest
    finite FP8 number become that number. NaN stays NaN. Returns the FP8 tensor."""
    m = fp8_max(fmt)
    x = x.float()
    return torch.where(x.isnan(), x, x.clamp(-m, m)).to(FP8[fmt])


# ---- FP8 with float32 scales: per tensor, per channel, per block, per activation tile -------

@dataclass(frozen=True)
class Stored:
    """What a quantized tensor keeps: element bits x count, scale bits x count."""

    elements: int
    element_bits: int
    scales: int
    scale_bits: int
    extra_bits: int = 0  # e.g. NVFP4's one FP32 tensor scale

    @property
    def bits(self) -> int:
        return self.elements * self.element_bits + self.scales * self.scale_bits + self.extra_bits

    @property
    def bits_per_weight(self) -> float:
        return self.bits / self.elements


def _blocks(w: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, tuple]:
    """``w`` (N, K) zero-padded and cut into (N/rows, K/cols, rows, cols) blocks."""
    N, K = w.shape
    pn, pk = -N % rows, -K % cols
    w = torch.nn.functional.pad(w.float(), (0, pk, 0, pn))
    b = w.reshape((N + pn) // rows, rows, (K + pk) // cols, cols).transpose(1, 2)
    return b, (N, K)


def _unblock(b: torch.Tensor, shape: tuple) -> torch.Tensor:
    nb, kb, rows, cols = b.shape
    return b.transpose(1, 2).reshape(nb * rows, kb * cols)[:shape[0], :shape[1]]


def fp8_quantize(w: torch.Tensor, fmt: str = "e4m3", granularity: str = "tensor",
                 block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, Stored]:
    """FP8 codes of ``w`` (N, K) with float32 scales s = amax / max(fmt), dequantized.

    ``granularity``: "tensor" (one scale), "channel" (one per row: an output channel of a
    weight, or a token of an activation), "block" (one per ``block`` rows x columns; (128, 128)
    for DeepSeek-V3's weights, (1, 128) for its activation tiles). Partial blocks at the edges
    keep their own scale.
    """
    if w.dim() != 2:
        raise ValueError(f"fp8_quantize takes a (rows, columns) matrix, got {tuple(w.shape)}")
    rows, cols = {"tensor": w.shape, "channel": (1, w.shape[1]), "block": block}[granularity]
    b, shape = _blocks(w, rows, cols)
    amax = b.abs().amax(dim=(-2, -1), keepdim=True)                   # (nb, kb, 1, 1)
    scale = torch.where(amax > 0, amax / fp8_max(fmt), torch.ones_like(amax))
    deq = to_fp8(b / scale, fmt).float() * scale
    return _unblock(deq, shape).to(w.dtype), Stored(w.numel(), 8, scale.numel(), 32)


def fp8_activation_tiles(x: torch.Tensor, fmt: str = "e4m3", tile: int = 128) -> torch.Tensor:
    """DeepSeek-V3's activation quantization: each token's channels in tiles of ``tile``, one
    scale per tile, rounded to FP8 and back. ``x`` (..., K)."""
    flat = x.reshape(-1, x.shape[-1])
    return fp8_quantize(flat, fmt, "block", (1, tile))[0].reshape(x.shape)


# ---- FP4 E2M1 and the two block formats built on it --------------------------------------

def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """``x`` (already scaled) rounded to the nearest E2M1 value, ties to even, saturating at 6."""
    grid = torch.tensor(E2M1_VALUES)
    mids = (grid[1:] + grid[:-1]) / 2                                  # 0.25, 0.75, ..., 5
    mag = x.abs().float().clamp(max=E2M1_MAX)
    code = torch.bucketize(mag, mids)            # a value on a midpoint gets the lower code
    tie = (code < len(mids)) & (mag == mids[code.clamp(max=len(mids) - 1)])
    # On a tie, prefer the value whose mantissa bit is 0 (codes 0, 2, 4, 6: 0, 1, 2, 4).
    code = torch.where(tie & (code % 2 == 1), code + 1, code)
    out = grid[code] * torch.sign(x.float())
    return torch.where(x.isnan(), x.float(), out)


SCALE_MODES = ("floor", "rceil")


def e8m0_scale(amax: torch.Tensor, scale_mode: str = "floor") -> torch.Tensor:
    """The MX spec's shared-scale code: 127 + floor(log2 amax) - emax(E2M1), clamped to the
    E8M0 range [0, 254]; 255 (NaN) where amax is not finite. An all-zero block gets 0 (2^-127).
    ``scale_mode="rceil"`` rounds the exponent up instead, 127 + ceil(log2(amax / 6)), so that
    no element exceeds 6 after scaling (torchao's RCEIL)."""
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"scale_mode must be one of {SCALE_MODES}, got {scale_mode!r}")
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    if scale_mode == "floor":
        e = torch.floor(torch.log2(safe)) - E2M1_EMAX
    else:
        e = torch.ceil(torch.log2(safe / E2M1_MAX))
    code = torch.where(amax > 0, e + E8M0_BIAS, torch.zeros_like(e)).clamp(0, 254)
    return torch.where(torch.isfinite(amax), code, torch.full_like(code, E8M0_NAN)).to(torch.uint8)


def e8m0_value(code: torch.Tensor) -> torch.Tensor:
    c = code.float()
    return torch.where(code == E8M0_NAN, torch.full_like(c, float("nan")), torch.exp2(c - 127))


def mxfp4_quantize(w: torch.Tensor, block: int = 32,
                   scale_mode: str = "floor") -> tuple[torch.Tensor, torch.Tensor, Stored]:
    """MXFP4 along each row: (dequantized w, scale codes (N, K/block) as uint8, storage).
    ``scale_mode``: "floor" is the OCP spec's rule, "rceil" the one that never clips."""
    b, shape = _blocks(w, 1, block)
    amax = b.abs().amax(dim=-1, keepdim=True)
    amax = torch.where(b.isnan().any(-1, keepdim=True), torch.full_like(amax, float("nan")), amax)
    code = e8m0_scale(amax, scale_mode)                                # (N, K/32, 1, 1)
    X = e8m0_value(code)
    deq = round_e2m1(b / X) * X
    stored = Stored(w.numel(), 4, code.numel(), 8)
    return _unblock(deq, shape).to(w.dtype), code.reshape(code.shape[:2]), stored


@dataclass(frozen=True)
class Clipping:
    """What the spec's MXFP4 scale clips in a matrix: the share of blocks whose largest
    magnitude exceeds 6 X, the share of elements beyond 6 X, and those elements' share of the
    round trip's squared error."""

    blocks: float
    elements: float
    error_share: float


def mxfp4_clipping(w: torch.Tensor, block: int = 32) -> Clipping:
    """Count what ``mxfp4_quantize(w, block)`` (the spec's FLOOR rule) clips to 6 X."""
    deq, code, _ = mxfp4_quantize(w, block)
    b, _ = _blocks(w, 1, block)                                        # (N, K/32, 1, 32)
    X = e8m0_value(code).reshape(*code.shape, 1, 1)
    clipped = (b / X).abs() > E2M1_MAX
    real = _blocks(torch.ones_like(w), 1, block)[0] > 0                # padding is not a weight
    err = (_blocks(deq, 1, block)[0] - b).pow(2)
    total = float(err.sum())
    return Clipping(blocks=float(clipped.any(-1).float().mean()),
                    elements=float(clipped[real].float().mean()),
                    error_share=float(err[clipped].sum()) / total if total > 0 else 0.0)


def nvfp4_quantize(w: torch.Tensor, block: int = 16) -> tuple[torch.Tensor, torch.Tensor, Stored]:
    """NVFP4 along each row: (dequantized w, block scales (N, K/block) in E4M3, storage)."""
    b, shape = _blocks(w, 1, block)
    amax_t = w.float().abs().amax()
    tensor_scale = amax_t / (E2M1_MAX * fp8_max("e4m3")) if amax_t > 0 else torch.tensor(1.0)
    amax = b.abs().amax(dim=-1, keepdim=True)
    block_scale = to_fp8(amax / E2M1_MAX / tensor_scale, "e4m3")     # (N, K/16, 1, 1)
    s = block_scale.float() * tensor_scale
    s = torch.where(s > 0, s, torch.ones_like(s))                      # an all-zero block
    deq = round_e2m1(b / s) * s
    stored = Stored(w.numel(), 4, block_scale.numel(), 8, extra_bits=32)
    return _unblock(deq, shape).to(w.dtype), block_scale.reshape(block_scale.shape[:2]), stored


# ---- applying a format to a model --------------------------------------------------------

def weight_quantizer(name: str):
    """A function w -> (dequantized w, Stored) for a weight format of the benchmark table."""
    table = {
        "fp8 e4m3 per tensor": lambda w: fp8_quantize(w, "e4m3", "tensor"),
        "fp8 e4m3 per channel": lambda w: fp8_quantize(w, "e4m3", "channel"),
        "fp8 e5m2 per channel": lambda w: fp8_quantize(w, "e5m2", "channel"),
        "fp8 e4m3 block 128x128": lambda w: fp8_quantize(w, "e4m3", "block", (128, 128)),
        "mxfp4": lambda w: (lambda r: (r[0], r[2]))(mxfp4_quantize(w)),
        "nvfp4": lambda w: (lambda r: (r[0], r[2]))(nvfp4_quantize(w)),
    }
    if name not in table:
        raise ValueError(f"unknown format {name!r}; known: {', '.join(table)}")
    return table[name]


@torch.no_grad()
def apply_weight_format_(model: torch.nn.Module, name: str) -> dict:
    """Round every linear weight of ``model`` in place to format ``name``; returns the bits
    stored (elements and scales) and the number of weights."""
    q = weight_quantizer(name)
    bits = elements = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            deq, stored = q(m.weight)
            m.weight.copy_(deq)
            bits += stored.bits
            elements += stored.elements
    return {"bits": bits, "weights": elements}


def fp8_activations_(model: torch.nn.Module, fmt: str = "e4m3", tile: int = 128) -> list:
    """Round every linear layer's input to FP8 in 1 x ``tile`` tiles (W8A8 with DeepSeek-V3's
    activation scaling). Returns the hook handles (``handle.remove()`` undoes it)."""
    return [m.register_forward_pre_hook(lambda mod, args: (fp8_activation_tiles(args[0], fmt,
                                                                                tile),))
            for m in model.modules() if isinstance(m, torch.nn.Linear)]
