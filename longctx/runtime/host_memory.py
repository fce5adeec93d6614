"""Host memory that stays flat over a run of days: freed heap pages given back to the system.

glibc serves a large block with a mapping of its own, unmapped when freed, and smaller ones from
heaps that give memory back only from their top. Its threshold between the two rises with the
largest block freed (up to 32 MiB), so after the first steps a step's activation-sized tensors
come from the heaps. Where their sizes change from step to step (rows whose unscored tails are
cut: packed documents with padding, as in the demo's extension at micro-batch 4), freed space
fits the next requests only in part, every gap pinned by a small allocation that lives on stays
resident, and each process's resident set creeps up step after step (the demo's extension: its
peak from 0.63 to 1.33 GiB over 350 steps).

HostMemoryGuard watches the resident set after each step. Its reference is the largest set of
the first WARMUP steps (a step's freed tensors stay in the heap for the next step: that is
wanted); once the set has grown GROWTH past it, glibc is asked to return every free page
(malloc_trim). A trim costs the next steps the page faults of the pages it returned, so it runs
only when the set has crept, not every step: two trims fewer than MIN_GAP steps apart mean the
steps' own working set is larger than the reference, which then rises to it. A fixed mmap
threshold (every block of 64 KiB or more mapped) keeps the set flat too, but pays those faults
on every step: a third slower on the demo's extension on CPU. Measured in
docs/results/2026-12-06-host-memory.md. Other C libraries than glibc are left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Optional

GROWTH = 1.04  # the resident set may grow 4% past its reference before free pages are returned
WARMUP = 20  # steps whose largest resident set is the first reference
MIN_GAP = 10  # trims closer than this raise the reference to the set before the trim


def rss_bytes() -> int:
    """This process's resident set now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _glibc() -> Optional[ctypes.CDLL]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "malloc_trim") else None


class HostMemoryGuard:
    """`after_step()` once per training step; `trims` counts the trims so far."""

    def __init__(self, growth: float = GROWTH, warmup: int = WARMUP, min_gap: int = MIN_GAP):
        self.growth, self.warmup, self.min_gap = growth, warmup, min_gap
        self.reference = 0
        self.steps = 0
        self.trims = 0
        self._last_trim: Optional[int] = None
        self._libc = _glibc()

    def after_step(self) -> None:
        if self._libc is None:
            return
        self.steps += 1
        rss = rss_bytes()
        if self.steps <= self.warmup:
            self.reference = max(self.reference, rss)
        elif rss > self.growth * self.reference:
            if self._last_trim is not None and self.steps - self._last_trim < self.min_gap:
                self.reference = rss  # the steps' own working set: keep it
            self._libc.malloc_trim(0)
            self.trims += 1
            self._last_trim = self.steps
