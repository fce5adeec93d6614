"""The one-line checks the data sections share: a field's value, or a UserError naming it."""
from __future__ import annotations

from longctx.base.errors import UserError


def check_int(value, name: str, minimum: int = 1) -> None:
    """`value` is an integer (not a bool) >= minimum."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise UserError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def check_probability(value, name: str) -> None:
    """`value` is a number (not a bool) in [0, 1]."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 <= value <= 1):
        raise UserError(f"{name}: must be a probability in [0, 1], got {value!r}")
