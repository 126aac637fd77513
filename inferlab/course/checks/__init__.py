"""The feedback cells of the labs: one module a lab (``lab01``, ``lab02``, ...).

After each exercise, a check cell passes the learner's function to a check, which runs it on
cases whose answers come from an oracle (a formula, or a reference implementation that needs no
solution) and ends in one of three ways:

- passed: prints a line starting ``[PASS]`` and returns the learner's function;
- failed: raises ``CheckFailed``, whose message starts ``[FAIL]`` and says what was called, what
  came back, what was expected, and a hint;
- not attempted (the function still raises ``NotImplementedError``): prints a line starting
  ``[TODO]`` and returns inferlab's reference implementation, so the rest of the lab runs. That is
  how a learner can skip ahead and how CI executes the unsolved labs.

The grader (``inferlab.course.grade``) does not trust what a notebook prints: it runs these checks
itself, on a fresh copy of this package's check modules, and learns which reference a check lends
by calling it with a function that is not attempted. A reference written for a check (a lambda
around a formula) names the package functions it stands for with ``lends``, so that a learner who
calls those directly is flagged too. The grader still reads the three tags, to flag printed ones
that its checks contradict; it imports them from here, which is why this module imports torch
only inside the functions that need it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    import torch

F = TypeVar("F", bound=Callable)

PASS, FAIL, TODO = "[PASS]", "[FAIL]", "[TODO]"


class CheckFailed(AssertionError):
    """An exercise's answer is wrong; the message says how and hints at why."""


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


def run_check(exercise: str, name: str, learner: F, reference: F,
              cases: Callable[[F], None], success: str = "") -> F:
    """Run ``cases(learner)``; return the learner's function, or the reference if not attempted.

    ``cases`` calls the function it is given and raises ``CheckFailed`` on a wrong answer.
    """
    if not callable(learner):
        raise CheckFailed(f"{FAIL} Exercise {exercise}: expected the function {name}, got "
                          f"{type(learner).__name__}. Pass the function itself, without calling it.")
    try:
        cases(learner)
    except NotImplementedError:
        print(f"{TODO} Exercise {exercise}: {name} is not attempted yet; using inferlab's "
              "reference implementation so the rest of the lab runs.")
        return reference
    except CheckFailed as failure:
        raise CheckFailed(f"{FAIL} Exercise {exercise} ({name}): {failure}") from None
    except Exception as error:  # the learner's code crashed: say where, keep the traceback
        raise CheckFailed(f"{FAIL} Exercise {exercise} ({name}) raised "
                          f"{type(error).__name__}: {error}") from error
    print(f"{PASS} Exercise {exercise}: {name} is correct{'; ' + success if success else '.'}")
    return learner
