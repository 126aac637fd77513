"""``glue``: hand a value computed on a page to its prose, as ``myst_nb.glue`` does.

The book's pages pass numbers to their text with myst-nb's ``{glue}`` role, which reads what
``myst_nb.glue`` displayed: the value's display bundle, its MIME types prefixed with
``application/papermill.record/`` unless it is shown, and ``scrapbook`` metadata naming it. This
function displays exactly that, with the same IPython formatter. The one difference is what it
imports: ``myst_nb.glue`` imports nbformat on its first call, nbformat imports jsonschema, and
jsonschema's non-GPL format checkers (``rfc3987-syntax`` 1.1) compile about 39 Earley grammars
as they are imported, 3 to 4 s of every page that glues a value (jsonschema issue 1428;
opendatahub-io/notebooks issue 3532 measures the same chain). ``tests/test_glue.py`` checks
that both display the same thing.
"""

from __future__ import annotations

from typing import Any

GLUE_PREFIX = "application/papermill.record/"  # myst_nb.ext.glue.GLUE_PREFIX


def glue(name: str, variable: Any, display: bool = True) -> None:
    """Store ``variable``'s display under ``name`` for the page's ``{glue}`` roles; ``display``
    also shows it in the cell's output."""
    from IPython.core.formatters import format_display_data
    from IPython.display import display as ipy_display

    bundle, metadata = format_display_data(variable)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = dict(name=name, mime_prefix=prefix)
    ipy_display({prefix + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)
