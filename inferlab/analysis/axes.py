"""Small helpers for the course's axes: plain tick labels on log axes and legends that sit
outside the data (beside or below the axes).

They live apart from ``figures`` (the checks a figure must pass) and ``column`` (fitting a figure
to the site's column), which both use them, so that neither imports the other's back.
"""

from __future__ import annotations

import numpy as np


def plain_log_ticks(ax, which: str = "xy") -> None:
    """Label the major ticks of log axes as plain numbers (1,000 not 10^3; 1 T not 10^12), hide
    minor labels.

    An axis that spans less than two decades also gets ticks at 2 and 5 times each power of ten,
    so that it shows a few numbers instead of matplotlib's minor labels such as "4x10^1".
    Call it after the data are drawn (it reads the axis limits).
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator

    def fmt(value, _pos):
        if value >= 1e6:       # 1 M, 100 G, 1 T, 1,000 T: a unit's prefix, never twelve zeros
            power = min(int(np.log10(value) + 1e-9) // 3, 4)
            return f"{value / 1000 ** power:,g} {' kMGT'[power]}"
        return f"{value:,.0f}" if value >= 1 else f"{value:g}"

    for name in which:
        axis = ax.xaxis if name == "x" else ax.yaxis
        if axis.get_scale() != "log":
            continue
        lo, hi = (ax.get_xlim() if name == "x" else ax.get_ylim())
        if lo > 0 and hi / lo < 10:
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0,
                                                              8.0)))
        elif lo > 0 and hi / lo < 100:
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(plt.FuncFormatter(fmt))
        axis.set_minor_formatter(plt.NullFormatter())


def legend_outside(ax, **kwargs):
    """A legend just right of ``ax``, its top aligned with the axes' top.

    ``bbox_to_anchor`` moves it further right, past a twin axis's labels."""
    kwargs.setdefault("fontsize", "small")
    kwargs.setdefault("bbox_to_anchor", (1.02, 1.0))
    return ax.legend(loc="upper left", borderaxespad=0.0, **kwargs)


def legend_below(ax, **kwargs):
    """A legend under ``ax``'s x label and tick labels, centred: for panels side by side.

    It hangs a fixed number of points below the axes, so a later ``tight_layout`` that resizes
    the axes moves it together with the labels it must clear.
    """
    from matplotlib.transforms import offset_copy

    kwargs.setdefault("fontsize", "small")
    fig = ax.figure
    fig.canvas.draw()
    boxes = [ax.xaxis.label.get_window_extent()] + [t.get_window_extent()
                                                    for t in ax.get_xticklabels() if t.get_text()]
    drop = (ax.get_window_extent().y0 - min(b.y0 for b in boxes)) * 72 / fig.dpi + 4
    anchor = offset_copy(ax.transAxes, fig=fig, y=-drop, units="points")
    return ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=anchor,
                     borderaxespad=0.0, **kwargs)
