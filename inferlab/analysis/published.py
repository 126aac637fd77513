"""Numbers the book quotes from papers, datasheets and blog posts, with where each was read.

A quoted number cannot be computed, but it can be kept in one place. ``data/published.csv``
has a row per quote: a key, its value(s), the unit, the bibliography key of its source and the
place in it (section, figure, table), the chapter that prints it and the exact ``text`` the
chapter prints. Chapters read values from here instead of typing them into code cells, and
``tests/test_published.py`` checks that every row's text appears in its chapter with the row's
numbers, that its source is in ``book/references.bib``, and, for every quote that the course's
formulas or tables can rebuild (a paper's own arithmetic, a model's parameter count), that the
rebuilt number agrees.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.data import read_table


@dataclass(frozen=True)
class Quote:
    key: str
    values: tuple[float, ...]   # one number, or the two ends of a range
    unit: str
    source: str                 # a key of book/references.bib
    where: str                  # section, figure or table of the source
    chapter: str                # the book page that prints it, e.g. "ch03_paged_attention"
    text: str                   # the words the page prints, numbers included

    @property
    def value(self) -> float:
        """The single value (the low end for a range)."""
        return self.values[0]


def quotes() -> dict[str, Quote]:
    """Every row of ``data/published.csv``, keyed by its key."""
    out = {}
    for row in read_table("published.csv"):
        key = row["key"]
        if key in out:
            raise ValueError(f"data/published.csv: key {key!r} appears twice")
        out[key] = Quote(key=key, values=tuple(float(v) for v in row["values"].split(";")),
                         unit=row["unit"], source=row["source"], where=row["where"],
                         chapter=row["chapter"], text=row["text"])
    return out


def quote(key: str) -> Quote:
    """One quote; an unknown key lists the known ones."""
    table = quotes()
    if key not in table:
        raise KeyError(f"no quote {key!r} in data/published.csv; known: {', '.join(table)}")
    return table[key]
