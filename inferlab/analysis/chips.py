"""Chips on the roofline: where the weights live, and a user's speed against a chip's throughput.

Every accelerator in ``data/hardware.csv`` (``load_hardware(kinds=None)``) is a capacity S, a
bandwidth beta to that capacity and, where the table has one, a 16-bit peak. HBM GPUs and TPUs
keep the weights in tens or hundreds of GB of HBM beside the chip; the SRAM-first designs
(Groq's LPU, Cerebras' wafer-scale engine) keep them in on-chip SRAM, which is tens of times
faster per byte but holds a few hundred MB per chip (44 GB on a whole wafer). Two numbers tell
them apart:

- ``passes_per_second`` = beta / S: how many times a second the chip can read all of its
  memory. When the memory is full of weights and K/V and a decode step reads all of it, no
  sequence can get more tokens per second than this.
- ``chips_to_hold``: the chips whose combined capacity holds the weights (and any K/V asked for).

``serve_point`` prices a system of N chips working as one (ideal tensor parallelism: nothing
is charged for moving activations between chips, which for SRAM systems of hundreds of chips is
what really sets the speed) decoding B sequences of C tokens: per step the course's step-time
model (``inferlab.analysis.step_time``: each kernel on its own roofline over 1/N of its work,
summed); each user gets one token per step, each chip B / N.
``frontier`` walks the batch up to what fits, which draws the trade: more sequences per step
buy throughput per chip with speed per user, and a chip that holds little memory cannot buy
much of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from inferlab.analysis.hardware import DeviceSpec, get_device_spec, load_hardware
from inferlab.analysis.step_time import (Shape, StepModel, cost_precision, kv_bytes_per_token,
    weight_bytes)
from inferlab.model.config import ModelConfig

ACCELERATORS = ("gpu", "tpu", "lpu", "wse")


def accelerators() -> dict[str, DeviceSpec]:
    """Every accelerator row of the hardware table with a memory size (no CPUs)."""
    return {n: s for n, s in load_hardware(kinds=ACCELERATORS).items() if s.memory}


def _spec(device: str | DeviceSpec) -> DeviceSpec:
    return get_device_spec(device) if isinstance(device, str) else device


def passes_per_second(device: str | DeviceSpec) -> float:
    """Bandwidth over capacity: full reads of the chip's memory per second."""
    spec = _spec(device)
    return spec.bandwidth / spec.memory


def chips_for_bytes(weight_bytes: float, kv_bytes: float, chip_bytes: float) -> int:
    """Chips of ``chip_bytes`` each that hold ``weight_bytes`` of weights and ``kv_bytes`` of
    K/V between them: ceil((W + KV) / S)."""
    if chip_bytes <= 0 or weight_bytes < 0 or kv_bytes < 0:
        raise ValueError("need a positive chip capacity and non-negative byte counts")
    return math.ceil((weight_bytes + kv_bytes) / chip_bytes)


def chips_to_hold(model: str | ModelConfig, device: str | DeviceSpec, prec="bf16",
                  kv_tokens: int = 0) -> int:
    """Chips whose memory together holds the weights and ``kv_tokens`` tokens of K/V."""
    config = ModelConfig.from_name(model) if isinstance(model, str) else model
    return chips_for_bytes(weight_bytes(config, prec),
                           kv_tokens * kv_bytes_per_token(config, prec), _spec(device).memory)


@dataclass(frozen=True)
class ServePoint:
    """N chips decoding ``batch`` sequences of ``context`` tokens, at the roofline."""

    device: str
    chips: int
    batch: int
    context: int
    step_s: float
    memory_bound: bool

    @property
    def tokens_per_s_per_user(self) -> float:
        return 1 / self.step_s

    @property
    def tokens_per_s_per_chip(self) -> float:
        return self.batch / self.step_s / self.chips


def max_batch(config: ModelConfig, spec: DeviceSpec, chips: int, context: int,
              prec="bf16") -> int:
    """Sequences of ``context`` tokens whose K/V fit beside the weights on ``chips`` chips."""
    room = chips * spec.memory - weight_bytes(config, prec)
    return max(0, int(room // (context * kv_bytes_per_token(config, prec))))


def serve_point(model: str | ModelConfig, device: str | DeviceSpec, chips: int, batch: int,
                context: int, prec="bf16") -> ServePoint:
    """One decode step of ``batch`` sequences on ``chips`` chips (ideal parallelism)."""
    config = ModelConfig.from_name(model) if isinstance(model, str) else model
    spec = _spec(device)
    if batch > max_batch(config, spec, chips, context, prec):
        raise ValueError(f"{batch} sequences of {context} tokens do not fit on {chips} "
                         f"{spec.name} beside {config.name}'s weights")
    p = cost_precision(prec)
    if spec.peak_flops(p.compute) is None and spec.peak_fp16 is not None:
        p = replace(p, compute="float16")  # a chip with a 16-bit figure in FP16 only
    if spec.peak_flops(p.compute) is None:
        raise ValueError(f"the hardware table has no 16-bit peak for {spec.name}, so the "
                         "roofline cannot bound its arithmetic")
    model = StepModel.for_device(config, spec, p, chips, link=math.inf)  # ideal: free links
    kernels = model.kernels(Shape.decode(batch, batch * (context + 1)))
    memory_bound = sum(k.memory_s for k in kernels) >= sum(k.compute_s for k in kernels)
    return ServePoint(spec.name, chips, batch, context, sum(k.seconds for k in kernels),
                      memory_bound)


def frontier(model: str | ModelConfig, device: str | DeviceSpec, context: int, chips: int,
             prec="bf16", points: int = 12) -> list[ServePoint]:
    """``serve_point`` at batches from 1 to the most that fit, spaced geometrically."""
    config = ModelConfig.from_name(model) if isinstance(model, str) else model
    spec = _spec(device)
    top = max_batch(config, spec, chips, context, prec)
    if top < 1:
        raise ValueError(f"not one sequence of {context} tokens fits on {chips} {spec.name}")
    batches = sorted({max(1, round(top ** (i / (points - 1)))) for i in range(points)})
    return [serve_point(config, spec, chips, b, context, prec) for b in batches]


def plot_user_vs_chip(model: str, devices: dict[str, int], context: int, prec="bf16", ax=None):
    """Tokens/s per chip against tokens/s per user, one curve per device (chips as given)."""
    import matplotlib.pyplot as plt

    from inferlab.analysis.figures import legend_outside, plain_log_ticks

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.2))
    markers = "os^Dv<>p"
    for i, (device, chips) in enumerate(devices.items()):
        pts = frontier(model, device, context, chips, prec)
        ax.plot([p.tokens_per_s_per_user for p in pts], [p.tokens_per_s_per_chip for p in pts],
                marker=markers[i % len(markers)], markersize=4,
                label=f"{chips} x {device} (batch 1 to {pts[-1].batch})")
    ax.set(xscale="log", yscale="log", xlabel="tokens/s for each user (roofline bound)",
           ylabel="tokens/s per chip",
           title=f"{model}, {prec}, {context:,} tokens each: batch 1 (right) to full (left)")
    plain_log_ticks(ax)
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax)
    return ax
