"""Show a solved lab's code without the lines that only the lab generator reads.

In ``solutions/``, an exercise's code sits between ``### BEGIN SOLUTION`` and
``### END SOLUTION`` so that ``python -m inferlab.course.labgen`` can cut it out of the student
lab. On the site those two lines are noise: this extension drops them from the code blocks of
the solution pages (the notebooks themselves keep them).
"""

from docutils import nodes

MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def without_markers(code: str) -> str:
    """``code`` less the lines that are exactly a marker (indentation aside)."""
    return "\n".join(line for line in code.split("\n") if line.strip() not in MARKERS)


def _drop_markers(app, doctree):
    if not app.env.docname.startswith("solutions/"):
        return
    for block in doctree.findall(nodes.literal_block):
        text = block.astext()
        if any(m in text for m in MARKERS):
            clean = without_markers(text)
            block.children = [nodes.Text(clean)]
            block.rawsource = clean


def setup(app):
    app.connect("doctree-read", _drop_markers)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
