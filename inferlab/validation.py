"""The two checks on sizes that every constructor in the package makes, worded one way.

A size that is zero, negative or not a number would give a silently wrong result (an empty
cache, a division by zero much later); these raise at once, naming the argument and the value.
"""

from __future__ import annotations


def positive(prefix: str = "", **values: float) -> None:
    """Raise ``ValueError`` unless every value is a number greater than 0."""
    for name, value in values.items():
        if isinstance(value, bool) or not value > 0:
            raise ValueError(f"{prefix}{name} must be positive, got {value!r}")


def positive_ints(prefix: str = "", **values: int) -> None:
    """Raise ``ValueError`` unless every value is an ``int`` (not a bool) greater than 0."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{prefix}{name} must be a positive integer, got {value!r}")
