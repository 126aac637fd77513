"""The notebook pipeline: labs/ is generated from solutions/ and must not drift from it."""

import json
import re

import nbformat
import pytest

from inferlab.course import labgen


def test_labs_and_solutions_are_in_sync(root):
    changed = labgen.sync(root, check=True)
    assert not changed, ("out of date; run `python -m inferlab.course.labgen` and commit: "
                         + ", ".join(changed))


def test_committed_notebooks_carry_no_outputs(root):
    for path in sorted((root / "solutions").glob("*.ipynb")) + sorted((root / "labs").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, path.name


def test_every_lab_has_a_solution_and_stubs_for_every_exercise(root):
    for solution_path in sorted((root / "solutions").glob("*.ipynb")):
        solution = nbformat.read(solution_path, as_version=4)
        lab = nbformat.read(root / "labs" / solution_path.name, as_version=4)
        regions = sum(c.source.count(labgen.BEGIN) for c in solution.cells)
        stubs = sum(c.source.count("raise NotImplementedError(\"Exercise") for c in lab.cells)
        assert regions > 0 and stubs == regions, solution_path.name
        joined = "\n".join(c.source for c in lab.cells)
        assert labgen.BEGIN not in joined and labgen.MD_BEGIN not in joined


def test_setup_cell_installs_only_inferlab_from_the_configured_repository(root):
    url = labgen.repository_url(root)
    assert url.startswith("https://github.com/")
    for path in sorted((root / "labs").glob("*.ipynb")) + sorted((root / "book").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        setup = next(c for c in nb.cells if c.cell_type == "code").source
        assert setup == labgen.setup_cell_source(url), path.name
        assert '"install", "-q", package]' in setup
        installs = re.findall(r'package = "([^"]+)"', setup)
        assert installs == [f"inferlab @ git+{url}"]
        assert "torch" not in installs[0]


def _solution(cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Lab 9 solutions: Toy"),
                nbformat.v4.new_code_cell(labgen.SETUP_FIRST_LINE)] + cells
    return labgen.normalise(nb, "https://github.com/x/y", "toy.ipynb")


def test_stub_replaces_the_region_and_names_the_exercise():
    code = ("# Exercise 9.1: double it.\ndef double(x):\n    y = 1\n    ### BEGIN SOLUTION\n"
            "    return 2 * x\n    ### END SOLUTION\n")
    lab = labgen.make_lab(_solution([nbformat.v4.new_code_cell(code),
                                     nbformat.v4.new_markdown_cell(
                                         "Q?\n<!-- BEGIN SOLUTION -->\nsecret\n<!-- END SOLUTION -->")]))
    assert lab.cells[0].source == "# Lab 9: Toy"
    assert lab.cells[2].source == ("# Exercise 9.1: double it.\ndef double(x):\n    y = 1\n"
                                   "    # Your code here.\n"
                                   "    raise NotImplementedError(\"Exercise 9.1: write the body of double()\")\n")
    assert "secret" not in lab.cells[3].source and labgen.MD_STUB in lab.cells[3].source
    namespace = {}
    exec(lab.cells[2].source, namespace)
    with pytest.raises(NotImplementedError, match="Exercise 9.1"):
        namespace["double"](3)


def test_a_worked_answer_written_from_measurements_becomes_a_prompt():
    worked = "# Worked answer: Q1.\nprint(f'you measured {share:.0%}')"
    lab = labgen.make_lab(_solution([nbformat.v4.new_markdown_cell("**Q1.** Why?"),
                                     nbformat.v4.new_code_cell(worked)]))
    assert len(lab.cells) == 4  # the cells still line up with the solution's
    assert lab.cells[3].cell_type == "markdown" and lab.cells[3].source == labgen.MD_STUB
    assert all("share" not in c.source for c in lab.cells)


@pytest.mark.parametrize("code, message", [
    ("def f():\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION", "must start with a comment"),
    ("# Exercise 9.2\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION", "inside a function body"),
    ("# Exercise 9.2\ndef f():\n    ### BEGIN SOLUTION\n    pass", "never closed"),
    ("# Exercise 9.2\ndef f():\n    ### END SOLUTION", "not opened"),
])
def test_broken_conventions_are_reported(code, message):
    with pytest.raises(labgen.LabgenError, match=message):
        labgen.make_lab(_solution([nbformat.v4.new_code_cell(code)]))


def test_missing_setup_cell_or_title_is_reported():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Lab 1 solutions: x"), nbformat.v4.new_code_cell("import torch")]
    with pytest.raises(labgen.LabgenError, match="setup cell"):
        labgen.normalise(nb, "https://github.com/x/y", "x.ipynb")
    nb.cells = [nbformat.v4.new_markdown_cell("# A title"), nbformat.v4.new_code_cell(labgen.SETUP_FIRST_LINE)]
    with pytest.raises(labgen.LabgenError, match="Lab N solutions"):
        labgen.make_lab(labgen.normalise(nb, "https://github.com/x/y", "x.ipynb"))


def test_check_mode_reports_drift_without_writing(tmp_path, root):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "labs").mkdir()
    (tmp_path / "_config.yml").write_text("repository:\n  url: https://github.com/x/y\n")
    source = root / "solutions" / "01_roofline.ipynb"
    (tmp_path / "solutions" / source.name).write_text(source.read_text())
    assert labgen.main(["--check", "--root", str(tmp_path)]) == 1
    assert not (tmp_path / "labs" / source.name).exists()
    assert labgen.main(["--root", str(tmp_path)]) == 0
    assert labgen.sync(tmp_path, check=True) == []
    assert "git+https://github.com/x/y" in (tmp_path / "labs" / source.name).read_text()
