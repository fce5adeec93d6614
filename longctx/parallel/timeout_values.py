"""The collective timeouts' defaults and their check, without torch: the config layers of
`longctx train` and `longctx eval` check a bad value before torch loads
(parallel/timeouts.py applies them)."""
from __future__ import annotations

import math

DEFAULT_TIMEOUT_S = 300.0  # from the first finished step on: parallel.timeout_s, eval.timeout_s
DEFAULT_STARTUP_TIMEOUT_S = 1800.0  # process groups, loading, the first step: *.startup_timeout_s


def timeout_problem(value) -> str | None:
    """Why `value` is not a usable timeout in seconds, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number of seconds, got {value!r}"
    if not math.isfinite(value) or value <= 0:
        return f"must be a finite number of seconds > 0, got {value}"
    return None
