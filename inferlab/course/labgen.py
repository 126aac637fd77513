"""Generate the student labs (``labs/``) from the solved notebooks (``solutions/``).

The solved notebook is the single source. In a code cell, exercise code sits between the lines
``### BEGIN SOLUTION`` and ``### END SOLUTION`` inside a function body; the cell starts with a
comment ``# Exercise N.M: ...``. The lab gets a stub in its place that raises
``NotImplementedError`` naming the exercise, so the check after it falls back to the reference
and the lab still runs end to end. In a Markdown cell, an answer sits between
``<!-- BEGIN SOLUTION -->`` and ``<!-- END SOLUTION -->`` and becomes a prompt to write one.
An answer that depends on what the learner measured is a code cell starting ``# Worked answer``
that writes it from the numbers (say, with ``IPython.display.Markdown``); the lab gets the same
prompt in a Markdown cell in its place, so the cells of the two notebooks still line up.

The first code cell of every notebook is the Colab setup cell, rewritten here from
``_config.yml``'s ``repository.url`` so that the URL is defined once. Outputs are stripped from
both sets, so diffs stay readable.

    python -m inferlab.course.labgen            # rewrite solutions/ (setup cell, outputs) and labs/
    python -m inferlab.course.labgen --check    # exit 1 and list what is out of date; write nothing
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
MD_BEGIN, MD_END = "<!-- BEGIN SOLUTION -->", "<!-- END SOLUTION -->"
SETUP_FIRST_LINE = "# Setup: installs the course package in a fresh Colab runtime (never torch)."
MD_STUB = "*Write your answer here, then compare it with the solutions notebook.*"
WORKED_ANSWER = "# Worked answer"


class LabgenError(ValueError):
    """A solved notebook breaks the conventions the generator relies on."""


def repository_url(root: Path) -> str:
    """``repository.url`` from the book's ``_config.yml``: the one place the URL is defined."""
    import yaml

    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    try:
        return config["repository"]["url"].rstrip("/")
    except (KeyError, TypeError, AttributeError):
        raise LabgenError(f"{root / '_config.yml'} has no repository.url") from None


def setup_cell_source(repo_url: str) -> str:
    """The first code cell of every lab: install ``inferlab`` (and only it) where it is missing."""
    return (
        f"{SETUP_FIRST_LINE}\n"
        "# On your own machine, after the README's quick start (`pip install -e\n"
        "# \".[labs]\"` in the checkout), inferlab is already there and this cell does\n"
        "# nothing. The package asks for ranges of torch, numpy and matplotlib that\n"
        "# Colab's own copies satisfy, so pip keeps them.\n"
        "import importlib.util, subprocess, sys\n"
        "if importlib.util.find_spec(\"inferlab\") is None:\n"
        f"    package = \"inferlab @ git+{repo_url}\"\n"
        "    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"-q\", package],\n"
        "                   check=True)"
    )


def _stub_code(source: str, where: str) -> str:
    lines = source.split("\n")
    label = next((m.group(1) for line in lines
                  if (m := re.match(r"\s*#\s*(Exercise\s+[\w.]+)", line))), None)
    out, inside, last_def = [], False, None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if m := re.match(r"\s*def\s+(\w+)", line):
            last_def = m.group(1)
        if stripped.startswith(BEGIN):
            if inside:
                raise LabgenError(f"{where}: line {number} opens a solution inside another")
            if label is None:
                raise LabgenError(f"{where}: a cell with a solution must start with a comment "
                                  "'# Exercise N.M: ...'")
            indent = line[: len(line) - len(line.lstrip())]
            if not indent:
                raise LabgenError(f"{where}: line {number}: solutions must sit inside a function "
                                  "body, so the stub raises only when the check calls it")
            what = f"write the body of {last_def}()" if last_def else "write this part"
            out.append(f"{indent}# Your code here.")
            out.append(f"{indent}raise NotImplementedError(\"{label}: {what}\")")
            inside = True
        elif stripped.startswith(END):
            if not inside:
                raise LabgenError(f"{where}: line {number} closes a solution that was not opened")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise LabgenError(f"{where}: a solution is opened but never closed")
    return "\n".join(out)


def _stub_markdown(source: str, where: str) -> str:
    pattern = re.compile(re.escape(MD_BEGIN) + r".*?" + re.escape(MD_END), re.DOTALL)
    if source.count(MD_BEGIN) != source.count(MD_END):
        raise LabgenError(f"{where}: unbalanced {MD_BEGIN} / {MD_END}")
    return pattern.sub(MD_STUB, source)


def normalise(nb, repo_url: str, where: str):
    """The solved notebook as it is committed: no outputs, the setup cell from the config."""
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    if not code_cells or not code_cells[0].source.startswith(SETUP_FIRST_LINE.split(":")[0]):
        raise LabgenError(f"{where}: the first code cell must be the setup cell, starting "
                          f"with {SETUP_FIRST_LINE!r}")
    code_cells[0].source = setup_cell_source(repo_url)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    for key in ("widgets", "jupytext"):
        nb.metadata.pop(key, None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                 "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def make_lab(solution, where: str = "notebook"):
    """The student version of an already normalised solved notebook."""
    lab = nbformat.from_dict(solution)  # a deep copy
    for i, cell in enumerate(lab.cells):
        if cell.cell_type == "code" and cell.source.startswith(WORKED_ANSWER):
            lab.cells[i] = nbformat.v4.new_markdown_cell(MD_STUB)
            lab.cells[i].id = cell.get("id", lab.cells[i].id)
        elif cell.cell_type == "code":
            cell.source = _stub_code(cell.source, where)
        elif cell.cell_type == "markdown":
            cell.source = _stub_markdown(cell.source, where)
    first_md = next((c for c in lab.cells if c.cell_type == "markdown"), None)
    if first_md is None or not re.match(r"# Lab \d+ solutions: ", first_md.source):
        raise LabgenError(f"{where}: the first Markdown cell must start with "
                          "'# Lab N solutions: <title>'")
    first_md.source = re.sub(r"^# Lab (\d+) solutions: ", r"# Lab \1: ", first_md.source)
    return lab


def _dump(nb) -> str:
    return nbformat.writes(nb, version=4) + "\n"


def sync(root: Path, check: bool = False) -> list[str]:
    """Normalise ``solutions/`` and regenerate ``labs/``; return the files that were (or, with
    ``check``, would be) changed."""
    repo_url = repository_url(root)
    changed = []
    solutions = sorted((root / "solutions").glob("*.ipynb"))
    if not solutions:
        raise LabgenError(f"no notebooks in {root / 'solutions'}")
    expected_labs = set()
    for path in solutions:
        where = str(path.relative_to(root))
        solution = normalise(nbformat.read(path, as_version=4), repo_url, where)
        lab_path = root / "labs" / path.name
        expected_labs.add(lab_path)
        for target, nb in ((path, solution), (lab_path, make_lab(solution, where))):
            text = _dump(nb)
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                changed.append(str(target.relative_to(root)))
                if not check:
                    target.parent.mkdir(exist_ok=True)
                    target.write_text(text, encoding="utf-8")
    for stray in sorted((root / "labs").glob("*.ipynb")):
        if stray not in expected_labs:
            changed.append(f"{stray.relative_to(root)} (no solution: delete it)")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.course.labgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if labs/ or solutions/ are out of date")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    args = parser.parse_args(argv)
    try:
        changed = sync(args.root.resolve(), check=args.check)
    except LabgenError as error:
        print(f"labgen: {error}", file=sys.stderr)
        return 2
    if args.check and changed:
        print("out of date (run `python -m inferlab.course.labgen`):\n  " + "\n  ".join(changed))
        return 1
    for path in changed:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
