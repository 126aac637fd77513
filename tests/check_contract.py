"""The contract every lab's checks keep, written once for all the labs' check tests.

A check (``inferlab.course.checks.labNN.<name>``) given

- a right answer, written by the learner (here a lambda around the reference, so that it is not
  the reference itself), prints ``[PASS] Exercise N.`` and returns that very function;
- a function that is not attempted (it raises NotImplementedError), prints ``[TODO]`` and lends
  a reference that passes the same check, so the rest of the lab runs;
- a planted bug, raises ``CheckFailed`` (in ``strict()`` mode, as the grader and conftest run
  the checks) whose message starts ``[FAIL] Exercise N.`` and carries what the learner needs: a
  hint, and the ``words`` each lab asks for; in a notebook (not strict) the same message is
  printed on stderr, the failure is recorded for ``summary()``, and the check returns the
  reference it lends an unattempted exercise, so the rest of the lab runs on code known to be
  right.

A lab's test module takes the three tests with

    (test_correct_answer_passes_and_is_returned, test_unattempted_exercise_gets_the_reference,
     test_planted_bug_fails_with_an_actionable_message) = contract(lab04, CASES, 4)

where ``CASES`` maps each check's name to ``(reference, [planted bugs])``; and a lab whose
hints it wants pinned adds ``test_specific_hints = hints(lab04, CASES, [(bug, words), ...])``.
"""

import pytest

from inferlab.course import checks
from inferlab.course.checks import CheckFailed


def stub(*args):
    raise NotImplementedError("Exercise: write the body")


def contract(lab, cases: dict, number: int, words=("Hint:",), wrap: bool = True,
             lent_as: dict | None = None):
    """The three contract tests for ``lab``'s checks over ``cases``.

    ``words``: what every failure message must contain (a tuple among them: one of those);
    ``wrap=False`` passes the reference itself as the right answer (a class, say, that a lambda
    cannot stand in for); ``lent_as``: for some checks, the very object lent when not attempted.
    """

    @pytest.mark.parametrize("name", cases)
    def test_correct_answer_passes_and_is_returned(name, capsys):
        reference, _ = cases[name]
        answer = (lambda *a: reference(*a)) if wrap else reference  # a learner's own function
        assert getattr(lab, name)(answer) is answer
        assert capsys.readouterr().out.startswith(f"[PASS] Exercise {number}.")

    @pytest.mark.parametrize("name", cases)
    def test_unattempted_exercise_gets_the_reference(name, capsys):
        lent = getattr(lab, name)(stub)
        assert "[TODO]" in capsys.readouterr().out
        assert callable(lent) and lent is not stub
        if lent_as and name in lent_as:
            assert lent is lent_as[name]
        assert getattr(lab, name)(lent) is lent  # the lent reference passes its own check
        assert "[PASS]" in capsys.readouterr().out

    @pytest.mark.parametrize("name, bug", [(n, b) for n, (_, bugs) in cases.items() for b in bugs],
                             ids=lambda v: getattr(v, "__name__", v))
    def test_planted_bug_fails_with_an_actionable_message(name, bug):
        with pytest.raises(CheckFailed) as failure:
            getattr(lab, name)(bug)
        message = str(failure.value)
        assert message.startswith(f"[FAIL] Exercise {number}.")
        missing = [w for w in words
                   if not any(x in message for x in ((w,) if isinstance(w, str) else w))]
        assert not missing, (missing, message)

    @pytest.mark.parametrize("name, bug", [(n, b) for n, (_, bugs) in cases.items() for b in bugs],
                             ids=lambda v: getattr(v, "__name__", v))
    def test_planted_bug_in_a_notebook_reports_and_lends_the_reference(name, bug, capsys):
        with checks.strict(False):
            lent = getattr(lab, name)(stub)
            capsys.readouterr()
            checks._outcomes.clear()
            try:
                got = getattr(lab, name)(bug)
                shown = capsys.readouterr().err
                assert got is not bug and (got is lent or getattr(got, "__code__", 0)
                                           is getattr(lent, "__code__", 1)), got
                assert f"[FAIL] Exercise {number}." in shown and "reference" in shown, shown
                assert any(w in shown for w in ("Hint:", "raised")), shown
                with pytest.raises(CheckFailed, match="not passed"):
                    checks.summary()
            finally:
                checks._outcomes.clear()

    return (test_correct_answer_passes_and_is_returned,
            test_unattempted_exercise_gets_the_reference,
            test_planted_bug_fails_with_an_actionable_message,
            test_planted_bug_in_a_notebook_reports_and_lends_the_reference)


def hints(lab, cases: dict, bug_words: list):
    """A test that each planted ``bug`` (one of ``cases``' bugs) fails with a message matching
    ``words`` (a regular expression): the hint that names the learner's mistake."""

    @pytest.mark.parametrize("bug, words", bug_words, ids=lambda v: getattr(v, "__name__", v))
    def test_specific_hints(bug, words):
        name = next(n for n, (_, bugs) in cases.items() if bug in bugs)
        with pytest.raises(CheckFailed, match=words):
            getattr(lab, name)(bug)

    return test_specific_hints
