"""Every lab starts the same way and ends the same way, in solutions/ and in labs/ alike.

- **Device and profile.** The setup cell (the first code cell after the Colab install cell)
  chooses the profile with ``profile = choose_profile()`` (no argument: the machine decides, or
  ``INFERLAB_PROFILE``), describes the device with ``detect_device(profile.device)`` and prints
  ``profile.name``; no cell names a device as a literal to ``detect_device``. A lab that needs
  the CPU for one part (Lab 5's int8 kernel) says so with a second profile, after the choice.
- **The end.** The last cell calls ``summary()``, which fails the notebook (under nbval too) if
  a check failed or was flagged; the checks themselves let the lab run on after a failure.
"""

import ast

import nbformat
import pytest

from inferlab.course import catalog, runner

NOTEBOOKS = [p for lab in catalog.labs() for p in (lab.solution, lab.lab)]


def _code(path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def _calls(tree, name):
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", None)) == name]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_setup_cell_chooses_the_profile_and_prints_it(path):
    setup = ast.parse(_code(path)[1])
    chosen = [n for n in setup.body if isinstance(n, ast.Assign)
              and [ast.unparse(t) for t in n.targets] == ["profile"]
              and isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == "choose_profile"]
    assert chosen and not chosen[0].value.args and not chosen[0].value.keywords, \
        "the setup cell must say `profile = choose_profile()`"
    assert any(ast.unparse(c) == "detect_device(profile.device)"
               for c in _calls(setup, "detect_device")), "describe profile.device"
    printed = [c for c in _calls(setup, "print") if "profile.name" in ast.unparse(c)]
    assert printed, "the setup cell must print the profile it chose"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_cell_hard_codes_the_device(path):
    for source in _code(path)[1:]:
        for call in _calls(ast.parse(source), "detect_device"):
            assert not any(isinstance(a, ast.Constant) for a in call.args), ast.unparse(call)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_last_cell_is_the_summary(path):
    last = ast.parse(_code(path)[-1])
    assert [ast.unparse(c) for c in _calls(last, "summary")] == ["summary()"]


def test_a_failed_check_lends_the_reference_and_summary_fails(capsys):
    """In a notebook (not strict), a wrong answer is reported on stderr with its hint and the
    reference is returned; summary() then raises, with a message IPython shows alone."""
    from inferlab.course import checks
    from inferlab.course.checks import lab01

    with checks.strict(False):
        checks._outcomes.clear()
        try:
            got = lab01.ridge_point(lambda peak, bandwidth: bandwidth / peak)
            err = capsys.readouterr().err
            assert "[FAIL] Exercise 1.1a (ridge_point)" in err and "Hint:" in err
            assert "inferlab.analysis.formulas.ridge_point" in err  # what the lab uses instead
            assert got(2e12, 1e12) == 2.0  # the reference: peak / bandwidth
            lab01.decode_time_floor(lambda *a: (_ for _ in ()).throw(NotImplementedError))
            with pytest.raises(checks.CheckFailed) as failure:
                checks.summary()
            assert "not passed: 1.1a" in str(failure.value)
            shown = failure.value._render_traceback_()
            assert not any("Traceback" in line or "File " in line for line in shown)
            lab01.ridge_point(lambda peak, bandwidth: peak / bandwidth)  # fixed and run again
            capsys.readouterr()
            checks.summary()  # a failure fixed and checked again no longer counts
            assert "1 of 2 exercises checked in this session passed." in capsys.readouterr().out
        finally:
            checks._outcomes.clear()


def test_a_learner_function_that_calls_the_reference_is_flagged_in_the_notebook(capsys):
    """The notebook's check and the grader agree: a 6.4 answer that calls the package's
    prompt_lookup is flagged, not passed (one finding, printed with the [FLAG] tag)."""
    from inferlab.course import checks
    from inferlab.course.checks import lab06

    ns = {}
    exec(compile("from inferlab.model import speculative\n"
                 "def prompt_lookup(tokens, k, max_ngram=3):\n"
                 "    return speculative.prompt_lookup(tokens, k, max_ngram)\n",
                 "/tmp/ipykernel_0/1.py", "exec"), ns)  # compiled as a notebook cell is
    with checks.strict(False):
        checks._outcomes.clear()
        try:
            got = lab06.prompt_lookup(ns["prompt_lookup"])
            out = capsys.readouterr()
            assert "[PASS]" not in out.out and "[FLAG] Exercise 6.4" in out.err
            assert got is not ns["prompt_lookup"]
            with pytest.raises(checks.CheckFailed, match="6.4"):
                checks.summary()
        finally:
            checks._outcomes.clear()


def test_a_failed_checks_block_comes_before_what_the_cell_prints_after_it(tmp_path):
    """In a real kernel, a cell that prints, fails a check and prints again (Lab 2's Exercise
    2.3 prints a table with the lent reference) shows its output in that order: the [FAIL]
    block right after what came before it and above the rest, its lines whole (the course's
    style wraps printed prose, never the block). Jupyter's kernel sends a stream when it flushes
    it, stdout first at the end of a cell, so an unflushed stderr block would come last."""
    import nbclient

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("from inferlab.analysis.column import use_course_style\n"
                                  "from inferlab.course.checks import lab01 as check\n"
                                  "use_course_style()"),
        nbformat.v4.new_code_cell("print('before the check')\n"
                                  "ridge_point = check.ridge_point(lambda peak, bw: bw / peak)\n"
                                  "print('after the check:', ridge_point(2e12, 1e12))"),
    ]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [(o["name"], o["text"]) for o in nb.cells[1].outputs if o["output_type"] == "stream"]
    assert [name for name, _ in outputs] == ["stdout", "stderr", "stdout"], outputs
    assert outputs[0][1] == "before the check\n" and outputs[2][1] == "after the check: 2.0\n"
    block = outputs[1][1].splitlines()
    first = next(line for line in block if "[FAIL] Exercise 1.1a" in line)
    assert len(first) > 100 and "Hint:" in outputs[1][1]     # one line, as long as it is


def test_lab_1s_explorer_leaves_its_static_figure_in_the_notebook(root, tmp_path):
    """Lab 1's section 6 draws the explorer's static figure and then builds the widget. The
    figure must be an image output of the cell itself, which an executed notebook and the site
    keep, not only inside the widget's output area, which a static page cannot show (the
    widget's first draw used to take every open figure into its area with plt.show())."""
    pytest.importorskip("ipywidgets")
    cells = [c for c in nbformat.read(root / "solutions" / "01_roofline.ipynb", as_version=4).cells
             if c.cell_type == "code"]
    explorer = next(c.source for c in cells if "plot_explorer(" in c.source)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\n"
                                          "from inferlab.analysis.column import use_course_style\n"
                                          "use_course_style()"),
                nbformat.v4.new_code_cell(explorer)]
    # a client that waits in slices (inferlab.course.runner.slice_waits): this cell's widgets
    # once left the plain client waiting out the whole 180-s timeout with the kernel idle
    runner.execute(nb, tmp_path, timeout=180)
    kinds = [next(iter(sorted(o.get("data", {})))) if o.get("data") else o["output_type"]
             for o in nb.cells[1].outputs]
    assert "image/png" in kinds, kinds
    assert kinds.index("image/png") < kinds.index("application/vnd.jupyter.widget-view+json")
