"""Figures and tables sized for the column they are shown in: the site's, 688 pixels.

A notebook shows a matplotlib figure as a PNG of its tight bounding box at the figure's dpi, and
the site shows that PNG at its own pixel size unless it is wider than the column; then the
browser scales it down, and 10-point text drawn for a 1,100-pixel figure ends up 5-6 pixels
high. So every figure the book shows is made to fit:

- ``COURSE_STYLE`` and ``use_course_style``: the book's matplotlib settings (100 dpi, so a
  6.9-inch figure fills the column; 10-point text; no "+1e12" offsets), and, in a Jupyter
  kernel, every figure a notebook shows passed through ``fit_to_column`` first and every
  printed line of prose wrapped to ``OUTPUT_CHARS`` (``wrap_printed_lines``; a table row is
  never wrapped: show a table as a ``Table``). Chapters, solutions and the calculators call it
  in their first cell.
- ``fit_to_column``: plain tick labels on log axes (1 T, not 10^12), long titles wrapped, and the
  figure narrowed (its text keeps its size; the axes give up the width) until it fits.
- ``shown_width_px``: how wide a notebook shows a figure.
- ``Table``: rows shown as a table (HTML in a notebook and on the site, aligned text when
  printed), instead of ``print`` lines that the column cuts after about 77 characters.

``inferlab.analysis.figures.check_figures_as_shown`` fits each figure the same way before it
checks it, and reports one that still does not fit.
"""

from __future__ import annotations

import re

# The width the site gives a notebook's output at a 1280-pixel browser window: sphinx-book-theme's
# article is 752 pixels wide with 32 pixels of padding each side (tests/test_site.py measures it
# on the built site). A notebook shows a figure as a PNG of its tight bounding box at the
# figure's dpi, so at 100 dpi a figure fits when it is at most 6.88 inches wide, legend included.
COLUMN_PX = 688
COURSE_STYLE = {
    "figure.dpi": 100,
    "figure.figsize": (6.4, 3.4),
    "font.size": 10,
    "axes.titlesize": 10.5,             # titles no larger than needed: panels share 688 pixels
    "figure.titlesize": 11,
    "axes.formatter.useoffset": False,  # no "+1e12" printed over an axis: scale the data instead
}


# Monospace characters a printed line may have: an output block holds about 77 in the column
# and 75 inside an exercise's drop-down answer (8.4 pixels a character, and the blocks' own
# padding), measured on the built site.
OUTPUT_CHARS = 74


def use_course_style() -> None:
    """Apply ``COURSE_STYLE``; in a Jupyter kernel, show every figure fitted to the column and
    wrap every printed line of prose longer than ``OUTPUT_CHARS`` (``wrap_printed_lines``)."""
    import matplotlib.pyplot as plt

    plt.rcParams.update(COURSE_STYLE)
    if wrap_figure_display(fit_to_column):
        wrap_printed_lines()


# A row of a table printed as text: cells aligned by runs of spaces ("B=   16    412.0 us"; a
# number padded inside a bracket, "(  2.05", is not a gap between cells), or a rule under a
# header ("------  ----"). Prose has one space between its words.
_GAP = re.compile(r"(?<=[^\s(\[]) {2,}(?=\S)")
_RULE = re.compile(r"^\s*[-=]{3,}(\s+[-=]{3,})*\s*$")
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")  # a string's repr, quotes and all
_PROSE_ROOM = 24  # the least room a row's last cell needs to be wrapped under itself


def is_table_row(line: str) -> bool:
    """True for a line that is a row of a table printed as text (``Table`` printed, or columns
    aligned with format widths): breaking it would scatter its cells over the next lines.
    Spaces inside a quoted string (a repr of generated code, say) are not a gap."""
    bare = _QUOTED.sub(lambda m: "q" * len(m.group()), line)
    return bool(_GAP.search(bare.lstrip(" ")) or _RULE.match(line))


def wrap_line(line: str, width: int = OUTPUT_CHARS) -> str:
    """``line`` broken at spaces into lines of at most ``width`` characters (a word longer than
    that stays whole), each continuation indented four spaces more than the line.

    A table row (``is_table_row``) is never broken between or inside its cells: a table wider
    than the column is shown as a ``Table``. Only a row whose last cell is prose (words after
    its last gap, the cells before it leaving room) has that cell wrapped under itself, as a
    table wraps its last column: a listing of one row a design ending in a sentence keeps its
    first columns clear."""
    import textwrap

    if len(line) <= width:
        return line
    indent = line[:len(line) - len(line.lstrip(" "))]
    if is_table_row(line):
        gaps = list(_GAP.finditer(_QUOTED.sub(lambda m: "q" * len(m.group()), line), len(indent)))
        start = gaps[-1].end() if gaps else len(line)
        if start > width - _PROSE_ROOM or " " not in line[start:].strip():
            return line
        return textwrap.fill(line[start:], width, initial_indent=line[:start],
                             subsequent_indent=" " * start, break_long_words=False,
                             break_on_hyphens=False)
    return textwrap.fill(line, width, subsequent_indent=indent + "    ",
                         break_long_words=False, break_on_hyphens=False)


class _WrappingStream:
    """A text stream that wraps each complete line it is given, and passes the rest through."""

    def __init__(self, stream, width: int):
        self._stream, self._width, self._pending = stream, width, ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        if lines:
            self._stream.write("\n".join(wrap_line(line, self._width) for line in lines) + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:          # a line not ended yet (a progress counter): as it is
            self._stream.write(self._pending)
            self._pending = ""
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def wrap_printed_lines(width: int = OUTPUT_CHARS) -> None:
    """Wrap the prose the notebook prints (``sys.stdout``) to ``width`` characters a line, so
    that no printed sentence runs past the site's column; once per kernel. Table rows stay whole
    (``wrap_line``), and stderr, where a check's ``[FAIL]`` block goes, is left alone."""
    import sys

    if not isinstance(sys.stdout, _WrappingStream):
        sys.stdout = _WrappingStream(sys.stdout, width)


def shown_width_px(fig, drawn: bool = False) -> float:
    """The width in pixels of ``fig`` as a notebook shows it (``bbox_inches="tight"``, with
    matplotlib's padding, at ``fig.dpi``). ``drawn``: the figure was drawn after its last
    change, so it need not be drawn again (a draw of a figure with log axes takes about a
    second of a book build's CPU)."""
    import matplotlib as mpl

    if not drawn:
        fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    return (box.width + 2 * mpl.rcParams["savefig.pad_inches"]) * fig.dpi


def fit_to_column(fig, width_px: float = COLUMN_PX) -> None:
    """Narrow ``fig`` (its height kept) until it is shown at most ``width_px`` wide, and plain
    tick labels on its log axes (``plain_log_ticks``). A legend beside its axes moves under them
    first.

    Text keeps its size in points, so it stays legible; the axes give up the width, and a title
    wider than its axes (or than the column, for the figure's own title) is wrapped onto more
    lines. A figure with no layout engine is given matplotlib's constrained layout, which makes
    room for titles and for legends outside the axes, so that panels side by side do not run
    into each other. It aims a few pixels short of ``width_px``: the saved PNG rounds up.
    """
    from matplotlib.layout_engine import ConstrainedLayoutEngine
    from matplotlib.ticker import LogFormatter

    from inferlab.analysis.axes import plain_log_ticks

    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if axis.get_scale() == "log" and isinstance(axis.get_major_formatter(),
                                                         LogFormatter):
                plain_log_ticks(ax, name)
    target = width_px - 6
    shown = shown_width_px(fig)
    if shown > target:
        _legends_below(fig)
        shown = shown_width_px(fig)
    for _ in range(6):   # each pass measures the figure as the last draw left it
        wrapped = _wrap_wide_titles(fig, target, drawn=True)
        if shown <= target and not wrapped:
            return
        if shown > target:
            w, h = fig.get_size_inches()
            fig.set_size_inches(max(w - (shown - target) / fig.dpi, 2.0), h)
        if not isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine):
            # constrained layout makes room for titles, the figure's title and legends outside
            # the axes, which tight_layout does not all do
            try:
                fig.set_layout_engine("constrained")
            except RuntimeError:           # an engine that cannot be swapped (colorbars)
                fig.tight_layout()
        shown = shown_width_px(fig)


def _legends_below(fig) -> None:
    """Move each legend that sits right of its axes under it: beside the axes it would leave the
    data a fraction of a 688-pixel column."""
    from inferlab.analysis.axes import legend_below

    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        if legend.get_window_extent().x0 < ax.get_window_extent().x1 - 1:
            continue
        labels = [t.get_text() for t in legend.get_texts()]
        title = legend.get_title().get_text() or None
        handles = legend.legend_handles
        legend.remove()
        two = len(labels) > 3 and max(len(label) for label in labels) <= 28
        legend_below(ax, handles=handles, labels=labels, title=title, ncols=2 if two else 1)


def _wrap_wide_titles(fig, width_px: float, drawn: bool = False) -> bool:
    """Wrap the figure's title to ``width_px`` and each axes title to its axes' width;
    True when any was wrapped. ``drawn``: as for ``shown_width_px``."""
    import textwrap

    if not drawn:
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [(ax.title, ax.get_window_extent().width) for ax in fig.axes]
    if fig._suptitle is not None:
        texts.append((fig._suptitle, width_px - 2 * fig.dpi * 0.1))
    wrapped = False
    for text, room in texts:
        content = text.get_text()
        width = text.get_window_extent(renderer).width
        if not content or width <= room:
            continue
        longest = max(content.split("\n"), key=len)
        chars = max(16, int(len(longest) * room / width) - 1)
        text.set_text("\n".join(textwrap.fill(line, chars) for line in content.split("\n")))
        wrapped = True
    return wrapped


_BEFORE_SHOWN: list = []   # what runs on each figure before the kernel shows it, in order


def wrap_figure_display(before) -> bool:
    """Call ``before(fig)`` whenever the kernel shows a matplotlib figure, after whatever was
    given before it (each function once, however often it is given); False outside a kernel.
    The kernel's formatter is wrapped once, so a figure is fitted once however many calls
    ask for it."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    if before not in _BEFORE_SHOWN:
        _BEFORE_SHOWN.append(before)
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    plt.close(plt.figure())    # the inline backend registers its formatter with a first figure
    for mime in ("image/png", "image/svg+xml"):
        formatter = shell.display_formatter.formatters.get(mime)
        try:
            show = formatter.lookup_by_type(Figure)
        except (AttributeError, KeyError):
            continue
        if getattr(show, "_course_wrapped", False):
            return True

        def shown(fig, _show=show):
            for hook in list(_BEFORE_SHOWN):
                hook(fig)
            return _show(fig)

        shown._course_wrapped = True
        formatter.for_type(Figure, shown)
        return True            # one format is enough: each figure is seen once
    return False


class Table:
    """Rows shown as a table: an HTML table in a notebook and on the site, aligned columns when
    printed. ``rows`` are dicts (keys are the column names) or sequences with ``columns``; cells
    are shown as they are given (format numbers before), numbers right-aligned."""

    def __init__(self, rows, columns=None, caption: str | None = None):
        rows = list(rows)
        if columns is None:
            columns = list(dict.fromkeys(k for row in rows for k in row))
        self.columns = [str(c) for c in columns]
        self.rows = [[row.get(c, "") for c in columns] if isinstance(row, dict) else list(row)
                     for row in rows]
        self.caption = caption

    @staticmethod
    def _numeric(cell) -> bool:
        text = str(cell).strip().lstrip("$~<>=-+").rstrip("%x")
        return bool(text) and text.replace(",", "").replace(".", "", 1).isdigit()

    def _repr_html_(self) -> str:
        import html

        # every cell says how it is aligned: JupyterLab right-aligns all table cells by default
        def cell(tag, value, right):
            align = "right" if right else "left"
            return f'<{tag} style="text-align: {align}">{html.escape(str(value))}</{tag}>'

        numeric = [bool(self.rows) and all(self._numeric(row[i]) for row in self.rows)
                   for i in range(len(self.columns))]
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        head = "".join(cell("th", c, n) for c, n in zip(self.columns, numeric))
        body = "".join("<tr>" + "".join(cell("td", v, self._numeric(v)) for v in row) + "</tr>"
                       for row in self.rows)
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def __str__(self) -> str:
        cells = [self.columns] + [[str(v) for v in row] for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        lines = ["  ".join(v.rjust(w) if self._numeric(v) else v.ljust(w)
                           for v, w in zip(row, widths)).rstrip() for row in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(([self.caption] if self.caption else []) + lines)

    __repr__ = __str__

