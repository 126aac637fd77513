"""What a learner opens agrees with itself and with what they are told to run.

- Notebooks a learner opens outside the book (labs, solutions, the calculators) carry no MyST
  markup: Colab and Jupyter show ``{term}`...``` as raw text.
- Every lab uses one set of exercise labels: its text, its exercise cells and stubs, the tags its
  checks print, the grader's list (the checks' docstrings) and the instructor guide.
- The commands the setup page and the README tell a learner to run exist once the one install
  command (``python -m pip install -r requirements.txt``) has run.
"""

import contextlib
import importlib
import importlib.metadata as metadata
import io
import re
import shutil

import nbformat
import pytest

from inferlab.course import catalog, results

ROLE = re.compile(r"\{[A-Za-z][\w:+-]*\}`|^\s*(?:```|:::)\{[\w-]+\}|^\s*\([\w-]+\)=\s*$", re.M)
LABEL = r"\d+\.\d+[a-z]?"
MENTION = re.compile(rf"Exercises?\s+({LABEL}(?:\s*,\s*{LABEL})*(?:,?\s+and\s+{LABEL})?)")


def learner_notebooks(root):
    return sorted([*root.glob("labs/*.ipynb"), *root.glob("solutions/*.ipynb"),
                   *root.glob("book/*.ipynb")])


def myst_markup(nb) -> list[str]:
    found = []
    for i, cell in enumerate(nb.cells):
        for m in ROLE.finditer(cell.source):
            found.append(f"cell {i + 1}: {m.group(0).strip()}")
    return found


def test_the_markup_detector_finds_roles_directives_and_targets():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("the {term}`KV cache`, a {cite:p}`kwon2023`"),
                nbformat.v4.new_markdown_cell("```{note}\nhi\n```\n(grading)=\n# Title"),
                nbformat.v4.new_markdown_cell("plain *KV cache*, $x_{i}$, `f(x)`, {'a': 1}")]
    assert myst_markup(nb) == ["cell 1: {term}`", "cell 1: {cite:p}`", "cell 2: ```{note}",
                               "cell 2: (grading)="]


@pytest.mark.parametrize("name", ["labs", "solutions", "book"])
def test_notebooks_learners_open_contain_no_myst_markup(root, name):
    notebooks = [p for p in learner_notebooks(root) if p.parent.name == name]
    assert notebooks
    problems = {p.relative_to(root).as_posix(): myst_markup(nbformat.read(p, as_version=4))
                for p in notebooks}
    assert not {k: v for k, v in problems.items() if v}, (
        "MyST roles and directives show as raw text in Colab and Jupyter; write plain Markdown")


def mentioned_labels(text: str) -> set[str]:
    return {label for m in MENTION.finditer(text) for label in re.findall(LABEL, m.group(1))}


def test_label_mentions_are_parsed():
    assert mentioned_labels("Exercises 1.1a and 1.1b, then Exercise 1.2. See Exercises 3.1, "
                            "3.2, and 3.3; Exercise 4.4: x") == {"1.1a", "1.1b", "1.2", "3.1",
                                                                  "3.2", "3.3", "4.4"}


def printed_labels(module: str) -> dict[str, str]:
    """{check function: the label its [TODO] line prints}, asking each check with a stub."""
    checks = importlib.import_module(f"inferlab.course.checks.{module}")

    def not_attempted(*args, **kwargs):
        raise NotImplementedError

    out = {}
    for function in results.exercises_of(module):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            getattr(checks, function)(not_attempted)
        m = re.match(rf"\[TODO\] Exercise ({LABEL}):", printed.getvalue())
        out[function] = m.group(1) if m else printed.getvalue()
    return out


@pytest.mark.parametrize("lab", catalog.labs(), ids=lambda lab: lab.stem)
def test_one_set_of_exercise_labels_per_lab(root, lab):
    labels = results.exercises_of(lab.check_module)  # what the grader and the guide list
    assert labels and len(set(labels.values())) == len(labels)
    assert printed_labels(lab.check_module) == labels, "the tags the checks print"
    # Every check is called by a check cell of the lab, which is what the grader checks.
    assert set(catalog.exercise_names(lab.check_module)) == set(labels)
    for path in (lab.lab, lab.solution):
        nb = nbformat.read(path, as_version=4)
        where = path.relative_to(root).as_posix()
        markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        assert mentioned_labels(markdown) <= set(labels.values()), where
        for label in labels.values():
            assert label in mentioned_labels(markdown), f"{where}: the text never sets {label}"
        headers = [m.group(1) for s in code for m in [re.match(rf"#\s*Exercise\s+({LABEL}):", s)] if m]
        assert sorted(headers) == sorted(labels.values()), f"{where}: exercise cells"
        stubs = set(re.findall(rf'NotImplementedError\("Exercise ({LABEL}):', "\n".join(code)))
        assert stubs <= set(labels.values()), where
        if path == lab.lab:
            assert stubs == set(labels.values()), f"{where}: every exercise has a stub"


def test_the_instructor_guide_names_only_labels_the_labs_have(root):
    known = {label for lab in catalog.labs(root) for label in
             results.exercises_of(lab.check_module).values()}
    guide = (root / "book" / "instructor_guide.md").read_text(encoding="utf-8")
    prose = re.sub(r"```.*?```", "", guide, flags=re.S)  # not the grader's sample output
    assert mentioned_labels(prose) and mentioned_labels(prose) <= known


COMMAND = re.compile(r"^(?:\$\s*)?(jupyter(?:-\w+)?(?:\s+[\w-]+)?|python -m [\w.]+)")


def commands_in(text: str) -> set[str]:
    """The commands a page tells the reader to run: shell lines in code blocks and inline code."""
    spans = re.findall(r"```(?:bash|text|console|shell)?\n(.*?)```", text, re.S)
    spans += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    found = set()
    for span in spans:
        for line in span.splitlines():
            for part in re.split(r"&&|;", line):
                if m := COMMAND.match(part.strip()):
                    found.add(" ".join(m.group(1).split()[:3]))
    return found


def _pinned(root) -> set[str]:
    names = set()
    for line in (root / "requirements.txt").read_text(encoding="utf-8").splitlines():
        if m := re.match(r"\s*([A-Za-z0-9_.-]+)\s*(==|>=|<|~=)", line):
            names.add(re.sub(r"[-_.]+", "-", m.group(1)).lower())
    return names


def _distribution_of_script(script: str) -> str | None:
    for dist in metadata.distributions():
        if any(ep.group == "console_scripts" and ep.name == script for ep in dist.entry_points):
            return re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
    return None


def provided(command: str, root) -> str | None:
    """Why ``command`` would fail after the one install command, or None if it would run."""
    pinned = _pinned(root)
    words = command.split()
    if words[:2] == ["python", "-m"]:
        top = words[2].split(".")[0]
        if top == "inferlab":  # the checkout itself: requirements.txt ends in "-e ."
            ok = "-e ." in (root / "requirements.txt").read_text(encoding="utf-8")
            return None if ok and importlib.util.find_spec(words[2]) else f"{words[2]} missing"
        dists = {re.sub(r"[-_.]+", "-", d).lower()
                 for d in metadata.packages_distributions().get(top, [])}
        if importlib.util.find_spec(top) is None:
            return f"no module {top} in this environment"
        return None if dists & pinned else f"{top} comes from {dists or 'nothing'}, not pinned"
    script = words[0] if words[0] != "jupyter" or len(words) == 1 else f"jupyter-{words[1]}"
    if shutil.which(script) is None:
        return f"no {script} on PATH"
    dist = _distribution_of_script(script)
    return None if dist in pinned else f"{script} comes from {dist}, which requirements.txt lacks"


def test_command_finder_and_provider(root):
    assert commands_in("Run\n```bash\npython -m pip install -r x && jupyter-book build .\n```\n"
                       "then `jupyter lab labs/01.ipynb` or `python -m pytest`.") == {
        "python -m pip", "jupyter-book build", "jupyter lab", "python -m pytest"}
    assert provided("jupyter nonexistentthing", root) is not None
    assert provided("python -m nonexistent_module_x", root) is not None


@pytest.mark.parametrize("page", ["book/setup.md", "README.md", "MAINTAINING.md"])
def test_every_command_a_page_names_exists_after_the_install(root, page):
    commands = commands_in((root / page).read_text(encoding="utf-8"))
    assert commands
    missing = {c: why for c in sorted(commands) if c not in ("python -m pip", "python -m venv")
               and (why := provided(c, root))}
    assert not missing, f"{page} names commands the pinned environment does not give: {missing}"
