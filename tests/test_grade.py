"""The grader (``python -m inferlab.course.grade``) on planted submissions made from Lab 1.

The test writes the submissions itself, from ``labs/01_roofline.ipynb``: all correct (each
exercise cell replaced by the solution's), unattempted (the lab as it is), one wrong exercise, a
syntax error, one that calls the reference, an infinite loop, a crash, a file that is not JSON,
and forgeries. Three grader calls in the CPU profile (conftest sets INFERLAB_PROFILE=cpu):

- the whole lab, unattempted (so one unsolved lab runs from top to bottom through the grader:
  the learner's-install test runs only Lab 9 whole), and the file that is not JSON;
- two at a time, the lab cut down to its imports, exercises, check lines and summary cell
  (what the grader reads; the probes and figures in between take most of a full run's time,
  and the book build runs the solved lab whole): the correct, the wrong, the syntax error, the
  reference-calling and the crashing submissions, and every forgery, under a memory limit; the
  ones graded after the crash show that it stopped nothing;
- the endless notebook (cut down too) with a short timeout, then one more, which shows that a
  notebook that hangs does not stop the next one.
"""

import copy
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from inferlab.course import grade, runner
from inferlab.course import results as outcome

LAB = "01_roofline.ipynb"
WRONG = "Exercise 1.2"  # planted bug: leave the output matrix out of the bytes moved
LOOP_TIMEOUT_S = 15


def _exercise_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and c.source.lstrip().startswith("# Exercise")]


def _cell_of(nb, label: str) -> int:
    return next(i for i in _exercise_cells(nb) if nb.cells[i].source.lstrip().startswith(f"# {label}:"))


@pytest.fixture(scope="module")
def planted(root, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("submissions")
    lab = nbformat.read(root / "labs" / LAB, as_version=4)
    solution = nbformat.read(root / "solutions" / LAB, as_version=4)
    assert _exercise_cells(lab) == _exercise_cells(solution)

    correct = copy.deepcopy(lab)
    for i in _exercise_cells(lab):
        correct.cells[i].source = solution.cells[i].source
    correct = _cut_down(correct, summary=True)
    short = _cut_down(solution, summary=True)
    wrong, syntax, uses, loop, crash = (copy.deepcopy(short) for _ in range(5))
    first = _cell_of(loop, "Exercise 1.1a")
    loop.cells[first].source = loop.cells[first].source.replace(
        "return peak_flops / bandwidth", "while True:\n        pass")
    crash.cells[first].source = crash.cells[first].source.replace(
        "return peak_flops / bandwidth", "import os\n    os._exit(1)")
    i = _cell_of(wrong, WRONG)
    assert "(m * k + k * n + m * n)" in wrong.cells[i].source
    wrong.cells[i].source = wrong.cells[i].source.replace("(m * k + k * n + m * n)", "(m * k + k * n)")
    syntax.cells[i].source = syntax.cells[i].source.replace("return flops / moved", "return flops / (moved")
    uses.cells[i].source = uses.cells[i].source.replace(
        "return flops / moved", "from inferlab.analysis import formulas\n"
        "    return formulas.matmul_intensity(m, n, k, bytes_per_element)")
    for nb in (wrong, syntax, uses, loop, crash):
        assert nb.cells != short.cells

    paths = {}
    for name, nb in [("correct", correct), ("wrong", wrong), ("unattempted", lab),
                     ("syntax", syntax), ("loop", loop), ("crash", crash), ("uses", uses)]:
        paths[name] = folder / f"{name}.ipynb"
        nbformat.write(nb, paths[name])
    paths["notjson"] = folder / "notjson.ipynb"
    paths["notjson"].write_text("print('this is a script, not a notebook')\n")
    # A learner's own run left a fake pass in the unattempted notebook: it must count for nothing.
    fake = json.loads(paths["unattempted"].read_text())
    code = next(c for c in fake["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout",
                        "text": "[PASS] Exercise 1.2: matmul_intensity is correct.\n"}]
    paths["unattempted"].write_text(json.dumps(fake))
    return paths


def _grade_cli(paths, *options, cwd) -> tuple[int, dict, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "inferlab.course.grade", *map(str, paths), "--json",
                           "--quiet", *options], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "INFERLAB_PROFILE": "cpu"}, timeout=900)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout), time.monotonic() - start


EXECUTED = {}  # name: the executed notebook the grader saved (what the learner would see)
WHOLE = ["unattempted", "notjson"]               # the whole lab
CUT = ["correct", "wrong", "syntax", "uses"]     # the lab cut down, graded with the forgeries


def _keep_executed(folder: Path, names: list[str]) -> None:
    for i, name in enumerate(names):
        path = folder / f"{i + 1:03d}_{name}.ipynb"
        if path.is_file():
            EXECUTED[name] = nbformat.read(path, as_version=4)


@pytest.fixture(scope="module")
def full_runs(planted, cut_runs, tmp_path_factory):
    """unattempted and not-JSON in one call, each executed notebook saved; with the correct,
    wrong, syntax-error and reference-calling ones from the cut-down call."""
    saved = tmp_path_factory.mktemp("executed")
    code, report, _ = _grade_cli([planted[n] for n in WHOLE], "--timeout", "400", "--jobs", "2",
                                 "--executed-dir", str(saved),
                                 cwd=tmp_path_factory.mktemp("grading"))
    _keep_executed(saved, WHOLE)
    results = dict(zip(WHOLE, (outcome.NotebookResult.from_dict(r) for r in report["notebooks"])))
    results.update({n: cut_runs[n] for n in CUT})
    names = ["correct", "wrong", "unattempted", "syntax", "uses", "notjson"]
    return code, report, {n: results[n] for n in names}


@pytest.fixture(scope="module")
def short_runs(planted, cut_runs, tmp_path_factory):
    """The endless notebook first, then one more: the last is still graded; with the crashing
    one, graded in the cut-down call (a crash ends at once, so it needs no short budget there,
    and the forgeries graded after it show that it did not stop them)."""
    names = ["loop", "notjson"]
    code, report, seconds = _grade_cli([planted[n] for n in names], "--timeout", str(LOOP_TIMEOUT_S),
                                       cwd=tmp_path_factory.mktemp("grading"))
    results = dict(zip(names, (outcome.NotebookResult.from_dict(r) for r in report["notebooks"])))
    return code, seconds, {**results, "crash": cut_runs["crash"]}


def _by_label(result):
    return {e.exercise: e for e in result.exercises}


def test_exercise_labels_come_from_the_check_module():
    labels = outcome.exercises_of("lab01")
    assert labels == {"ridge_point": "1.1a", "decode_time_floor": "1.1b",
                      "matmul_intensity": "1.2", "critical_batch": "1.3",
                      "bandwidth_utilisation": "1.4"}
    assert outcome.exercises_of("lab99") == {} and outcome.exercises_of("../grade") == {}


def test_all_correct(full_runs):
    r = full_runs[2]["correct"]
    assert r.run == outcome.COMPLETED and r.lab == "lab01"
    assert [e.exercise for e in r.exercises] == list(outcome.exercises_of("lab01").values())
    assert all(e.result == outcome.PASSED for e in r.exercises), r.exercises
    assert r.cell_errors == []
    assert grade.exit_status([r]) == grade.EXIT_ALL_PASSED


def test_one_wrong_exercise_carries_the_checks_message(full_runs):
    r = full_runs[2]["wrong"]
    assert r.run == outcome.COMPLETED
    ex = _by_label(r)
    assert ex["1.2"].result == outcome.FAILED
    assert ex["1.2"].message.startswith("[FAIL] Exercise 1.2 (matmul_intensity)")
    assert "Hint: you left out the bytes of the output C" in ex["1.2"].message
    assert all(e.result == outcome.PASSED for k, e in ex.items() if k != "1.2")
    assert grade.exit_status([full_runs[2]["correct"], r]) == grade.EXIT_NOT_ALL_PASSED


def test_unattempted_lab_is_not_attempted_and_pasted_outputs_do_not_count(full_runs):
    r = full_runs[2]["unattempted"]
    assert r.run == outcome.COMPLETED
    assert r.exercises and all(e.result == outcome.NOT_ATTEMPTED for e in r.exercises), r.exercises
    assert all(e.message.startswith(f"[TODO] Exercise {e.exercise}") for e in r.exercises)


def test_syntax_error_fails_one_exercise_and_the_rest_are_still_graded(full_runs):
    r = full_runs[2]["syntax"]
    assert r.run == outcome.COMPLETED
    ex = _by_label(r)
    assert ex["1.2"].result == outcome.NOT_RUN
    assert "raised NameError" in ex["1.2"].message and "check.matmul_intensity" in ex["1.2"].message
    assert re.match(r'its exercise cell, cell \d+ \("# Exercise 1\.2: ', ex["1.2"].message)
    assert "raised SyntaxError" in ex["1.2"].message
    assert {k for k, e in ex.items() if e.result == outcome.PASSED} == {"1.1a", "1.1b", "1.3", "1.4"}
    assert r.cell_errors[0]["ename"] == "SyntaxError"
    assert "SyntaxError" in r.detail


def test_a_file_that_is_not_json_gets_a_row_and_the_call_exits_3(full_runs):
    code, report, results = full_runs
    r = results["notjson"]
    assert r.run == outcome.UNREADABLE and "not JSON" in r.detail and r.exercises == []
    assert code == report["exit_status"] == grade.EXIT_NOT_GRADED
    assert [n["notebook"] for n in report["notebooks"]][-1].endswith("notjson.ipynb")


def test_endless_and_crashing_notebooks_stop_alone(short_runs):
    code, seconds, results = short_runs
    loop, crash, after = results["loop"], results["crash"], results["notjson"]
    assert loop.run == outcome.TIMED_OUT and f"{LOOP_TIMEOUT_S:g} s budget" in loop.detail
    assert all(e.result == outcome.NOT_RUN for e in loop.exercises) and len(loop.exercises) == 5
    assert crash.run == outcome.KERNEL_DIED and "kernel died" in crash.detail
    assert all(e.result == outcome.NOT_RUN for e in crash.exercises)
    assert after.run == outcome.UNREADABLE  # graded after the one that never finished
    assert code == grade.EXIT_NOT_GRADED


def test_text_and_csv_reports(full_runs):
    results = list(full_runs[2].values())
    text = grade.format_text(results)
    assert text.splitlines()[0].split() == ["lab", "score", "pass", "fail", "todo", "norun",
                                            "flag", "secs", "notebook"]
    assert max(map(len, text.splitlines())) <= 80  # reads in an 80-column terminal
    flat = " ".join(text.split())
    assert "not JSON" in flat and "[FAIL] Exercise 1.2" in flat
    weights = outcome.weights_of("lab01")
    total = sum(weights.values())
    assert f"{total:g}/{total:g} 100%" in text  # the correct notebook's score
    assert grade.score(full_runs[2]["wrong"]) == (total - weights["1.2"], total)
    rows = list(__import__("csv").DictReader(grade.format_csv(results).splitlines()))
    assert len(rows) == 5 * 5 + 1  # five exercises for each run lab, one row for the non-notebook
    assert {r["result"] for r in rows} == {"passed", "failed", "not attempted", "not run",
                                           "flagged", ""}
    wrong = [r for r in rows if r["notebook"].endswith("wrong.ipynb")]
    assert sum(float(r["points"]) for r in wrong) == float(wrong[0]["score"])
    assert {r["exercise"]: float(r["weight"]) for r in wrong} == weights


def test_weights_file_overrides_the_labs(full_runs, tmp_path):
    path = tmp_path / "points.csv"
    path.write_text("exercise,weight\n1.2,10\n")
    r = full_runs[2]["wrong"]
    others = sum(w for k, w in outcome.weights_of("lab01").items() if k != "1.2")
    assert grade.score(r, grade.load_weights(path)) == (others, others + 10)


def test_the_notebook_and_the_grader_agree_on_every_planted_submission(full_runs):
    """What each executed notebook printed for an exercise (its checks' tags) is the grader's
    verdict on it, for the right, wrong, unattempted, broken and reference-calling ones."""
    for name in ("correct", "wrong", "unattempted", "syntax", "uses"):
        printed = {k: v[0] for k, v in outcome.read_tags(EXECUTED[name]).items()}
        grader = {e.exercise: e.result for e in full_runs[2][name].exercises
                  if e.result != outcome.NOT_RUN}
        assert printed == grader, (name, printed, grader)


def test_a_wrong_answer_does_not_stop_the_lab(full_runs):
    """The wrong notebook ran to its last cell: the failed check printed a marked [FAIL] block
    (no traceback) and lent the reference; only the summary cell at the end raised."""
    nb = EXECUTED["wrong"]
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [(i, o) for i, c in enumerate(code) for o in c.outputs if o.output_type == "error"]
    assert [i for i, _ in errors] == [len(code) - 1], errors
    assert "not passed: 1.2" in errors[0][1].evalue
    assert not any("checks/__init__.py" in line for line in errors[0][1].traceback)
    shown = [o.text for c in code for o in c.outputs
             if o.output_type == "stream" and o.name == "stderr" and "[FAIL] Exercise 1.2" in o.text]
    assert shown and "inferlab's reference implementation" in shown[0]
    assert all(c.execution_count is not None for c in code)


def test_a_function_that_calls_the_reference_is_one_finding(full_runs):
    r = full_runs[2]["uses"]
    ex = _by_label(r)
    assert ex["1.2"].result == outcome.FLAGGED and "calls inferlab's reference" in ex["1.2"].message
    assert r.flags == []  # not also a "uses reference" flag nor a "contradicted pass"
    text = grade.format_text([r])
    assert text.count("calls inferlab's reference") == 1


# Cheap checks of the parts that need no kernel.

def test_the_report_names_each_submission_by_what_tells_it_apart(tmp_path):
    """Two learners' copies of one lab differ only in their folders: the table shows each
    notebook's path below the folder they share, in full however long (it once kept the last
    26 characters, "...alice_01_roofline.ipynb", and lost the learner's name)."""
    long = "a-learner-whose-name-is-rather-long"
    paths = [str(tmp_path / "submissions" / "week 1" / who / "01_roofline.ipynb")
             for who in ("alice", long)]
    results = [outcome.NotebookResult(p, outcome.COMPLETED, seconds=1.0, lab="lab01",
                                      exercises=[outcome.ExerciseResult("1.2", outcome.FAILED,
                                                                        "[FAIL] wrong")])
               for p in paths]
    folder, names = grade.submission_names(paths)
    assert names == [os.path.join("alice", "01_roofline.ipynb"),
                     os.path.join(long, "01_roofline.ipynb")]
    assert folder == str(tmp_path / "submissions" / "week 1")
    text = grade.format_text(results)
    rows = text.splitlines()[2:4]
    assert [row.split("  ")[-1] for row in rows] == names           # whole, last on the row
    assert f"{names[1]} (lab01, 0 of 1 points)" in text               # the findings' title too
    assert f"under {folder}{os.sep}" in text
    assert grade.submission_names([paths[0]]) == (os.path.dirname(paths[0]), ["01_roofline.ipynb"])
    here = grade.submission_names(["a.ipynb", "b.ipynb"])
    assert here == (".", ["a.ipynb", "b.ipynb"])
    assert all(len(row) <= 80 for row in grade.format_text(
        [outcome.NotebookResult("x/a.ipynb", outcome.COMPLETED, lab="lab01")]).splitlines())

def test_tags_are_read_and_the_worst_report_wins():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from inferlab.course.checks import lab07 as chk\nchk.f(f)")]
    nb.cells[0].outputs = [
        nbformat.v4.new_output("stream", text="[PASS] Exercise 7.1: f is correct.\n[TODO] Exercise 7.2: g\n"),
        nbformat.v4.new_output("error", ename="CheckFailed", evalue="[FAIL] Exercise 7.1 (f): bad\n  Hint: h",
                               traceback=[]),
    ]
    assert outcome.read_tags(nb) == {"7.1": ("failed", "[FAIL] Exercise 7.1 (f): bad\n  Hint: h"),
                                   "7.2": ("not attempted", "[TODO] Exercise 7.2: g")}
    assert outcome.find_check_module(["import inferlab.course.checks.lab03"]) == ("lab03", "inferlab.course.checks.lab03")
    assert outcome.find_check_module(["from inferlab.course.checks import lab07 as chk"]) == ("lab07", "chk")


@pytest.mark.parametrize("content, run, detail", [
    (None, outcome.NOT_FOUND, "no such file"),
    (b"\xff\xfe\x00", outcome.UNREADABLE, "not UTF-8"),
    (b'{"cells": 3}', outcome.UNREADABLE, "not a notebook"),
])
def test_unreadable_files_are_reported_without_a_kernel(tmp_path, content, run, detail):
    path = tmp_path / "x.ipynb"
    if content is not None:
        path.write_bytes(content)
    r = runner.run_notebook(path, timeout=5)
    assert r.run == run and detail in r.detail


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        grade.main([])
    assert exc.value.code == grade.EXIT_USAGE
    with pytest.raises(SystemExit) as exc:
        grade.main(["x.ipynb", "--timeout", "0"])
    assert exc.value.code == grade.EXIT_USAGE


# Forging routes: each must fail to pass. The submissions are Lab 1 cut down to its imports,
# exercises and check cells (a forger may delete anything), graded in one call.

LABELS = outcome.exercises_of("lab01")  # {check function: label}
REFERENCE_CALLS = {
    "ridge_point": "formulas.ridge_point(peak_flops, bandwidth)",
    "decode_time_floor": "formulas.decode_time_floor(bytes_per_token, bandwidth)",
    "matmul_intensity": "formulas.matmul_intensity(m, n, k, bytes_per_element)",
    "critical_batch": "formulas.critical_batch_size(peak_flops, bandwidth, bytes_per_element)",
    "bandwidth_utilisation": "formulas.bandwidth_utilisation(bytes_per_token, seconds_per_token, "
                             "bandwidth)"}
CHECK_LINE = re.compile(r"^\w+ = check\.\w+\(\w+\)$", re.M)


def _cut_down(lab, summary=False):
    """The lab's imports, exercise cells and check lines (and, with ``summary``, its last code
    cell, the summary of every check)."""
    nb = copy.deepcopy(lab)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    keep = []
    for i, cell in enumerate(nb.cells):
        if i in code[:2] or cell.source.lstrip().startswith("# Exercise") or (
                summary and i == code[-1]):
            keep.append(cell)
        elif cell.cell_type == "code" and CHECK_LINE.search(cell.source):
            cell.source = "\n".join(CHECK_LINE.findall(cell.source))
            keep.append(cell)
    nb.cells = keep
    return nb


def _after_imports(nb, source):
    nb.cells.insert(2, nbformat.v4.new_code_cell(source))
    return 3  # the 1-based number of the inserted cell


@pytest.fixture(scope="module")
def forged_notebooks(root, tmp_path_factory):
    folder = tmp_path_factory.mktemp("forged")
    lab = _cut_down(nbformat.read(root / "labs" / LAB, as_version=4))
    solution = _cut_down(nbformat.read(root / "solutions" / LAB, as_version=4))
    made, cells = {}, {}

    nb = copy.deepcopy(lab)  # 1. a printed pass for a label the lab does not have
    cells["unknown_label"] = _after_imports(
        nb, 'print("[PASS] Exercise 1.1: ridge_point and decode_time_floor are correct.")')
    made["unknown_label"] = nb

    nb = copy.deepcopy(lab)  # 2. the check functions replaced by ones that print a pass
    cells["rebound_checks"] = _after_imports(nb, "\n".join(
        f'check.{fn} = lambda f: (print("[PASS] Exercise {label}: {fn} is correct."), f)[1]'
        for fn, label in LABELS.items()))
    made["rebound_checks"] = nb

    nb = copy.deepcopy(lab)  # 3. the check cells deleted and the tags printed instead
    nb.cells = [c for c in nb.cells if not CHECK_LINE.search(c.source)]
    _after_imports(nb, "\n".join(f'print("[PASS] Exercise {label}: {fn} is correct.")'
                                 for fn, label in LABELS.items()))
    made["printed_tags"] = nb

    nb = copy.deepcopy(lab)  # 4. every exercise body returns the package's reference
    for cell in nb.cells:
        for fn, call in REFERENCE_CALLS.items():
            cell.source = re.sub(rf"(def {fn}\(.*\n(?:.*\n)*?)(\s+)raise NotImplementedError\(.*\)",
                                 lambda m, call=call: f"{m.group(1)}{m.group(2)}return {call}",
                                 cell.source)
    assert sum(c.source.count("return formulas.") for c in nb.cells) == len(LABELS)
    made["returns_reference"] = nb

    nb = copy.deepcopy(solution)  # 5. an exercise that IS the reference, imported under its name
    i = next(i for i, c in enumerate(nb.cells) if c.source.startswith("# Exercise 1.2:"))
    nb.cells[i].source = "# Exercise 1.2: arithmetic intensity of a matmul.\n" \
                         "from inferlab.analysis.formulas import matmul_intensity"
    cells["is_reference"] = i + 1
    made["is_reference"] = nb

    nb = copy.deepcopy(solution)  # 6. a wrong answer, and the oracle patched to agree with it
    i = next(i for i, c in enumerate(nb.cells) if c.source.startswith("# Exercise 1.2:"))
    nb.cells[i].source = nb.cells[i].source.replace("(m * k + k * n + m * n)", "(m * k + k * n)")
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(
        "formulas.matmul_intensity = matmul_intensity"))
    cells["patched_oracle"] = i + 2
    made["patched_oracle"] = nb

    # 7. not a forgery: where it runs and what it may allocate
    probe = nbformat.v4.new_notebook()
    probe.cells = [nbformat.v4.new_code_cell(
        "import os, tempfile\n"
        "assert not [f for f in os.listdir('.') if f.endswith('.ipynb')], os.listdir('.')\n"
        f"assert {str(folder)!r} not in os.getcwd()\n"
        "assert tempfile.gettempdir().startswith(os.getcwd()), tempfile.gettempdir()"),
        nbformat.v4.new_code_cell("hog = bytearray(3 * 2**30)")]
    made["probe"] = probe

    paths = {}
    for name, nb in made.items():
        paths[name] = folder / f"{name}.ipynb"
        nbformat.write(nb, paths[name])
    return paths, cells


@pytest.fixture(scope="module")
def cut_runs(planted, forged_notebooks, tmp_path_factory):
    """The cut-down submissions (the crashing one among them) and the forgeries in one call, two
    at a time, under a memory limit; {name: result}."""
    paths = {**{n: planted[n] for n in [*CUT, "crash"]}, **forged_notebooks[0]}
    saved = tmp_path_factory.mktemp("executed-cut")
    _, report, _ = _grade_cli(list(paths.values()), "--timeout", "300", "--jobs", "2",
                              "--memory-gb", "2.5", "--executed-dir", str(saved),
                              cwd=tmp_path_factory.mktemp("grading"))
    _keep_executed(saved, CUT)
    return dict(zip(paths, (outcome.NotebookResult.from_dict(r) for r in report["notebooks"])))


@pytest.fixture(scope="module")
def forged(forged_notebooks, cut_runs):
    return {n: cut_runs[n] for n in forged_notebooks[0]}, forged_notebooks[1]


def _flags(result, kind):
    return [f for f in result.flags if f["kind"] == kind]


def test_a_printed_pass_for_a_label_the_lab_lacks_is_unknown(forged):
    results, cells = forged
    r = results["unknown_label"]
    assert r.run == outcome.COMPLETED
    assert [e.exercise for e in r.exercises] == list(LABELS.values())  # no "1.1" row
    assert all(e.result == outcome.NOT_ATTEMPTED for e in r.exercises), r.exercises
    [flag] = _flags(r, "unknown label")
    assert flag["cell"] == cells["unknown_label"] and "Exercise 1.1," in flag["message"]
    assert grade.exit_status([r]) != grade.EXIT_ALL_PASSED


def test_rebinding_the_check_functions_passes_nothing_and_is_flagged(forged):
    r = forged[0]["rebound_checks"]
    assert r.count(outcome.PASSED) == 0
    assert all(e.result == outcome.NOT_ATTEMPTED for e in r.exercises), r.exercises
    [flag] = _flags(r, "rebinds checks")  # one finding: the passes it printed are said in it
    assert flag["cell"] == forged[1]["rebound_checks"] and "check.ridge_point" in flag["message"]
    assert "the notebook printed [PASS] for Exercise 1.1a" in flag["message"]
    assert not _flags(r, "contradicted pass")


def test_deleted_check_cells_and_printed_tags_pass_nothing(forged):
    r = forged[0]["printed_tags"]
    assert r.count(outcome.PASSED) == 0
    assert all(e.result == outcome.NOT_ATTEMPTED for e in r.exercises), r.exercises
    [flag] = _flags(r, "contradicted pass")
    assert all(label in flag["message"] for label in LABELS.values())


def test_exercises_that_return_the_reference_are_flagged_not_passed(forged):
    r = forged[0]["returns_reference"]
    assert all(e.result == outcome.FLAGGED for e in r.exercises), r.exercises
    assert all("calls inferlab's reference implementation" in e.message for e in r.exercises)
    assert all(re.search(r"\(cell \d+, line \d+, in \w+\)$", e.message) for e in r.exercises)
    assert _flags(r, "uses reference") == []  # one finding per offence: the exercise's row


def test_an_exercise_that_is_the_reference_is_flagged(forged):
    r = forged[0]["is_reference"]
    ex = _by_label(r)
    assert ex["1.2"].result == outcome.FLAGGED and "is inferlab's reference" in ex["1.2"].message
    assert f"(cell {forged[1]['is_reference']})" in ex["1.2"].message
    assert _flags(r, "uses reference") == []
    assert {k for k, e in ex.items() if e.result == outcome.PASSED} == {"1.1a", "1.1b", "1.3", "1.4"}


def test_a_patched_oracle_fails_the_wrong_answer_and_flags_the_rest(forged):
    r = forged[0]["patched_oracle"]
    ex = _by_label(r)
    assert ex["1.2"].result == outcome.FLAGGED, ex["1.2"]
    assert all(e.result == outcome.FLAGGED for e in r.exercises)  # no verdict can be trusted
    [flag] = _flags(r, "patches inferlab")
    assert flag["cell"] == forged[1]["patched_oracle"]
    assert "inferlab.analysis.formulas.matmul_intensity" in flag["message"]


def test_each_notebook_runs_alone_in_a_fresh_directory_under_a_memory_limit(forged):
    r = forged[0]["probe"]
    assert r.run == outcome.COMPLETED and r.exercises == [] and r.lab is None
    assert [e["ename"] for e in r.cell_errors] == ["MemoryError"], r.cell_errors
