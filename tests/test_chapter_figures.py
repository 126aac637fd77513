"""Every figure the chapters draw passes ``figure_problems`` (no legend inside the axes or over
data or labels, no clipped or half-cut marker, no marker that no legend entry explains), checked
by the book build itself.

A chapter is executed once, by the build: a hidden cell after its imports turns on
``check_figures_as_shown``, which checks each figure as the page shows it, and a hidden last
cell asserts that nothing was found, so a chapter with an unreadable figure fails the build
(tests/test_book.py, and the README's build command). These tests hold every chapter to that
shape and show that the check sees the figures a kernel displays.
"""

import matplotlib

matplotlib.use("Agg")
import jupytext  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from inferlab.analysis.figures import check_figures_as_shown, legend_outside  # noqa: E402
from inferlab.course import catalog  # noqa: E402

CHAPTERS = catalog.toc_pages("chapter")  # every page of a chapter is executed on its own


@pytest.mark.parametrize("page", CHAPTERS)
def test_the_build_checks_every_figure_of_the_chapter(root, page):
    cells = [c for c in jupytext.read(root / f"{page}.md").cells if c.cell_type == "code"]
    turn_on = [i for i, c in enumerate(cells) if "= check_figures_as_shown()" in c.source]
    assert turn_on == [1], f"{page}: the second code cell (after the imports) turns the check on"
    if any("plt." in c.source for c in cells):  # a page that draws imports pyplot first
        assert "import matplotlib.pyplot" in cells[0].source, f"{page}: pyplot after the imports"
    last = cells[-1]
    assert last.source.startswith("assert not FIGURE_PROBLEMS"), f"{page}: no final assertion"
    for cell in (cells[1], last):
        assert "remove-cell" in cell.metadata.get("tags", []), f"{page}: the check is shown"


@pytest.mark.parametrize("chapter", list(catalog.chapters()))
def test_every_chapter_draws_figures(root, chapter):
    """A chapter split into pages draws its figures on some of them, not necessarily on each."""
    cells = [c for page in catalog.chapters(root)[chapter]
             for c in jupytext.read(root / f"{page}.md").cells if c.cell_type == "code"]
    drawn = sum("plt.subplots(" in c.source or "plt.figure(" in c.source or "plot_" in c.source
                for c in cells)
    assert drawn, f"{chapter} draws no figure"


def test_the_check_sees_each_figure_a_kernel_shows():
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib.figure import Figure

    shell = InteractiveShell.instance()
    png = shell.display_formatter.formatters["image/png"]
    shown = []
    png.for_type(Figure, lambda fig: shown.append(fig) or b"")  # as the inline backend does
    try:
        problems = check_figures_as_shown()
        fig, ax = plt.subplots()
        ax.plot([1, 2], [1, 2], label="a line")
        ax.legend(loc="center")
        ax.set_title("legend inside")
        shell.display_formatter.format(fig)
        good, ax = plt.subplots()
        ax.plot([1, 2], [1, 2], label="a line")
        legend_outside(ax)
        shell.display_formatter.format(good)
        assert len(shown) == 2                    # both still shown
        assert len(problems) == 1 and problems[0].startswith("figure 1 ('legend inside')")
        assert "inside the axes" in problems[0]
    finally:
        png.pop(Figure, None)
        InteractiveShell.clear_instance()
        plt.close("all")


def test_outside_a_kernel_the_check_changes_nothing():
    assert check_figures_as_shown() == []
