"""Every Lab 5 check passes a correct answer, lends the reference to an unattempted one, and
fails a planted bug with a message that names the call, what came back and a hint."""

import pytest
import torch
from torch import nn

from check_contract import contract, stub
from inferlab.analysis import formulas
from inferlab.course.checks import CheckFailed, lab05
from inferlab.model import quant


def quantize(w, bits, G, qmax=None, rounding=torch.round, per_row=False):
    N, K = w.shape
    qmax = 2 ** (bits - 1) - 1 if qmax is None else qmax
    g = w.reshape(N, 1 if per_row else K // G, -1)
    scales = g.abs().amax(-1) / qmax
    codes = rounding(g / scales[..., None]).clamp(-qmax, qmax).to(torch.int8)
    if per_row:
        scales = scales.repeat_interleave(K // G, dim=1)
    return codes.reshape(N, K), scales


def dequantize(codes, scales, G, interleaved=False):
    N, K = codes.shape
    if interleaved:  # groups taken as every (K // G)-th column instead of consecutive ones
        return (codes.float().reshape(N, G, K // G) * scales[:, None, :]).reshape(N, K)
    return (codes.float().reshape(N, K // G, G) * scales[..., None]).reshape(N, K)


class Int8Layer(nn.Module):
    def __init__(self, linear, materialise=False, per_tensor=False, no_scale=False):
        super().__init__()
        w = linear.weight.detach()
        s = w.abs().amax() / 127 * torch.ones(w.shape[0]) if per_tensor else \
            w.abs().amax(1) / 127
        self.register_buffer("codes", torch.round(w / s[:, None]).clamp(-127, 127)
                             .to(torch.int8))
        self.register_buffer("scales", s.to(torch.bfloat16) if not no_scale
                             else torch.ones_like(s, dtype=torch.bfloat16))
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.materialise = materialise

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        if self.materialise:
            y = x2 @ (self.codes.float() * self.scales.float()[:, None]).T
        else:
            y = torch.ops.aten._weight_int8pack_mm(x2.bfloat16(), self.codes, self.scales).float()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], -1)


class KeepsFloat(Int8Layer):
    def __init__(self, linear):
        super().__init__(linear)
        self.weight = nn.Parameter(linear.weight.detach().clone())


def step(config, context, bw, kv, embeddings=False, with_kv=True, window=True):
    n = formulas.decode_bytes_per_step(config, "float32") // 4
    if embeddings:
        n += config.vocab_size * config.d_model
    held = formulas.kv_tokens_held(config, context) if window else context
    kvb = 2 * config.n_layers * config.n_kv_heads * config.head_dim * held * kv
    return n * bw + (kvb if with_kv else 0)


GRID = torch.tensor((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0))  # E2M1 magnitudes


def mxfp4(w, block=32, pow2=True, integer_grid=False, zero_guard=True, emax=2):
    N, K = w.shape
    b = w.float().reshape(N, K // block, block)
    amax = b.abs().amax(-1, keepdim=True)
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(amax)) - emax)
    else:
        scale = amax / 6
    if zero_guard:
        scale = torch.where(amax > 0, scale, torch.ones_like(scale))
    x = b / scale
    if integer_grid:
        q = x.round().clamp(-6, 6)
    else:
        q = GRID[(x.abs().clamp(max=6).unsqueeze(-1) - GRID).abs().argmin(-1)] * x.sign()
    return (q * scale).reshape(N, K)


CASES = {
    "mxfp4_round": (mxfp4, [
        lambda w: mxfp4(w, pow2=False),          # a real-valued scale max / 6, not a power of 2
        lambda w: mxfp4(w, integer_grid=True),   # rounded to integers, not to the E2M1 grid
        lambda w: mxfp4(w, block=16),            # NVFP4's block size
        lambda w: mxfp4(w, zero_guard=False, integer_grid=True),  # 0/0 in a zero block: NaN
        lambda w: mxfp4(w, emax=3),              # the scale one power of two too large
    ]),
    "quantize_groups": (quantize, [
        lambda w, b, G: quantize(w, b, G, qmax=2 ** b - 1),            # the unsigned range
        lambda w, b, G: quantize(w, b, G, rounding=torch.trunc),       # truncated
        lambda w, b, G: quantize(w, b, G, per_row=True),               # one scale per row
        lambda w, b, G: quantize(w, b, G)[0].float(),                  # codes only, not int8
    ]),
    "dequantize_groups": (dequantize, [
        lambda c, s, G: dequantize(c, s, G, interleaved=True),
        lambda c, s, G: c.float() * s[:, :1],                          # the first scale only
        lambda c, s, G: c.float(),
    ]),
    "int8_linear": (Int8Layer, [
        lambda lin: Int8Layer(lin, materialise=True),
        lambda lin: Int8Layer(lin, per_tensor=True),
        lambda lin: Int8Layer(lin, no_scale=True),
        KeepsFloat,
    ]),
    "step_bytes": (step, [
        lambda c, n, bw, kv: step(c, n, bw, kv, embeddings=True),
        lambda c, n, bw, kv: step(c, n, bw, kv, with_kv=False),
        lambda c, n, bw, kv: step(c, n, bw, kv, window=False),
        lambda c, n, bw, kv: step(c, n, 4, kv),                         # weights stay float32
    ]),
}

REFERENCES = {"int8_linear": quant.Int8Linear, "step_bytes": formulas.quantized_step_bytes}


(test_correct_answer_passes_and_is_returned, test_unattempted_exercise_gets_the_reference,
 test_planted_bug_fails_with_an_actionable_message,
 test_planted_bug_in_a_notebook_reports_and_lends_the_reference) = contract(
    lab05, CASES, 5, words=("expected", "Hint:"), wrap=False, lent_as=REFERENCES)


@pytest.mark.parametrize("name, stands_for", [("quantize_groups", quant.quantize),
                                              ("dequantize_groups", quant.dequantize)])
def test_lent_wrappers_name_the_functions_they_stand_for(name, stands_for):
    assert getattr(lab05, name)(stub).same_as == (stands_for,)


def test_specific_hints():
    with pytest.raises(CheckFailed, match="within \\[-127, 127\\]|scales"):
        lab05.quantize_groups(CASES["quantize_groups"][1][0])
    with pytest.raises(CheckFailed, match="do not truncate"):
        lab05.quantize_groups(CASES["quantize_groups"][1][1])
    with pytest.raises(CheckFailed, match="materialised the weight"):
        lab05.int8_linear(CASES["int8_linear"][1][0])
    with pytest.raises(CheckFailed, match="keeps a float tensor"):
        lab05.int8_linear(KeepsFloat)


def test_mxfp4_hints_say_what_went_wrong():
    bugs = CASES["mxfp4_round"][1]
    with pytest.raises(CheckFailed, match="power of two"):
        lab05.mxfp4_round(bugs[0])
    with pytest.raises(CheckFailed, match="E2M1 grid"):
        lab05.mxfp4_round(bugs[1])
    with pytest.raises(CheckFailed, match="log2\\(0\\)"):
        lab05.mxfp4_round(bugs[3])
