"""The roofline model (Williams, Waterman and Patterson, CACM 2009) and its plot.

Attainable FLOP/s = min(peak FLOP/s, bandwidth x arithmetic intensity). Left of the ridge point
(peak / bandwidth) a kernel is memory-bound: only more bandwidth, or fewer bytes per FLOP, makes
it faster. ``plot_roofline`` draws the learner's own roof (from the probes) beside any device of
the hardware table and places measured points on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from inferlab.analysis.figures import legend_below, plain_log_ticks
from inferlab.analysis.formulas import ridge_point
from inferlab.analysis.hardware import DeviceSpec, get_device_spec


@dataclass(frozen=True)
class Roof:
    """A roofline: a name, peak FLOP/s and bandwidth (bytes/s)."""

    name: str
    peak_flops: float
    bandwidth: float

    def __post_init__(self) -> None:
        ridge_point(self.peak_flops, self.bandwidth)  # validates both

    @property
    def ridge(self) -> float:
        return ridge_point(self.peak_flops, self.bandwidth)

    def attainable(self, intensity):
        """Attainable FLOP/s at ``intensity`` (FLOP/byte); works on numbers and arrays."""
        return np.minimum(self.peak_flops, self.bandwidth * np.asarray(intensity, dtype=float))

    @classmethod
    def from_spec(cls, spec: DeviceSpec | str, dtype="bfloat16") -> "Roof":
        """The roof of a hardware-table row; refuses a row with no peak for ``dtype``."""
        if isinstance(spec, str):
            spec = get_device_spec(spec)
        peak = spec.peak_flops(dtype)
        if peak is None:
            raise ValueError(f"the hardware table has no {dtype} peak for {spec.name}; "
                             "try dtype='float16' or measure it with measure_peak_flops()")
        return cls(f"{spec.name} ({str(dtype).removeprefix('torch.')})", peak, spec.bandwidth)


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    """min(peak, bandwidth x intensity), in FLOP/s."""
    return Roof("roof", peak_flops, bandwidth).attainable(intensity)


def plot_roofline(roofs: Sequence[Roof], points: Iterable[tuple[float, float, str]] = (),
                  ax=None, title: str | None = None, xlim=(0.1, 2000.0)):
    """Log-log roofline of each roof, with measured ``points`` (intensity, FLOP/s, label).

    Returns the matplotlib Axes. Axes carry units; the title should say which device made the
    measured points.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    x = np.logspace(np.log10(xlim[0]), np.log10(xlim[1]), 400)
    for roof in roofs:
        (line,) = ax.plot(x, roof.attainable(x), label=f"{roof.name}: ridge {roof.ridge:,.0f} FLOP/B")
        ax.axvline(roof.ridge, color=line.get_color(), linestyle=":", linewidth=1)
    for intensity, flops, label in points:
        ax.plot([intensity], [flops], "o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable throughput (FLOP/s)")
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    plain_log_ticks(ax)        # 1 T, 100 G: no 10^12 on the throughput axis
    legend_below(ax, ncols=2)  # under the axes: beside them it would take half the column
    return ax
