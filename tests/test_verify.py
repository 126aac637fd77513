"""inferlab.course.verify, the grader's own checks, called in this process on namespaces built
from the labs (the grader runs the same code inside a submission's kernel; tests/test_grade.py
covers that end to end)."""

import contextlib
import importlib
import io
import pkgutil
import sys
from pathlib import Path

import nbformat
import pytest

import inferlab
from inferlab.course import catalog, results, verify

CHECKS_DIR = str(Path(verify.__file__).resolve().parent / "checks")
LABS = catalog.labs()


def _exercises(module):
    names = catalog.exercise_names(module)
    return [{"check": fn, "name": names[fn], "label": label}
            for fn, label in results.exercises_of(module).items()]


def _namespace(lab):
    """The notebook's namespace after its import cell, and its code cells."""
    nb = nbformat.read(lab.solution, as_version=4)
    code = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    imports = next(s for _, s in code if f"import {lab.check_module} as check" in s)
    ns = {"__name__": "__main__"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(imports, "<imports>", "exec"), ns)
    return ns, code


def _grade(lab, cells, ns=None):
    ns = ns if ns is not None else _namespace(lab)[0]
    return verify.grade_namespace(ns, CHECKS_DIR, lab.check_module,
                                  _exercises(lab.check_module), cells, "check")


def test_a_clean_package_shows_no_tampering():
    for info in pkgutil.walk_packages(inferlab.__path__, "inferlab."):
        importlib.import_module(info.name)
    assert verify.tampered(str(Path(inferlab.__file__).parent)) == []


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.stem)
def test_solutions_pass_and_labs_are_not_attempted_with_no_flags(lab):
    ns, code = _namespace(lab)
    out = _grade(lab, code, dict(ns))
    assert [e["result"] for e in out["exercises"]] == [verify.PASSED] * len(out["exercises"])
    assert out["flags"] == []
    nb = nbformat.read(lab.lab, as_version=4)
    stubs = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    out = _grade(lab, stubs, dict(ns))
    assert {e["result"] for e in out["exercises"]} == {verify.NOT_ATTEMPTED}
    assert all(e["message"].startswith("[TODO] Exercise") for e in out["exercises"])


def _reference(lab, check):
    module = importlib.import_module(f"inferlab.course.checks.{lab.check_module}")
    with contextlib.redirect_stdout(io.StringIO()):
        return getattr(module, check)(verify._not_attempted)


ROUTES = {  # how a submission's exercise can be the reference: the cell that defines it
    "calls": "def {name}(*args, **kwargs):\n    return REF(*args, **kwargs)",
    "is": "{name} = REF",
    "wraps": "import functools\n{name} = functools.partial(REF)",
}


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.stem)
def test_every_exercise_that_is_wraps_or_calls_its_reference_is_flagged(lab, route):
    # one submission in which every exercise's cell is, wraps or calls its own reference
    # (REF_0, REF_1, ...), graded once: each exercise's row is its own verdict
    ns, _ = _namespace(lab)
    exercises = _exercises(lab.check_module)
    space, cells = dict(ns), []
    for k, ex in enumerate(exercises):
        space[f"REF_{k}"] = _reference(lab, ex["check"])
        cells.append((k, ROUTES[route].format(name=ex["name"]).replace("REF", f"REF_{k}")))
    results = {e["exercise"]: e for e in _grade(lab, cells, space)["exercises"]}
    assert set(results) == {ex["label"] for ex in exercises}
    for ex in exercises:
        assert results[ex["label"]]["result"] == verify.FLAGGED, (ex["label"], results[ex["label"]])


@pytest.mark.parametrize("lab", [lab for lab in LABS if lab.check_module in ("lab02", "lab03")],
                         ids=lambda lab: lab.stem)
def test_a_subclass_of_a_reference_class_is_flagged(lab):
    ns, _ = _namespace(lab)
    for ex in _exercises(lab.check_module):
        reference = _reference(lab, ex["check"])
        if not isinstance(reference, type):
            continue
        out = _grade(lab, [(0, f"class {ex['name']}(REF):\n    pass")], {**ns, "REF": reference})
        [result] = [e for e in out["exercises"] if e["exercise"] == ex["label"]]
        assert result["result"] == verify.FLAGGED and "subclasses" in result["message"]


def test_calling_a_function_a_reference_stands_for_is_flagged():
    lab = next(lab for lab in LABS if lab.check_module == "lab02")
    cell = (0, "def cache_bytes(config, tokens, batch, dtype):\n"
               "    return formulas.kv_bytes(config, tokens, dtype, batch)")
    out = _grade(lab, [cell])
    [result] = [e for e in out["exercises"] if e["exercise"] == "2.3"]
    assert result["result"] == verify.FLAGGED, result


def test_rebinding_the_notebooks_checks_changes_no_verdict():
    lab = next(lab for lab in LABS if lab.check_module == "lab01")
    checks = sys.modules.get("inferlab.course.checks.lab01") or \
        importlib.import_module("inferlab.course.checks.lab01")
    original = checks.matmul_intensity
    wrong = (0, "def matmul_intensity(m, n, k, bytes_per_element):\n"
                "    return 2 * m * n * k / ((m * k + k * n) * bytes_per_element)")
    namespace = {}
    exec(compile("def fake(fn):\n    return fn", "/tmp/ipykernel_1/1.py", "exec"), namespace)
    checks.matmul_intensity = namespace["fake"]
    try:
        out = _grade(lab, [wrong])
    finally:
        checks.matmul_intensity = original
    [result] = [e for e in out["exercises"] if e["exercise"] == "1.2"]
    assert result["result"] == verify.FAILED and "left out the bytes of the output" in \
        result["message"]
    assert [f["kind"] for f in out["flags"]] == ["rebinds checks"]


def test_a_replaced_oracle_makes_the_verdicts_untrusted():
    lab = next(lab for lab in LABS if lab.check_module == "lab01")
    ns, code = _namespace(lab)
    formulas = sys.modules["inferlab.analysis.formulas"]
    original = formulas.ridge_point
    namespace = {}
    exec(compile("def ridge_point(p, b):\n    return p / b", "<ipython-input-3>", "exec"),
         namespace)
    formulas.ridge_point = namespace["ridge_point"]
    try:
        out = _grade(lab, code, ns)
    finally:
        formulas.ridge_point = original
    assert {e["result"] for e in out["exercises"]} == {verify.FLAGGED}
    assert any(f["kind"] == "patches inferlab" and "formulas.ridge_point" in f["message"]
               for f in out["flags"])


def test_a_definition_that_does_not_compile_is_not_run():
    lab = next(lab for lab in LABS if lab.check_module == "lab01")
    out = _grade(lab, [(4, "def ridge_point(peak_flops, bandwidth):\n    return (peak_flops")])
    [result] = [e for e in out["exercises"] if e["exercise"] == "1.1a"]
    assert result["result"] == verify.NOT_RUN and "SyntaxError" in result["message"]
    [missing] = [e for e in out["exercises"] if e["exercise"] == "1.2"]
    assert missing["result"] == verify.NOT_RUN and "no cell" in missing["message"]
