"""Host memory of this process: RSS now, its peak (VmHWM), and a reset of the peak, plus the glibc
setting under which freed tensors leave the resident set at once (so RSS measures live memory)."""
from __future__ import annotations

import ctypes
import os

from longctx.train.metrics import peak_rss_bytes

__all__ = ["MMAP_THRESHOLD", "mmap_env", "peak_rss_bytes", "reset_peak", "return_freed_memory", "rss_bytes"]

# glibc serves smaller blocks from a heap it rarely returns to the OS; a fixed 64 KiB mmap
# threshold makes every tensor its own mapping, unmapped on free.
MMAP_THRESHOLD = 1 << 16
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def rss_bytes() -> int:
    """Resident set size of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> None:
    """Reset VmHWM (peak_rss_bytes) to the current RSS: the next peak is this step's."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def return_freed_memory() -> None:
    """In this process: blocks of MMAP_THRESHOLD or more are mmapped, so freeing returns them."""
    ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def mmap_env(env: dict | None = None) -> dict:
    """The environment of a child process with the same setting (glibc reads it at start-up)."""
    return {**(os.environ if env is None else env), "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
