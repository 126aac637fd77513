"""The feedback cells of the labs: one module a lab (``lab01``, ``lab02``, ...).

After each exercise, a check cell passes the learner's function to a check, which runs it on
cases whose answers come from an oracle (a formula, or a reference implementation that needs no
solution) and ends in one of four ways:

- passed: prints a line starting ``[PASS]`` and returns the learner's function;
- failed: prints a marked block (on stderr, which Jupyter shows on a red ground, flushed in its
  place so that it comes before anything the cell prints after the check) starting
  ``[FAIL]`` that says what was called, what came back, what was expected and a hint, and that
  from here on the lab uses inferlab's reference implementation; it returns that reference, so
  the rest of the lab runs and no later number is computed with code known to be wrong;
- not attempted (the function still raises ``NotImplementedError``): prints a line starting
  ``[TODO]`` and returns inferlab's reference implementation, so the rest of the lab runs. That is
  how a learner can skip ahead and how CI executes the unsolved labs;
- flagged: the learner's function is, wraps or calls the very reference the check would lend
  (the grader's own test, ``inferlab.course.verify``): prints ``[FLAG]``; it passes nothing.

Every outcome is recorded for this Python session, and the last cell of every lab calls
``summary()``, which lists them and raises ``CheckFailed`` (shown without a traceback) if an
exercise failed or was flagged: so a Run All reaches the end, and nbval still fails a solved
notebook whose answer is wrong.

Inside ``strict()`` (the grader and the tests) a failure raises ``CheckFailed`` instead, whose
message is the same ``[FAIL]`` text, and nothing is recorded or watched.

The grader (``inferlab.course.grade``) does not trust what a notebook prints: it runs these checks
itself, on a fresh copy of this package's check modules, in strict mode, and learns which
reference a check lends by calling it with a function that is not attempted. A reference
written for a check (a lambda around a formula) names the package functions it stands for with
``lends``, so that a learner who calls those directly is flagged too. The grader still reads the
tags, to flag printed ones that its checks contradict; it imports them from here, which is why
this module imports torch only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import math
import sys
from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    import torch

F = TypeVar("F", bound=Callable)

PASS, FAIL, TODO, FLAG = "[PASS]", "[FAIL]", "[TODO]", "[FLAG]"


class CheckFailed(AssertionError):
    """An exercise's answer is wrong; the message says how and hints at why.

    IPython shows it as its message alone, with no traceback through this package: the
    message is all a learner needs, and it names the learner's own call."""

    def _render_traceback_(self) -> list[str]:  # IPython's hook for a custom error display
        return [f"{_RED}{line}{_RESET}" if i == 0 else line
                for i, line in enumerate(str(self).splitlines())]


_RED, _RESET = "\033[1;31m", "\033[0m"  # bold red in a terminal and in Jupyter's output

# The outcome of every check run in this Python session: {exercise: (tag, message)}. A check run
# again after a fix replaces its exercise's entry. ``summary()`` reads it; strict mode skips it.
_outcomes: dict[str, tuple[str, str]] = {}
_strict = False


@contextlib.contextmanager
def strict(on: bool = True):
    """Within this block, a failed check raises ``CheckFailed`` (what the grader and the tests
    want) instead of reporting the failure and lending the reference."""
    global _strict
    before, _strict = _strict, on
    try:
        yield
    finally:
        _strict = before


def _hint(hint: str) -> str:
    return f"\n  Hint: {hint}" if hint else ""


def expect_close(what: str, got, expected: float, rel: float = 1e-6, abs_tol: float = 0.0,
                 hint: str = "", unit: str = "") -> None:
    """Fail unless the number ``got`` is within ``rel`` (relative) or ``abs_tol`` of ``expected``."""
    try:
        if isinstance(got, (str, bytes, bool)) or got is None:
            raise TypeError
        value = float(got)  # ints, floats, numpy scalars and one-element tensors
    except (TypeError, ValueError, RuntimeError):
        raise CheckFailed(f"{what} returned {got!r} ({type(got).__name__}), expected a number "
                          f"close to {expected:.6g}{unit}.{_hint(hint)}") from None
    if not math.isclose(value, expected, rel_tol=rel, abs_tol=abs_tol):
        factor = f" (off by a factor of {value / expected:.6g})" if expected else ""
        raise CheckFailed(f"{what} returned {value:.6g}{unit}, expected {expected:.6g}{unit}"
                          f"{factor}.{_hint(hint)}")


def expect_equal(what: str, got, expected, hint: str = "") -> None:
    """Fail unless ``got == expected`` (tensors compare element by element)."""
    import torch

    if isinstance(got, torch.Tensor) or isinstance(expected, torch.Tensor):
        same = isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor) and \
            got.shape == expected.shape and bool(torch.equal(got.to(expected.device), expected))
    else:
        same = got == expected
    if not same:
        raise CheckFailed(f"{what} returned {_short(got)}, expected {_short(expected)}."
                          + _hint(hint))


def expect_tensor_close(what: str, got, expected: torch.Tensor, atol: float = 1e-5,
                        rtol: float = 1e-5, hint: str = "") -> None:
    """Fail unless ``got`` is a tensor of ``expected``'s shape whose values are all close to it."""
    import torch

    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{what} returned a {type(got).__name__}, expected a tensor of shape "
                          f"{tuple(expected.shape)}.{_hint(hint)}")
    if got.shape != expected.shape:
        raise CheckFailed(f"{what} returned shape {tuple(got.shape)}, expected "
                          f"{tuple(expected.shape)}.{_hint(hint)}")
    diff = (got.detach().float().to(expected.device) - expected.float()).abs()
    bound = atol + rtol * expected.float().abs()
    if not bool((diff <= bound).all()):
        worst = int(diff.argmax())
        raise CheckFailed(f"{what} differs from the reference: max abs difference "
                          f"{float(diff.max()):.3g} (tolerance {atol:g} + {rtol:g} x |expected|), "
                          f"at flat index {worst} where expected {float(expected.flatten()[worst]):.6g}"
                          f" and got {float(got.flatten()[worst]):.6g}.{_hint(hint)}")


def _short(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        if value.numel() <= 12:
            return f"tensor({value.tolist()})"
        return f"tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) < 200 else text[:197] + "..."


def lends(reference: F, *same_as: Callable) -> F:
    """``reference``, marked as standing for the package functions ``same_as``: the grader flags a
    learner's function that calls any of them as it flags one that calls the reference."""
    reference.same_as = same_as
    return reference


def _reference_name(reference) -> str:
    stands_for = getattr(reference, "same_as", ()) or (reference,)
    named = stands_for[0]
    module = getattr(named, "__module__", "") or ""
    return f"{module}.{getattr(named, '__qualname__', repr(named))}".lstrip(".")


def _failed(exercise: str, name: str, message: str, reference, cause: BaseException | None):
    """A failure: raised in strict mode; otherwise shown as a marked block and recorded, and the
    reference is returned so that the rest of the lab runs on code known to be right."""
    if _strict:
        raise CheckFailed(message) from cause
    if cause is not None:  # the learner's code crashed: show where, in the learner's own cell
        import traceback
        frames = [f for f in traceback.extract_tb(cause.__traceback__)
                  if "ipykernel_" in f.filename or f.filename.startswith("<ipython-input")]
        if frames:
            message += f"\n  (line {frames[-1].lineno} of your cell: {frames[-1].line})"
    _outcomes[exercise] = (FAIL, message)
    rule = "=" * 78
    lines = message.splitlines()
    _to_stderr(f"{_RED}{rule}\n{lines[0]}{_RESET}", *lines[1:],
               f"From here on this lab uses inferlab's reference implementation "
               f"({_reference_name(reference)}) in place of your {name}, so no later number is "
               f"computed with code known to be wrong. Fix {name}, run its cell and this one "
               "again.", f"{_RED}{rule}{_RESET}")
    return reference


def _to_stderr(*lines: str) -> None:
    """Print ``lines`` on stderr, in their place among the cell's output: Jupyter's kernel sends
    each stream when it flushes it, stdout first at the end of a cell, so a block written to
    stderr unflushed shows below everything the cell printed after it. What was printed before
    goes out first, the block next, and whatever the cell prints after it follows it."""
    sys.stdout.flush()
    print(*lines, sep="\n", file=sys.stderr)
    sys.stderr.flush()


def _uses_reference(learner, reference) -> str | None:
    """How the learner's function is, wraps or subclasses the reference (the grader's test)."""
    from inferlab.course import verify
    return verify.is_reference(learner, reference)


def run_check(exercise: str, name: str, learner: F, reference: F,
              cases: Callable[[F], None], success: str = "") -> F:
    """Run ``cases(learner)``; return the learner's function if it passes, else the reference.

    ``cases`` calls the function it is given and raises ``CheckFailed`` on a wrong answer. A
    failure is reported and the reference returned (in ``strict()`` mode: raised); an exercise
    not attempted gets the reference with a ``[TODO]`` line.
    """
    if not callable(learner):
        return _failed(exercise, name, f"{FAIL} Exercise {exercise}: expected the function "
                       f"{name}, got {type(learner).__name__}. Pass the function itself, without "
                       "calling it.", reference, None)
    how = None if _strict else _uses_reference(learner, reference)
    hits: list[str] = []
    try:
        with contextlib.nullcontext(hits) if _strict else _watch(reference) as hits:
            cases(learner)
    except NotImplementedError:
        print(f"{TODO} Exercise {exercise}: {name} is not attempted yet; using inferlab's "
              "reference implementation so the rest of the lab runs.")
        if not _strict:
            _outcomes[exercise] = (TODO, "")
        return reference
    except CheckFailed as failure:
        return _failed(exercise, name, f"{FAIL} Exercise {exercise} ({name}): {failure}",
                       reference, None)
    except Exception as error:  # the learner's code crashed: say where
        return _failed(exercise, name, f"{FAIL} Exercise {exercise} ({name}) raised "
                       f"{type(error).__name__}: {error}", reference, error)
    if how or hits:
        what = how or "calls inferlab's reference implementation"
        where = "" if how else f" ({hits[0]} of its cell)"
        message = (f"{FLAG} Exercise {exercise}: {name} {what}, {_reference_name(reference)}"
                   f"{where}, so this check tested inferlab, not your code: it does not count "
                   "as passed. Write the function yourself.")
        _outcomes[exercise] = (FLAG, message)
        _to_stderr(message)
        return reference
    if not _strict:
        _outcomes[exercise] = (PASS, "")
    print(f"{PASS} Exercise {exercise}: {name} is correct{'; ' + success if success else '.'}")
    return learner


@contextlib.contextmanager
def _watch(reference):
    from inferlab.course import verify
    with verify.watch_calls(reference) as hits:
        yield hits


def summary() -> None:
    """The last cell of a lab: one line per exercise checked in this session; raises
    ``CheckFailed`` (shown without a traceback) when an exercise failed or was flagged."""
    if not _outcomes:
        print("No exercise was checked in this session.")
        return
    words = {PASS: "passed", FAIL: "FAILED (the lab used inferlab's reference)",
             TODO: "not attempted (the lab used inferlab's reference)",
             FLAG: "FLAGGED: it uses inferlab's reference"}
    lines = [f"  Exercise {label}: {words[tag]}" for label, (tag, _) in _outcomes.items()]
    bad = [label for label, (tag, _) in _outcomes.items() if tag in (FAIL, FLAG)]
    passed = sum(tag == PASS for tag, _ in _outcomes.values())
    head = f"{passed} of {len(_outcomes)} exercises checked in this session passed"
    if bad:
        raise CheckFailed(f"{head}; not passed: {', '.join(bad)}. Fix them and run their cells "
                          "again (the cells after them used inferlab's reference).\n"
                          + "\n".join(lines))
    print(f"{head}.\n" + "\n".join(lines))
