"""What a reader of a chapter sees is code that teaches: the cells that only hand numbers to the
prose (myst-nb ``glue``) are removed from the page, and shown cells do not end in a run of such
hand-offs that could sit in a hidden cell of their own.

These read the chapters' sources, with no build: the built site's own checks (figures at their
size, no output wider than the column) are in tests/test_site.py.
"""

import ast

import jupytext
import pytest

from inferlab.course import catalog

HIDDEN = {"remove-cell", "remove-input", "remove_cell", "remove_input"}


def _is_glue(stmt: ast.stmt) -> bool:
    """A ``glue(...)`` call, or a loop that does nothing but glue."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "glue"
    if isinstance(stmt, (ast.For, ast.If)) and not stmt.orelse:
        return all(_is_glue(s) for s in stmt.body)
    return False


def _quiet_glue(stmt: ast.stmt) -> bool:
    """A glue that shows nothing where it runs (``display=False``): only the prose uses it."""
    calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "glue"]
    return _is_glue(stmt) and all(
        any(k.arg == "display" and getattr(k.value, "value", None) is False for k in c.keywords)
        for c in calls)


def _shown_cells(page):
    for cell in jupytext.read(page).cells:
        if cell.cell_type == "code" and not HIDDEN & set(cell.metadata.get("tags", [])):
            yield cell.source, ast.parse(cell.source).body


@pytest.mark.parametrize("page", catalog.toc_pages("chapter"))
def test_cells_that_only_glue_are_hidden(root, page):
    shown = [src for src, body in _shown_cells(root / f"{page}.md")
             if body and all(_is_glue(s) for s in body)]
    assert not shown, f"{page}: cells that only call glue() are shown:\n" + "\n---\n".join(shown)


@pytest.mark.parametrize("page", catalog.toc_pages("chapter"))
def test_shown_cells_do_not_end_in_glue_hand_offs(root, page):
    """A shown cell's last statements are not quiet glue calls: those move to a hidden cell
    after it (tags: [remove-cell]), which runs at the same point, so the prose gets the same
    numbers."""
    found = [src.splitlines()[-1] for src, body in _shown_cells(root / f"{page}.md")
             if body and _quiet_glue(body[-1])]
    assert not found, f"{page}: shown cells end with glue: {found}"


def test_the_checks_see_glue_only_cells_and_trailing_glue():
    body = ast.parse('glue("a", 1, display=False)\nfor k in "xy":\n    glue(k, 2, display=False)\n'
                     ).body
    assert all(_is_glue(s) for s in body) and _quiet_glue(body[-1])
    mixed = ast.parse('print(1)\nglue("a", 1)\n').body
    assert not all(_is_glue(s) for s in mixed) and _is_glue(mixed[-1])
    assert not _quiet_glue(mixed[-1])   # a glue that displays its value belongs where it is


# --- Printed output that fits the column ---------------------------------------------------

def test_printed_prose_is_wrapped_to_the_column_and_table_rows_are_not():
    import io

    from inferlab.analysis.column import OUTPUT_CHARS, Table, _WrappingStream, wrap_line

    long = "  H100 SXM at $6.88/h (AWS, 2026-11-09, secondary): " + "an offering, " * 8
    wrapped = wrap_line(long).split("\n")
    assert len(wrapped) > 1 and all(len(line) <= OUTPUT_CHARS for line in wrapped)
    assert wrapped[1].startswith("      ")            # its indent, and four more
    assert " ".join(" ".join(wrapped).split()) == " ".join(long.split())   # nothing lost
    assert wrap_line("short") == "short"
    sink = io.StringIO()
    stream = _WrappingStream(sink, OUTPUT_CHARS)
    print(long.rstrip(), "x", file=stream, end="")    # one line written in pieces
    assert sink.getvalue() == ""
    stream.write("\nnext\n")
    stream.write("100 %")                             # a line not ended yet goes out on flush
    stream.flush()
    lines = sink.getvalue().split("\n")
    assert max(map(len, lines)) <= OUTPUT_CHARS and lines[-2:] == ["next", "100 %"]
    # A table's rows stay whole however wide (Lab 1's sweep broke mid-row, "ms/token" alone on a
    # line): a table wider than the column is shown as a Table, not cut into pieces.
    row = "B=   16  " + "  ".join(f"{x:9.1f} us" for x in range(8))
    header = "batch  " + "  ".join(f"time {i} (ms/token)" for i in range(5))
    table = str(Table([[str(i), "x" * 30, "y" * 30, "z" * 10] for i in range(3)], list("abcd")))
    for line in [row, header, *table.splitlines()]:
        assert wrap_line(line) == line, line
    assert min(len(line) for line in [row, header, *table.splitlines()[1:]]) > OUTPUT_CHARS
    sink = io.StringIO()
    stream = _WrappingStream(sink, OUTPUT_CHARS)
    print(table, file=stream)
    assert sink.getvalue() == table + "\n"
    # A listing whose rows end in a sentence (Chapter 7's goodput per design) keeps its first
    # columns whole and wraps the sentence under itself, as a table wraps its last column.
    listing = [f"  {name:10s} {rate:5.2f} req/s per GPU ({rate * 4:6.2f} for the cluster; "
               "7 rates tried; at the answer 96% within the SLO over 1,234 requests)"
               for name, rate in (("colocated", 0.51), ("1P3D", 3.4))]
    for row, rate in zip(listing, ("0.51", "3.40")):
        lines, cell = wrap_line(row).split("\n"), row.index(rate)   # where the second cell starts
        assert len(lines) > 1 and max(map(len, lines)) <= OUTPUT_CHARS
        assert lines[0].startswith(row[:cell + 4])
        assert all(len(line) - len(line.lstrip()) == cell for line in lines[1:]), lines


def test_a_table_is_html_in_a_notebook_and_aligned_text_when_printed():
    from inferlab.analysis.column import Table

    table = Table([{"device": "H100 SXM", "TB/s": "3.35"}, {"device": "B200", "TB/s": "8.00"}])
    html = table._repr_html_()
    assert html.count("<tr>") == 3 and ">TB/s</th>" in html
    assert 'style="text-align: right">3.35' in html and 'style="text-align: left">B200' in html
    assert '<th style="text-align: right">TB/s</th>' in html
    lines = str(table).splitlines()
    assert lines[0].split() == ["device", "TB/s"] and lines[2].endswith("3.35")
    assert len({len(line) for line in lines}) == 1    # columns aligned
