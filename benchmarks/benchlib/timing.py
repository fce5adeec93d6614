"""Interleaved timing: every contender is warmed up, then timed in round-robin rounds (A B C A B C
...), so a drift of the machine's load hits all contenders alike. Median and min come from the
timed steps only."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

DEFAULT_STEPS = 5
DEFAULT_WARMUP = 1


@dataclass
class Timing:
    """One contender's timed steps (seconds, in the order they ran) and its untimed warm-up count."""

    times: list[float]
    warmup: int

    @property
    def steps(self) -> int:
        return len(self.times)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times)

    @property
    def min_s(self) -> float:
        return min(self.times)


def interleaved(contenders: dict[str, Callable[[], object]], steps: int = DEFAULT_STEPS,
                warmup: int = DEFAULT_WARMUP, clock: Callable[[], float] = time.perf_counter,
                before: Callable[[str], None] | None = None,
                after: Callable[[str], None] | None = None) -> dict[str, Timing]:
    """Call each contender `warmup` times untimed, then `steps` timed rounds, one call of each
    contender per round in the dict's order. `before(name)` / `after(name)` run around every timed
    call, outside the clock (a barrier, a memory reset and reading, ...)."""
    if steps < 1:
        raise ValueError(f"steps: {steps}; valid: an integer >= 1")
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(steps):
        for name, fn in contenders.items():
            if before is not None:
                before(name)
            start = clock()
            fn()
            times[name].append(clock() - start)
            if after is not None:
                after(name)
    return {name: Timing(ts, warmup) for name, ts in times.items()}


def slowest_rank(per_rank: list[list[float]]) -> list[float]:
    """Step times of a multi-rank contender: per step, the slowest rank's (the step ends there)."""
    return [max(ts) for ts in zip(*per_rank)]
