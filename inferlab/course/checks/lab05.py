"""Checks for Lab 5, "Quantization". Oracles: the definition of symmetric per-group quantization
(scales from each group's largest magnitude, a round-trip error of at most half a step),
``inferlab.model.quant`` for codes and dequantized weights, a float ``nn.Linear`` on the
dequantized weight, a dispatch mode that watches every tensor a layer's forward pass creates,
``inferlab.analysis.formulas`` for the bytes a decode step reads, and
``inferlab.model.formats`` (the OCP MX rule: a power-of-two scale per block of 32, elements
rounded to FP4 E2M1) for MXFP4.
"""

from __future__ import annotations

import torch
from torch import nn

from inferlab.analysis import formulas
from inferlab.course.checks import (CheckFailed, expect_close, expect_tensor_close, lends,
                                    run_check)
from inferlab.model import formats, quant
from inferlab.model.config import ModelConfig

# Points per exercise for the grader's score (inferlab.course.grade; an instructor's
# --weights file overrides them): more for the exercises that are more code.
WEIGHTS = {"5.1": 2, "5.2": 1, "5.3": 3, "5.4": 1, "5.5": 2}


def _weights(seed: int, rows: int = 6, cols: int = 128) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * 0.05
    w[:, 5] *= 40  # an outlier input channel, the pattern LLM.int8 found in large models
    w[2] *= 10     # and one row much larger than the others
    return w


def _reference_quantize(w, bits, group_size):
    qt = quant.quantize(w, bits, group_size)
    return qt.q, qt.scale


def _reference_dequantize(codes, scales, group_size):
    N, K = codes.shape
    qt = quant.Quantized(codes, scales, None, 8, group_size, K)
    return quant.dequantize(qt)


def quantize_groups(fn):
    """Exercise 5.1: ``quantize_groups(w, bits, group_size) -> (codes, scales)``: symmetric
    per-group quantization of ``w`` (N, K); codes int8 (N, K), scales (N, K // group_size)."""
    def cases(f):
        for bits, G in ((8, 128), (8, 32), (4, 32), (4, 16)):
            w = _weights(bits * 100 + G)
            N, K = w.shape
            what = f"quantize_groups(w of shape {(N, K)}, bits={bits}, group_size={G})"
            out = f(w.clone(), bits, G)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise CheckFailed(f"{what} returned {type(out).__name__}, expected a tuple "
                                  "(codes, scales).\n  Hint: return codes, scales")
            codes, scales = out
            qmax = 2 ** (bits - 1) - 1
            ref_codes, ref_scales = _reference_quantize(w, bits, G)
            if not isinstance(codes, torch.Tensor) or codes.dtype != torch.int8 \
                    or tuple(codes.shape) != (N, K):
                raise CheckFailed(f"{what} returned codes of "
                                  f"{getattr(codes, 'dtype', type(codes).__name__)} "
                                  f"{tuple(getattr(codes, 'shape', ()))}, expected int8 {(N, K)}."
                                  "\n  Hint: one code per weight, .to(torch.int8) at the end")
            expect_tensor_close(f"{what}: the scales", scales, ref_scales, atol=0, rtol=1e-5,
                                hint=f"one scale per group of {G} consecutive numbers in a row: "
                                     f"max |w| over the group divided by {qmax} "
                                     f"(2^(bits-1) - 1, the largest code), shape (N, K // G)")
            lo, hi = int(codes.min()), int(codes.max())
            if lo < -qmax or hi > qmax:
                raise CheckFailed(f"{what} returned codes from {lo} to {hi}, expected them "
                                  f"within [-{qmax}, {qmax}].\n  Hint: clamp after rounding")
            back = _reference_dequantize(codes, ref_scales, G)
            step = ref_scales.repeat_interleave(G, dim=1)
            err = float(((back - w).abs() / step).max())
            if err > 0.5 + 1e-4:
                raise CheckFailed(f"{what}: dequantizing your codes is off by up to {err:.3f} "
                                  "steps, expected at most 0.5 (half a step).\n  Hint: round to "
                                  "the nearest integer (torch.round), do not truncate")
            differ = float((codes.int() != ref_codes.int()).float().mean())
            if differ > 0.005:
                raise CheckFailed(f"{what} returned codes that differ from the reference's in "
                                  f"{differ:.1%} of places, expected (almost) none.\n  Hint: "
                                  "code = round(w / scale) with the scale of the code's group")
    return run_check("5.1", "quantize_groups", fn, lends(_reference_quantize, quant.quantize),
                     cases, success="codes within range, scales per group, and every weight "
                                    "within half a step after the round trip.")


def dequantize_groups(fn):
    """Exercise 5.2: ``dequantize_groups(codes, scales, group_size) -> w`` (N, K) float32."""
    def cases(f):
        gen = torch.Generator().manual_seed(5)
        for G in (32, 8, 64):
            codes = torch.randint(-127, 128, (5, 64), generator=gen).to(torch.int8)
            scales = torch.rand(5, 64 // G, generator=gen) + 0.1 * torch.arange(64 // G)
            got = f(codes.clone(), scales.clone(), G)
            expect_tensor_close(f"dequantize_groups(codes (5, 64), scales {(5, 64 // G)}, "
                                f"group_size={G})", got, _reference_dequantize(codes, scales, G),
                                atol=1e-6, rtol=1e-6,
                                hint="code (n, k) belongs to group k // group_size of row n: "
                                     "reshape the codes to (N, K // G, G), multiply by "
                                     "scales[..., None], reshape back; return float32")
    return run_check("5.2", "dequantize_groups", fn,
                     lends(_reference_dequantize, quant.dequantize), cases,
                     success="every code times the scale of its own group.")


def _watch(module: nn.Module, x: torch.Tensor, limit: int):
    """Run module(x); return the output and the largest float tensor any operation created."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        largest = (0, "")

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.is_floating_point() \
                        and t.numel() > Watch.largest[0]:
                    Watch.largest = (t.numel(), f"{func} made a {t.dtype} tensor of shape "
                                                f"{tuple(t.shape)}")
            return out

    with torch.no_grad(), Watch():
        y = module(x)
    return y, Watch.largest


def int8_linear(cls):
    """Exercise 5.3: ``cls(linear)``, an nn.Module whose forward computes ``linear`` with its weight
    kept as int8 codes and one scale per output row, never as a float matrix."""
    def cases(c):
        torch.manual_seed(3)
        for bias in (True, False):
            linear = nn.Linear(96, 40, bias=bias)
            with torch.no_grad():  # rows of very different sizes, and an outlier channel
                linear.weight.copy_(_weights(7, 40, 96))
            N, K = linear.weight.shape
            layer = c(linear)
            if not isinstance(layer, nn.Module):
                raise CheckFailed(f"{c.__name__}(linear) made a {type(layer).__name__}, "
                                  "expected an nn.Module.\n  Hint: subclass nn.Module")
            state = list(layer.parameters()) + list(layer.buffers())
            kept = [t for t in state if t.is_floating_point() and t.numel() >= N * K]
            if kept:
                raise CheckFailed(f"{c.__name__}(linear) returned a layer that keeps a float "
                                  f"tensor of shape {tuple(kept[0].shape)}, expected only int8 "
                                  "codes, per-row scales and the bias.\n  Hint: store the "
                                  "codes with register_buffer and do not keep linear.weight")
            x = torch.randn(2, 3, K)
            w = quant.quantize(linear.weight.detach(), 8).dequantize()
            expected = x @ w.T + (linear.bias.detach() if bias else 0)
            got, (size, what) = _watch(layer, x, N * K)
            if size >= N * K:
                raise CheckFailed(f"your layer's forward materialised the weight: {what}, "
                                  f"expected no float tensor as large as the {N}x{K} weight."
                                  "\n  Hint: torch.ops.aten._weight_int8pack_mm(x2d, codes, "
                                  "scales) widens the codes inside the kernel")
            if isinstance(got, torch.Tensor) and got.dtype != x.dtype:
                raise CheckFailed(f"your layer returned {got.dtype} for a {x.dtype} input, "
                                  f"expected {x.dtype}.\n  Hint: cast the result back with "
                                  ".to(x.dtype)")
            expect_tensor_close(f"{c.__name__}(nn.Linear(96, 40, bias={bias}))(x of shape "
                                "(2, 3, 96))", got, expected, atol=1e-2, rtol=1e-2,
                                hint="per output row n: scale_n = max|W[n]| / 127, codes = "
                                     "round(W / scale); the kernel multiplies column n by "
                                     "scales[n]; add the bias; the kernel takes x as (M, K) "
                                     "in bfloat16 and scales in bfloat16")
    return run_check("5.3", "the int8 weight-only linear", cls, quant.Int8Linear, cases,
                     success="it matches the float layer on its dequantized weight, keeps "
                             "only int8 codes, and never builds a float weight.")


def step_bytes(fn):
    """Exercise 5.4: ``step_bytes(config, context, bytes_per_weight, kv_bytes_per_element)``:
    bytes one batch-1 decode step reads, its weights and its KV cache."""
    def cases(f):
        for name in ("small", "llama-2-7b", "mistral-7b"):
            config = ModelConfig.from_name(name)
            for context, bw, kv in ((128, 4, 4), (1024, 1, 2), (8192, 0.5625, 1)):
                expected = formulas.quantized_step_bytes(config, context, bw, kv)
                expect_close(f"step_bytes({name}, {context}, {bw}, {kv})",
                             f(config, context, bw, kv), expected, rel=1e-6,
                             hint="every weight but the input embedding table is read once "
                                  "(formulas.decode_bytes_per_step counts them), each at "
                                  "bytes_per_weight; then 2 (K and V) x layers x KV heads x "
                                  "head_dim numbers per cached token, and a sliding-window "
                                  "model caches at most its window "
                                  "(formulas.kv_tokens_held)")
    return run_check("5.4", "step_bytes", fn, formulas.quantized_step_bytes, cases,
                     success="weights at their new price, plus the K/V the step reads.")


def _reference_mxfp4(w):
    return formats.mxfp4_quantize(w)[0].float()


def mxfp4_round(fn):
    """Exercise 5.5: ``mxfp4_round(w) -> w_hat`` (N, K) float32: ``w`` rounded to MXFP4 along
    each row, blocks of 32 sharing a power-of-two scale, elements on the E2M1 grid."""
    def cases(f):
        for seed, (rows, cols) in enumerate(((4, 64), (6, 128), (3, 96))):
            w = _weights(50 + seed, rows, cols)
            if seed == 0:
                w[1, 32:64] = 0.0  # an all-zero block: its numbers must stay 0
            what = f"mxfp4_round(w of shape {(rows, cols)})"
            got = f(w.clone())
            ref = _reference_mxfp4(w)
            if not isinstance(got, torch.Tensor) or tuple(got.shape) != (rows, cols):
                raise CheckFailed(f"{what} returned {_describe(got)}, expected a float tensor of "
                                  f"shape {(rows, cols)}.\n  Hint: reshape the blocks back to "
                                  "(N, K) at the end")
            if not torch.isfinite(got).all():
                raise CheckFailed(f"{what} returned NaN or infinite numbers, expected finite "
                                  "ones.\n  Hint: a block of zeros has max |w| = 0 and log2(0) "
                                  "= -inf; give such a block any scale (1.0), its codes are 0")
            blocks = w.reshape(rows, cols // 32, 32)
            amax = blocks.abs().amax(-1, keepdim=True)
            scale = torch.exp2(torch.floor(torch.log2(amax.clamp(min=1e-30))) - 2)
            ratio = (got.reshape(rows, cols // 32, 32) / scale).abs()
            grid = torch.tensor(formats.E2M1_VALUES)
            def off(scaled):  # the share of numbers that are not E2M1 values at this scale
                return float(((scaled.abs().unsqueeze(-1) - grid).abs().amin(-1) > 1e-4)
                             .float().mean())
            off_grid = off(ratio)
            real_scale = off((got.reshape(rows, cols // 32, 32) / (amax / 6).clamp(min=1e-30)))
            differ = float(((got.float() - ref).abs() > 1e-6 * ref.abs().amax()).float().mean())
            if differ > 0.005:
                hint = ("the scale is 2 ** (floor(log2(max |w| of the block)) - 2): a power of "
                        "two, not max/6 (E2M1's largest exponent is 2, its largest value 6 = "
                        "1.5 x 2^2); each element w / scale goes to the nearest of "
                        "0, 0.5, 1, 1.5, 2, 3, 4, 6 (clamped at 6), sign kept")
                if off_grid > 0.01 and real_scale < 0.01:
                    hint = ("your numbers are E2M1 values times max |w| / 6, a real-valued "
                            "scale; MX stores the scale as a power of two (E8M0): "
                            "2 ** (floor(log2(max |w|)) - 2)")
                elif off_grid > 0.01:
                    hint = ("dividing your numbers by the block's power-of-two scale does not "
                            "land them on the E2M1 grid 0, 0.5, 1, 1.5, 2, 3, 4, 6: round each "
                            "w / scale to the nearest grid value (not to an integer), with "
                            "blocks of 32 consecutive numbers of a row, and scale = "
                            "2 ** (floor(log2(max |w|)) - 2)")
                raise CheckFailed(f"{what}: {differ:.1%} of your numbers differ from the OCP MX "
                                  "rule's, expected (almost) none.\n  Hint: " + hint)
    return run_check("5.5", "mxfp4_round", fn, lends(_reference_mxfp4, formats.mxfp4_quantize),
                     cases, success="blocks of 32, a power-of-two scale each, every number on "
                                    "the E2M1 grid: the OCP MX rule.")


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"
