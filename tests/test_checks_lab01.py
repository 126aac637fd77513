"""Every Lab 1 check passes a correct answer, lends the reference to an unattempted one, and
fails a planted bug with a message that names the call, the expected value and a hint."""

import pytest

from check_contract import contract
from inferlab.analysis import formulas
from inferlab.course.checks import CheckFailed, lab01


CASES = {
    "ridge_point": (formulas.ridge_point, [lambda p, b: b / p, lambda p, b: p / b / 2]),
    "decode_time_floor": (formulas.decode_time_floor,
                          [lambda n, b: n * b, lambda n, b: n / b * 1e3]),  # ms, not s
    "matmul_intensity": (formulas.matmul_intensity, [
        lambda m, n, k, b: m * n * k / ((m * k + k * n + m * n) * b),  # forgot the factor 2
        lambda m, n, k, b: 2 * m * n * k / ((m * k + k * n) * b),      # forgot the output
        lambda m, n, k, b: 2 * m * n * k / (m * k + k * n + m * n),    # forgot bytes/element
    ]),
    "critical_batch": (formulas.critical_batch_size, [lambda p, b, e: p / b,
                                                      lambda p, b, e: p / b * e]),
    "bandwidth_utilisation": (formulas.bandwidth_utilisation, [
        lambda n, s, b: 100 * n / s / b,  # a percentage, not a fraction
        lambda n, s, b: n * s / b]),
}


(test_correct_answer_passes_and_is_returned, test_unattempted_exercise_gets_the_reference,
 test_planted_bug_fails_with_an_actionable_message,
 test_planted_bug_in_a_notebook_reports_and_lends_the_reference) = contract(
    lab01, CASES, 1, words=("returned", "expected", "Hint:"),
    lent_as={name: reference for name, (reference, _) in CASES.items()})


def test_specific_hints_for_common_matmul_mistakes():
    with pytest.raises(CheckFailed, match="off by exactly 2"):
        lab01.matmul_intensity(CASES["matmul_intensity"][1][0])
    with pytest.raises(CheckFailed, match="left out the bytes of the output"):
        lab01.matmul_intensity(CASES["matmul_intensity"][1][1])


def test_a_crashing_answer_and_a_non_function_are_reported():
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        lab01.ridge_point(lambda p, b: 1 / 0)
    with pytest.raises(CheckFailed, match="Pass the function itself"):
        lab01.ridge_point(295.0)
    with pytest.raises(CheckFailed, match="expected a number"):
        lab01.ridge_point(lambda p, b: "295")
