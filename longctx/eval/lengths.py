"""Lengths as users write them ("4096", "8k", "1m") -> token counts.

Dependency-free: `longctx eval`'s configuration (eval/config.py) and the training config's
retrieval probe (config/probe.py) both read lengths this way, and the training config must not
load eval's configuration to do it.
"""
from __future__ import annotations

from typing import List

from longctx.base.errors import UserError


def parse_lengths(items: List[str], field: str = "eval.lengths") -> List[int]:
    """["4096", "8k", "1m"] -> sorted distinct token counts."""
    out = []
    for item in items:
        s = str(item).strip().lower()
        if not s:
            continue
        mult = 1
        if s.endswith("k"):
            s, mult = s[:-1], 1024
        elif s.endswith("m"):
            s, mult = s[:-1], 1024 * 1024
        try:
            value = int(float(s) * mult)
        except ValueError:
            raise UserError(f"{field}: {item!r} is not a length (use integers or 4k/8k-style values)") from None
        if value <= 0:
            raise UserError(f"{field}: lengths must be positive, got {item!r}")
        out.append(value)
    if not out:
        raise UserError(f"{field}: no lengths given")
    return sorted(set(out))
