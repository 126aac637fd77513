"""Keep launch buttons (Colab, Binder) only on pages whose source is a real notebook.

sphinx-book-theme adds a launch button to every page that has code cells, including MyST
Markdown chapters; for those it would send Colab to the ``.md`` file in the repository, which
Colab cannot open. The labs, solutions and calculators are ``.ipynb`` and keep their buttons;
chapter pages keep the download button, which offers the executed ``.ipynb``.
"""

from pathlib import Path


def _drop_launch_buttons(app, pagename, templatename, context, doctree):
    if Path(app.env.doc2path(pagename)).suffix == ".ipynb":
        return
    buttons = context.get("header_buttons")
    if buttons:
        context["header_buttons"] = [b for b in buttons if b.get("label") != "launch-buttons"]


def setup(app):
    # sphinx-book-theme adds the buttons at priority 501; run after it.
    app.connect("html-page-context", _drop_launch_buttons, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
