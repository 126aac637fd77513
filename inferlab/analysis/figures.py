"""Small habits every figure of the book shares, and the check that keeps them.

- ``plain_log_ticks``: logarithmic axes labelled 1, 10, 100 (or 0.1, 1,000; from a million on,
  1 M, 100 G, 1 T, 1,000 T) instead of matplotlib's default 10^0 or, on short ranges, "4x10^1".
- ``legend_outside`` and ``legend_below``: a legend right of or under the axes, where it
  cannot cover a line.
- ``figure_problems``: what a reader would trip over in a drawn figure: a legend inside an
  axes (where data can reach it: measured data move from run to run, so the check refuses the
  place, not only an overlap seen once), a legend that covers plotted data or labels, a data
  point drawn outside the axes (clipped away), and lines or markers that no legend entry
  explains when the axes has a legend. The plotting helpers' tests call it, and so does the
  book build, through ``check_figures_as_shown``.
- ``use_course_style`` (from ``inferlab.analysis.column``): the book's matplotlib settings, and
  every figure a notebook shows fitted to the site's 688-pixel content column.
- ``check_figures_as_shown``: in a Jupyter kernel, run ``figure_problems`` on every figure as the
  notebook shows it (fitted to the column), and gather what it finds. Each chapter turns it on in a hidden cell after
  its imports and asserts in a hidden last cell that nothing was found, so the build that
  executes a chapter also checks its figures: one execution serves the book and the test.
"""

from __future__ import annotations

import numpy as np

from inferlab.analysis.axes import legend_below, legend_outside, plain_log_ticks  # noqa: F401
from inferlab.analysis.column import (COLUMN_PX, fit_to_column, shown_width_px,  # noqa: F401
                                      use_course_style, wrap_figure_display)


def _data_points(artist, ax):
    """Display coordinates of the points an artist draws (lines, markers, bars)."""
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    if isinstance(artist, Line2D):
        xy = np.column_stack([np.asarray(artist.get_xdata(), float),
                              np.asarray(artist.get_ydata(), float)])
        if artist.get_transform() != ax.transData:
            return np.empty((0, 2))          # axhline and friends span the axes: not data
        return ax.transData.transform(xy)
    if isinstance(artist, PathCollection):
        return artist.get_offset_transform().transform(artist.get_offsets())
    if isinstance(artist, Rectangle):
        box = artist.get_window_extent()
        return np.array([[box.x1, (box.y0 + box.y1) / 2]])  # the end of a bar
    return np.empty((0, 2))


def _rgb(color):
    from matplotlib.colors import to_rgb

    return tuple(round(c, 3) for c in to_rgb(color))


def _shown_ticklabels(axis) -> list:
    """The major tick labels an axis draws: those of ticks inside its view, with text."""
    lo, hi = sorted(axis.get_view_interval())
    span = (hi - lo) * 1e-9
    return [t for loc, t in zip(axis.get_majorticklocs(), axis.get_ticklabels())
            if lo - span <= loc <= hi + span and t.get_visible() and t.get_text()]


def figure_problems(fig, drawn: bool = False) -> list[str]:
    """Everything in ``fig`` a reader would trip over; an empty list when there is nothing.
    ``drawn``: the figure was drawn after its last change (``shown_width_px``)."""
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    if not drawn:
        fig.canvas.draw()
    problems = []
    legends = [(ax, ax.get_legend()) for ax in fig.axes if ax.get_legend() is not None]
    legends += [(None, leg) for leg in fig.legends]
    for owner, legend in legends:
        lbox = legend.get_window_extent()
        for ax in fig.axes:
            box = ax.get_window_extent()
            if (min(lbox.x1, box.x1) - max(lbox.x0, box.x0) > 1
                    and min(lbox.y1, box.y1) - max(lbox.y0, box.y0) > 1):
                title = ax.get_title() or (owner.get_title() if owner else "")
                problems.append(f"{title!r}: a legend sits inside the axes, where data can "
                                "reach it (use legend_outside or legend_below)")
    for ax in fig.axes:
        box = ax.get_window_extent()
        artists = [a for a in ax.get_children()
                   if isinstance(a, (Line2D, PathCollection, Rectangle)) and a.get_visible()
                   and a is not ax.patch and not (ax.get_legend() and a in ax.get_legend()
                                                  .get_children())]
        for artist in artists:
            pts = _data_points(artist, ax)
            pts = pts[np.all(np.isfinite(pts), axis=1)]
            if not len(pts):
                continue
            name = artist.get_label() or type(artist).__name__
            # a marker is cut when its centre is closer to the frame than its radius
            r = 0.0
            if isinstance(artist, Line2D) and artist.get_marker() not in (None, "None", ""):
                r = artist.get_markersize() * fig.dpi / 72 / 2 - 1
            outside = ((pts[:, 0] < box.x0 + r - 1) | (pts[:, 0] > box.x1 - r + 1)
                       | (pts[:, 1] < box.y0 + r - 1) | (pts[:, 1] > box.y1 - r + 1))
            if artist.get_clip_on() and outside.any() and not isinstance(artist, Rectangle):
                problems.append(f"{ax.get_title()!r}: {outside.sum()} point(s) of {name!r} "
                                "fall outside the axes or are cut by its frame")
            for owner, legend in legends:
                lbox = legend.get_window_extent()
                inside = ((pts[:, 0] > lbox.x0) & (pts[:, 0] < lbox.x1)
                          & (pts[:, 1] > lbox.y0) & (pts[:, 1] < lbox.y1))
                if inside.any():
                    problems.append(f"{ax.get_title()!r}: the legend covers {inside.sum()} "
                                    f"point(s) of {name!r}")
        for axis in (ax.xaxis, ax.yaxis):
            offset = axis.get_offset_text()
            powers = [t.get_text() for t in _shown_ticklabels(axis)
                      if "^" in t.get_text() or "e+" in t.get_text()]
            if (offset.get_visible() and offset.get_text()) or powers:
                problems.append(f"{ax.get_title()!r}: the {axis.axis_name} axis prints powers "
                                f"of ten ({offset.get_text() or powers[0]!r}): use units "
                                "(TFLOP/s, GB) or plain_log_ticks")
        texts = [ax.xaxis.label, ax.yaxis.label, ax.title, *_shown_ticklabels(ax.xaxis),
                 *_shown_ticklabels(ax.yaxis)]
        for _, legend in legends:
            lbox = legend.get_window_extent()
            for text in texts:
                if text.get_text() and text.get_visible():
                    tbox = text.get_window_extent()
                    if (tbox.x0 < lbox.x1 and tbox.x1 > lbox.x0 and tbox.y0 < lbox.y1
                            and tbox.y1 > lbox.y0):
                        problems.append(f"{ax.get_title()!r}: the legend covers the text "
                                        f"{text.get_text()!r}")
        if legends:
            explained = set()
            for _, legend in legends:
                for handle in getattr(legend, "legend_handles", []):
                    if isinstance(handle, Line2D):
                        explained.add((handle.get_marker(), _rgb(handle.get_color())))
            for artist in artists:
                if not isinstance(artist, Line2D) or artist.get_marker() in (None, "None", ""):
                    continue
                style = (artist.get_marker(), _rgb(artist.get_color()))
                if style not in explained:
                    problems.append(f"{ax.get_title()!r}: marker {style[0]!r} drawn with no "
                                    "legend entry that explains it")
    return problems


def check_figures_as_shown() -> list[str]:
    """Check each figure the notebook shows with ``figure_problems``; return the list the problems
    gather in (empty while every figure is readable).

    It wraps the kernel's display formatter for matplotlib figures (the inline backend shows a
    figure by formatting it, whether a cell calls ``plt.show()`` or just ends), so the check sees
    exactly the figures a reader sees, as they are drawn and fitted to the column. Outside an
    IPython kernel it changes nothing and the list stays empty.
    """
    problems: list[str] = []
    shown = [0]                # figures checked so far, to name each in a message

    def check(fig):   # after fit_to_column, whose last step drew the figure as it is
        shown[0] += 1
        title = fig._suptitle.get_text() if fig._suptitle else ""
        title = title or next((ax.get_title() for ax in fig.axes if ax.get_title()), "")
        width = shown_width_px(fig, drawn=True)
        found = figure_problems(fig, drawn=True)
        if width > COLUMN_PX:  # fit_to_column could not narrow it enough
            found.append(f"{width:.0f} pixels wide, more than the column's {COLUMN_PX}")
        problems.extend(f"figure {shown[0]} ({title!r}): {p}" for p in found)

    wrap_figure_display(fit_to_column)   # first, if use_course_style has not asked for it
    wrap_figure_display(check)
    return problems
