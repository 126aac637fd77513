"""The roofline explorer: where one decode step of a model lands on a device's roofline.

Pick a device (a row of ``data/hardware.csv``), a model (a row of ``data/models.csv``), a batch
size, a dtype and a context length. One decode step then

- reads every weight once, ``formulas.decode_bytes_per_step``, whatever the batch;
- reads each sequence's KV cache, ``formulas.kv_bytes`` (``batch`` x ``context`` tokens);
- does ``batch`` x ``formulas.flops_per_token`` FLOPs.

FLOPs over bytes is the step's arithmetic intensity, which places it on the device's roofline
(Williams et al. 2009). Its time is the course's step-time model
(``inferlab.analysis.step_time``): the linear layers, attention and the LM head each on their
own roofline, summed, since they run one after another; the batch's tokens/s ceiling is
``batch`` over that time. ``decode_point`` computes all of it as plain numbers;
``plot_explorer`` draws the site's static figure; ``roofline_widget`` is the ipywidgets version a
notebook shows (``show_roofline`` picks whichever is available). The KV capacity calculator is
``inferlab.analysis.capacity``.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.analysis import formulas
from inferlab.analysis.hardware import DeviceSpec, get_device_spec, load_hardware
from inferlab.analysis.step_time import Shape, StepModel
from inferlab.model.config import ModelConfig, model_presets
from inferlab.analysis.widgets import redrawing, widget_or_figure

DTYPES = ("bfloat16", "float16")
BATCHES = tuple(2**i for i in range(13))             # 1 .. 4096
CONTEXTS = (0,) + tuple(2**i for i in range(7, 18))   # 0, 128 .. 128K tokens


@dataclass(frozen=True)
class DecodePoint:
    """One decode step of ``model`` on ``device``: bytes, FLOPs, intensity and the time floor.

    Bytes, FLOPs and seconds are per step (one token for each of the ``batch`` sequences).
    ``peak_flops`` and everything derived from it are None for devices the table gives no
    FLOP/s figure (the CPU rows): their floor is the bandwidth one alone.
    """

    device: str
    model: str
    dtype: str
    batch: int
    context: int
    bandwidth: float            # bytes/s
    peak_flops: float | None    # FLOP/s
    weight_bytes: float         # read once a step
    kv_bytes: float             # the whole batch's cache, read once a step
    flops: float
    memory_time: float          # decode_time_floor(bytes, bandwidth)
    compute_time: float | None  # flops / peak
    device_memory: float | None
    kernels: tuple = ()         # step_time.Kernel per kernel class: the step's time

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def ridge(self) -> float | None:
        return None if self.peak_flops is None else formulas.ridge_point(self.peak_flops, self.bandwidth)

    @property
    def step_time(self) -> float:
        """Least seconds a step can take: each kernel's roofline, summed (``step_time``)."""
        return float(sum(k.seconds for k in self.kernels))

    @property
    def tokens_per_s(self) -> float:
        """Ceiling on the whole batch's tokens per second."""
        return self.batch / self.step_time

    @property
    def attainable_flops(self) -> float:
        """FLOP/s the roofline allows at this intensity."""
        return self.flops / self.step_time

    @property
    def bound(self) -> str:
        """"memory" or "compute": what most of the step's time waits on, kernel by kernel
        (memory without a peak figure)."""
        compute = sum(k.seconds for k in self.kernels if k.bound == "compute")
        return "compute" if compute > self.step_time / 2 else "memory"

    @property
    def fits(self) -> bool | None:
        """Whether weights and cache fit in the device's memory (None: size unknown)."""
        return None if self.device_memory is None else self.bytes <= self.device_memory

    def __str__(self) -> str:
        lines = [
            f"{self.model} ({self.dtype}) on {self.device}, batch {self.batch}, "
            f"context {self.context:,} tokens",
            f"  bytes per step: {self.weight_bytes / 1e9:,.2f} GB weights + "
            f"{self.kv_bytes / 1e9:,.2f} GB KV cache; {self.flops / 1e12:,.3f} TFLOP",
            f"  intensity {self.intensity:,.1f} FLOP/B"
            + (f"; ridge {self.ridge:,.0f} FLOP/B: {self.bound}-bound" if self.ridge else
               "; the table has no FLOP/s figure for this device: bandwidth floor only"),
            f"  step floor {self.step_time * 1e3:,.3f} ms -> at most {self.tokens_per_s:,.1f} "
            f"tokens/s for the batch ({self.tokens_per_s / self.batch:,.1f} per sequence)",
        ]
        if self.fits is False:
            lines.append(f"  does NOT fit: {self.bytes / 1e9:,.1f} GB needed, "
                         f"{self.device_memory / 1e9:,.0f} GB on the device")
        return "\n".join(lines)


def _spec(device: DeviceSpec | str) -> DeviceSpec:
    return get_device_spec(device) if isinstance(device, str) else device


def _config(model: ModelConfig | str) -> ModelConfig:
    return ModelConfig.from_name(model) if isinstance(model, str) else model


def _peak(spec: DeviceSpec, dtype: str) -> float | None:
    if spec.peak_bf16 is None and spec.peak_fp16 is None:
        return None  # a CPU row: bandwidth only
    peak = spec.peak_flops(dtype)
    if peak is None:
        others = [d for d in DTYPES if spec.peak_flops(d)]
        raise ValueError(f"the hardware table has no {dtype} peak for {spec.name} "
                         f"({spec.notes or 'no figure'}); choose {' or '.join(others)}")
    return peak


def decode_point(device: DeviceSpec | str, model: ModelConfig | str, batch: int = 1,
                 dtype: str = "bfloat16", context: int = 0) -> DecodePoint:
    """The numbers of one decode step: ``batch`` sequences, each ``context`` tokens long.

    Weights and cache are both in ``dtype``; the peak is the table's dense figure for it.
    """
    if batch < 1 or context < 0:
        raise ValueError(f"batch must be >= 1 and context >= 0, got batch={batch}, context={context}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    spec, config = _spec(device), _config(model)
    peak = _peak(spec, dtype)
    weights = formulas.decode_bytes_per_step(config, dtype)
    kv = formulas.kv_bytes(config, context, dtype, batch)
    flops = batch * formulas.flops_per_token(config, context)
    model = StepModel.for_roof(config, peak, spec.bandwidth, dtype)
    kernels = tuple(model.kernels(Shape.of_rows([(1, context)] * batch, model.attention.window)))
    return DecodePoint(
        device=spec.name, model=config.name, dtype=dtype, batch=batch, context=context,
        bandwidth=spec.bandwidth, peak_flops=peak, weight_bytes=weights, kv_bytes=kv,
        flops=flops, memory_time=formulas.decode_time_floor(weights + kv, spec.bandwidth),
        compute_time=None if peak is None else flops / peak, device_memory=spec.memory,
        kernels=kernels)


def decode_sweep(device, model, dtype: str = "bfloat16", context: int = 0,
                 batches=BATCHES) -> list[DecodePoint]:
    """``decode_point`` for each batch size."""
    return [decode_point(device, model, b, dtype, context) for b in batches]


def plot_explorer(device="H100 SXM", model="llama-3-8b", batch: int = 1, dtype: str = "bfloat16",
                  context: int = 0, batches=BATCHES, axes=None):
    """Two panels: the step on the device's roofline (every batch in ``batches``, the chosen
    one ringed), and the tokens/s ceiling against the batch size. Returns the two Axes."""
    import matplotlib.pyplot as plt
    import numpy as np

    from inferlab.analysis.figures import legend_below, plain_log_ticks
    from inferlab.analysis.roofline import Roof, plot_roofline

    point = decode_point(device, model, batch, dtype, context)
    sweep = decode_sweep(device, model, dtype, context, batches)
    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(6.6, 8.6))  # stacked: each panel the column wide
    left, right = axes
    x_lo = min(0.1, min(p.intensity for p in sweep) / 2)
    x_hi = max(2000.0, max(p.intensity for p in sweep) * 2)
    if point.peak_flops is not None:
        plot_roofline([Roof(f"{point.device} ({dtype})", point.peak_flops, point.bandwidth)],
                      ax=left, xlim=(x_lo, x_hi))
    else:  # no FLOP/s figure: only the bandwidth slope can be drawn
        x = np.logspace(np.log10(x_lo), np.log10(x_hi), 200)
        left.plot(x, point.bandwidth * x, label=f"{point.device}: bandwidth slope only")
        left.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)",
                 ylabel="attainable throughput (FLOP/s)")
        left.grid(True, which="both", alpha=0.3)
    left.plot([p.intensity for p in sweep], [p.attainable_flops for p in sweep], ".-", color="C1",
              label=f"decode, batch {sweep[0].batch}..{sweep[-1].batch}")
    too_big = [p for p in sweep if p.fits is False]
    if too_big:
        left.plot([p.intensity for p in too_big], [p.attainable_flops for p in too_big], "x",
                  color="0.4", label=f"does not fit in {point.device_memory / 1e9:,.0f} GB")
    left.plot([point.intensity], [point.attainable_flops], "o", markersize=11, fillstyle="none",
              color="C3", label=f"batch {batch}: {point.bound}-bound")
    left.set_title(f"{point.model}, context {context:,}: one decode step")

    right.plot([p.batch for p in sweep], [p.tokens_per_s for p in sweep], ".-", color="C1",
               label="ceiling: batch / sum of the kernels' rooflines")
    memory_only = [p.batch / p.memory_time for p in sweep]
    right.plot([p.batch for p in sweep], memory_only, ":", color="C0",
               label="bandwidth alone (bytes / bandwidth)")
    if too_big:
        right.plot([p.batch for p in too_big], [p.tokens_per_s for p in too_big], "x",
                   color="0.4", label=f"does not fit in {point.device_memory / 1e9:,.0f} GB")
    right.plot([batch], [point.tokens_per_s], "o", markersize=11, fillstyle="none", color="C3",
               label=f"batch {batch}: {point.tokens_per_s:,.0f} tokens/s")
    right.set(xscale="log", yscale="log", xlabel="batch size (sequences decoded together)",
              ylabel="tokens/s, whole batch (upper bound)",
              title=f"{point.model} on {point.device}, {dtype}: tokens/s ceiling")
    right.grid(True, which="both", alpha=0.3)
    plain_log_ticks(right)
    right.figure.tight_layout()
    for ax in (left, right):   # after the layout, so that they sit under the final labels
        legend_below(ax)
    right.figure.tight_layout()  # again, to make room between the panels for the upper legend
    return axes


def roofline_widget():
    """An ipywidgets explorer: device x model x batch x dtype x context -> the step's numbers and
    the two panels. Raises ImportError when ipywidgets is missing (``pip install ipywidgets``);
    a notebook that should run everywhere calls ``show_roofline()`` instead."""
    import ipywidgets as widgets

    controls = {
        "device": widgets.Dropdown(options=list(load_hardware()), value="H100 SXM",
                                   description="device"),
        "model": widgets.Dropdown(options=list(model_presets()), value="llama-3-8b",
                                  description="model"),
        "dtype": widgets.Dropdown(options=list(DTYPES), value="bfloat16", description="dtype"),
        "batch": widgets.SelectionSlider(options=list(BATCHES), value=1, description="batch",
                                         continuous_update=False),
        "context": widgets.SelectionSlider(options=list(CONTEXTS), value=0,
                                           description="context", continuous_update=False),
    }

    def draw(**values):
        print(decode_point(**values))
        plot_explorer(**values)

    return redrawing(controls, [["device", "model", "dtype"], ["batch", "context"]], draw)


def show_roofline(**plot_kwargs):
    """The widget when ipywidgets is importable, else the static figure (returns what it made)."""
    return widget_or_figure(roofline_widget, plot_explorer, **plot_kwargs)
