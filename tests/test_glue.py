"""The book's ``glue`` (inferlab.analysis.glue) displays what ``myst_nb.glue`` displays, which is
what myst-nb's ``{glue}`` role reads."""

import pytest

from inferlab.analysis import glue as ours


@pytest.mark.parametrize("value", [0.4375, 12, "two words", [1, 2.5], None])
@pytest.mark.parametrize("display", [False, True])
def test_the_book_s_glue_displays_what_myst_nb_s_does(monkeypatch, value, display):
    import IPython.display
    from myst_nb import glue as theirs
    from myst_nb.ext import glue as glue_module

    calls = []
    record = lambda *args, **kwargs: calls.append((args, kwargs))  # noqa: E731
    monkeypatch.setattr(IPython.display, "display", record)
    monkeypatch.setattr(glue_module, "ipy_display", record)
    theirs("x", value, display=display)
    ours.glue("x", value, display=display)
    assert len(calls) == 2 and calls[0] == calls[1]
    (bundle,), kwargs = calls[1]
    assert kwargs["metadata"]["scrapbook"] == {"name": "x",
                                               "mime_prefix": "" if display else ours.GLUE_PREFIX}
    assert all(k.startswith(kwargs["metadata"]["scrapbook"]["mime_prefix"]) for k in bundle)
    assert ours.GLUE_PREFIX == glue_module.GLUE_PREFIX
