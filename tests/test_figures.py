"""The plotting helpers draw figures a reader can read: no legend over data, no clipped or
half-cut markers, every marker style explained, log axes labelled with plain numbers, and the
timeline's time labels under every panel. ``figure_problems`` is the check; the first tests
plant each fault and show that it catches it."""


import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from inferlab.analysis.capacity import plot_capacity  # noqa: E402
from inferlab.analysis.explore import plot_explorer  # noqa: E402
from inferlab.analysis.figures import figure_problems, legend_outside, plain_log_ticks  # noqa: E402
from inferlab.analysis.roofline import Roof, plot_roofline  # noqa: E402
from inferlab.serving.iteration import Forward, Iteration, Row  # noqa: E402
from inferlab.sim.plots import plot_latency_throughput, plot_timeline  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _tick_texts(ax, axis="y"):
    ax.figure.canvas.draw()
    ticks = ax.get_yticklabels() if axis == "y" else ax.get_xticklabels()
    return [t.get_text() for t in ticks if t.get_text()]


def test_the_check_catches_a_legend_over_data():
    fig, ax = plt.subplots()
    ax.plot(range(10), [5] * 10, label="flat line through the middle")
    ax.legend(loc="center")
    assert any("legend covers" in p for p in figure_problems(fig))
    ax.get_legend().remove()
    legend_outside(ax)
    assert figure_problems(fig) == []


def test_the_check_refuses_a_legend_inside_the_axes_whatever_the_data():
    # measured data move from run to run: a legend inside the axes that misses them today can
    # cover them tomorrow, so the place itself is the fault, with or without an overlap now
    fig, ax = plt.subplots()
    ax.plot(range(10), [0] * 10, label="a line along the bottom")
    ax.legend(loc="upper right")
    assert any("inside the axes" in p for p in figure_problems(fig))
    fig, (a, b) = plt.subplots(1, 2)
    a.plot([1, 2], [1, 2], label="left panel")
    legend_outside(a)                      # outside its own axes but over the right panel
    assert any("inside the axes" in p for p in figure_problems(fig))


def test_the_check_catches_clipped_and_cut_markers():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 2, 3], "o-", label="points")
    ax.set_ylim(0, 3)                      # the last marker's centre sits on the frame
    legend_outside(ax)
    assert any("cut by its frame" in p for p in figure_problems(fig))
    ax.set_ylim(0, 2.5)                    # now it lies outside
    assert any("outside the axes" in p for p in figure_problems(fig))


def test_the_check_catches_a_marker_no_legend_explains():
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2], "-", label="a line")
    ax.plot([1.5], [1.2], "kx")
    legend_outside(ax)
    assert any("no legend entry" in p for p in figure_problems(fig))


def test_plain_log_ticks_never_print_powers_of_ten():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [6, 20, 45])
    ax.set_yscale("log")
    plain_log_ticks(ax, "y")
    labels = _tick_texts(ax)
    assert labels and not any("10^" in t or "times" in t or "\\times" in t for t in labels)
    assert {"10", "20", "30", "40"} <= set(labels)


def test_roofline_plot_is_clean():
    ax = plot_roofline([Roof("a", 1e15, 3e12), Roof("b", 3e14, 2e12)],
                       [(1.0, 3e12, "decode"), (1000.0, 1e15, "prefill")], xlim=(0.3, 5000))
    assert figure_problems(ax.figure) == []


def test_capacity_plot_keeps_every_model_visible_and_uncut():
    ax = plot_capacity()
    assert figure_problems(ax.figure) == []
    styles = {(line.get_linestyle(), line.get_marker()) for line in ax.get_lines()}
    assert len(styles) == len(ax.get_lines())     # two models with equal counts stay distinct
    labels = _tick_texts(ax)
    assert "1,000" in labels or "100" in labels


def test_explorer_plot_is_clean():
    fig = plot_explorer()
    fig = fig if hasattr(fig, "canvas") else fig.figure if hasattr(fig, "figure") else plt.gcf()
    assert figure_problems(fig) == []


def _iteration(start, prefills=(), decode=(), padding=(), preempted=(), decode_s=0.01):
    forwards = [Forward((Row(sid, n, 0, True),), s) for sid, n, s in prefills]
    forwards.append(Forward(tuple(Row(sid, 1, 8, False) for sid in [*decode, *padding]),
                            decode_s))
    return Iteration(start, tuple(forwards), tuple(preempted), 0, tuple(padding))


def test_timeline_explains_its_bar_styles_and_labels_every_panel():
    log = [_iteration(0.0, prefills=[(0, 8, 0.005), (1, 8, 0.005)], decode=[0, 1]),
           _iteration(0.02, decode=[0], padding=[1]),
           _iteration(0.03, decode=[2], prefills=[(2, 4, 0.002)], preempted=[0])]
    fig, axes = plt.subplots(2, 1, sharex=True, figsize=(9, 4))
    for ax in axes:
        plot_timeline(log, ax, title="t")
    fig.tight_layout()
    for ax in axes:
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any("prefill" in t for t in texts) and any("padding" in t for t in texts)
        assert any("preempted" in t for t in texts)
        assert _tick_texts(ax, "x"), "a panel of a shared axis lost its time labels"
    assert figure_problems(fig) == []


def test_latency_throughput_plot_has_plain_ticks():
    ax = plot_latency_throughput({"static": [(300, 10.5), (1000, 19), (1900, 45)],
                                  "continuous": [(300, 5.5), (2000, 10), (4000, 18)]})
    labels = _tick_texts(ax)
    assert labels and not any("times" in t or "^" in t for t in labels)
    assert figure_problems(ax.figure) == []


def test_every_legend_of_the_book_and_labs_is_placed_outside_the_axes(root):
    # The chapters' figures are checked as drawn (tests/test_chapter_figures.py); the labs'
    # figures show what the learner's machine measured, which no test can draw in advance, so
    # their legends are held to the helpers that put them outside the axes.
    import re

    import jupytext

    pattern = re.compile(r"\b(?!fig\b)\w+(?:\[\d\])?\.legend\(")
    found = []
    for path in sorted([*root.glob("solutions/*.ipynb"), *root.glob("book/*.md"),
                        *root.glob("book/*.ipynb")]):
        nb = jupytext.read(path)
        for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
            found += [f"{path.name} code cell {i}: {line.strip()}"
                      for line in cell.source.splitlines() if pattern.search(line)]
    assert not found, "legends placed inside the axes:\n" + "\n".join(found)


# --- Sized for the column: figures fitted to the site's ~700 pixels, no powers of ten -----

def test_a_wide_figure_is_fitted_to_the_column_with_its_text_kept():
    from inferlab.analysis.column import COLUMN_PX, fit_to_column, shown_width_px, use_course_style

    use_course_style()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, name in ((left, "a panel with a rather long title, as the chapters write them"),
                     (right, "another panel, with a legend beside it")):
        ax.plot([1, 10, 100], [1e12, 3e12, 9e12], label="a line with a long legend label")
        ax.set(xscale="log", yscale="log", title=name, xlabel="x", ylabel="FLOP/s")
        legend_outside(ax)
    fig.suptitle("A figure title that is much longer than a 700-pixel column can hold on one line")
    assert shown_width_px(fig) > 1.3 * COLUMN_PX
    size = left.xaxis.label.get_fontsize()
    fit_to_column(fig)
    assert shown_width_px(fig) <= COLUMN_PX
    assert left.xaxis.label.get_fontsize() == size          # narrowed, not scaled down
    assert figure_problems(fig) == []                       # legends moved under the panels
    assert "1 T" in _tick_texts(left) or "10 T" in _tick_texts(left)


def test_the_check_catches_powers_of_ten_and_offsets():
    fig, ax = plt.subplots()
    ax.plot([1, 10, 1000], [1, 5, 9])
    ax.set_xscale("log")                       # matplotlib labels it 10^0, 10^1, ...
    assert any("powers of ten" in p for p in figure_problems(fig))
    plain_log_ticks(ax, "x")
    assert figure_problems(fig) == []
    fig, ax = plt.subplots()
    ax.plot([1e12 + 1, 1e12 + 2], [1, 2])      # a "+1e12" offset over the x axis
    assert any("powers of ten" in p for p in figure_problems(fig))


def test_plain_log_ticks_use_unit_prefixes_past_a_million():
    fig, ax = plt.subplots()
    ax.plot([1, 10], [1e11, 2e15])
    ax.set_yscale("log")
    plain_log_ticks(ax, "y")
    labels = _tick_texts(ax)
    assert "1 T" in labels and "1,000 T" in labels and not any("^" in t for t in labels)


def test_every_page_that_draws_uses_the_course_style(root):
    """Chapters, the calculators and the solved labs draw with use_course_style, which fits each
    figure they show to the column (the chapters' figures are then checked as shown)."""
    import jupytext

    from inferlab.course import catalog

    pages = [root / f"{p}.md" for p in catalog.toc_pages("chapter", root)]
    pages += [root / "book" / "calculators.ipynb", *sorted(root.glob("solutions/*.ipynb"))]
    missing = []
    for path in pages:
        cells = [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]
        draws = any("plt." in c or "plot_" in c for c in cells)
        styled = [i for i, c in enumerate(cells) if "\nuse_course_style()" in "\n" + c]
        if draws and not (styled and styled[0] <= 2):
            missing.append(path.name)
        assert "figure.dpi" not in "".join(cells), f"{path.name} sets its own dpi"
    assert not missing, f"draw figures without use_course_style() in their first cells: {missing}"
