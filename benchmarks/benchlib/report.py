"""What every benchmark writes: the timing fields of a row (steps, warm-up, median, min, the step
times), markdown tables and JSON files."""
from __future__ import annotations

import json
import statistics

from .timing import Timing


def timing_fields(times: list[float] | Timing, warmup: int | None = None, prefix: str = "") -> dict:
    """{steps, warmup, median_s, min_s, times_s} of one contender (keys prefixed with `prefix`)."""
    if isinstance(times, Timing):
        times, warmup = times.times, times.warmup
    fields = {"steps": len(times), "warmup": warmup, "median_s": statistics.median(times), "min_s": min(times),
              "times_s": list(times)}
    return {prefix + k: v for k, v in fields.items()}


def markdown_table(header: list[str], rows: list[list], align: str = "") -> str:
    """A markdown table; `align` has one letter per column, "l" or "r" (default: all left)."""
    rule = ["---:" if a == "r" else "---" for a in align.ljust(len(header), "l")]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(str(c) for c in line) + " |" for line in lines)


def write_json(path: str, payload, indent: int = 1) -> None:
    with open(path, "w") as f:
        json.dump(payload, f, indent=indent)
        f.write("\n")
