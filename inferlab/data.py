"""Where the course's data tables live, and a small CSV reader for them.

In a checkout (or an editable install) the tables are the repository's top-level ``data/``
folder. A wheel built from the repository carries a copy inside the package as
``inferlab/data`` (see ``pyproject.toml``), which is what a Colab user gets from
``pip install git+...``. ``data_path`` finds whichever is present.
"""

from __future__ import annotations

import csv
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_path(*parts: str) -> Path:
    """Path of a file under the course's ``data/`` folder, e.g. ``data_path("hardware.csv")``."""
    for root in (_PACKAGE_DIR / "data", _PACKAGE_DIR.parent / "data"):
        if (root / "hardware.csv").is_file():
            path = root.joinpath(*parts)
            if not path.exists():
                raise FileNotFoundError(f"{path} does not exist; files in {root}: "
                                        f"{sorted(p.name for p in root.iterdir())}")
            return path
    raise FileNotFoundError(
        "inferlab cannot find its data tables: neither the installed copy "
        f"({_PACKAGE_DIR / 'data'}) nor a checkout's data/ folder "
        f"({_PACKAGE_DIR.parent / 'data'}) exists. Reinstall the package with pip."
    )


def read_table(name: str) -> list[dict[str, str]]:
    """Rows of ``data/<name>`` as dictionaries of strings (empty cells are ``""``)."""
    with open(data_path(name), newline="", encoding="utf-8") as f:
        return [dict(row) for row in csv.DictReader(f)]
