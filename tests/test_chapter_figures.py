"""Every figure the chapters draw passes ``figure_problems``: no legend over data or labels, no
clipped or half-cut marker, no marker that no legend entry explains.

Each chapter's code cells run here in order, in one namespace, with matplotlib's Agg backend;
after each cell every open figure is checked and closed. (The book build runs the same cells;
this test reads the figures it cannot see in the HTML.)
"""

import matplotlib

matplotlib.use("Agg")
import jupytext  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from inferlab.analysis.figures import figure_problems  # noqa: E402
from inferlab.course import catalog  # noqa: E402


def _chapters(root):
    return [p for p in catalog.toc_parts(root).get("Chapters", [])]


@pytest.mark.parametrize("index", range(9))
def test_every_figure_of_the_chapter_is_readable(root, index, monkeypatch):
    pages = _chapters(root)
    if index >= len(pages):
        pytest.skip("no such chapter")
    monkeypatch.chdir(root)
    nb = jupytext.read(root / f"{pages[index]}.md")
    namespace, problems, drawn = {"__name__": "__main__"}, [], 0
    plt.close("all")
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        exec(compile(cell.source, f"{pages[index]} cell {i}", "exec"), namespace)
        for num in plt.get_fignums():
            drawn += 1
            problems += [f"cell {i}: {p}" for p in figure_problems(plt.figure(num))]
        plt.close("all")
    assert drawn, f"{pages[index]} drew no figure"
    assert not problems, "\n".join(problems)
