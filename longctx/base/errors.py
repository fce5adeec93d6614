"""Errors the user caused (config, paths, shapes).

The CLI prints `error: <message>` on one line and exits with code 2 for these; anything
else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input. The message names the field or file and says what would be valid."""


def require(cond: bool, message: str) -> None:
    if not cond:
        raise UserError(message)
