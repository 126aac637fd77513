"""The glossary: every entry gives its Korean term beside the English one, and every term the
book links to is defined (the build would warn too, but this says which)."""

import re
from pathlib import Path

HANGUL = re.compile("[\uac00-\ud7a3]")


def _entries(root: Path) -> dict[str, str]:
    text = (root / "book" / "glossary.md").read_text(encoding="utf-8")
    block = text.split("```{glossary}", 1)[1].split("```", 1)[0]
    entries, term = {}, None
    for line in block.splitlines():
        if line and not line[0].isspace() and not line.startswith(":"):
            term = line.strip()
            entries[term] = ""
        elif term is not None and line.strip():
            entries[term] += line.strip() + " "
    return entries


def test_every_entry_gives_the_korean_term_first(root):
    entries = _entries(root)
    assert len(entries) >= 30
    for term, definition in entries.items():
        korean = definition.split(")", 1)[0]
        assert definition.startswith("(") and HANGUL.search(korean), \
            f"{term!r}: the definition must open with the Korean term in parentheses"


def test_every_linked_term_is_defined(root):
    defined = {t.lower() for t in _entries(root)}
    pages = [*root.glob("book/*.md"), *root.glob("book/*.ipynb"), *root.glob("labs/*.ipynb"),
             *root.glob("solutions/*.ipynb")]
    missing = set()
    for page in pages:
        for m in re.finditer(r"\{term\}`([^`]+)`", page.read_text(encoding="utf-8")):
            target = m.group(1)
            target = re.match(r".*<(.+)>$", target).group(1) if target.endswith(">") else target
            if target.strip().lower() not in defined:
                missing.add(f"{page.relative_to(root)}: {target}")
    assert not missing, sorted(missing)
