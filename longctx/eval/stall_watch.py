"""A stalled rank ends a `longctx eval` of several processes (cp > 1, or dp over samples) as it
ends a training job (longctx/runtime/watchdog.py): one line naming the rank, each rank's Python stacks
in its stderr (torchrun's per-rank log), OUT/STALLED, exit code 86, which launch/torchrun.sh and
slurm/eval*.sbatch treat as a lost node; the finished cells are in OUT/cells/, and the same
command continues from them.

The limits are eval.startup_timeout_s until the first round of batches is done (loading,
process groups, the first prefill), eval.timeout_s from then on: a peer that stops answering
inside a batch is seen by the collective that waits for it. The watch thread publishes each
rank's progress, so the line says which rank went silent.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from longctx.eval.config import EvalConfig
from longctx.runtime.watchdog import STALLED_MARKER, Watchdog, is_collective_timeout

PHASE = "eval"  # a round of batches (decoding or a perplexity cell): held to the collective timeout


def start_watch(cfg: EvalConfig, rank: int, world: int, on_end: Callable[[], None] = lambda: None
                ) -> Optional[Watchdog]:
    """The rank's watch (None for one process: no peer to wait for). Rank 0 removes a STALLED an
    earlier run left in OUT (the SLURM scripts requeue on it). `on_end`: run by a stall's exit
    (the release of OUT's lock)."""
    if world == 1:
        return None
    out = Path(cfg.out) if cfg.out is not None else None
    if out is not None and rank == 0:
        (out / STALLED_MARKER).unlink(missing_ok=True)
    watchdog = Watchdog(rank=rank, world=world, timeout_s=cfg.timeout_s, startup_timeout_s=cfg.startup_timeout_s,
                        log_path=None, marker_dir=out, on_end=on_end, unit="batch round").start()
    watchdog.beat(PHASE, step=1)
    return watchdog


class WatchedStop:
    """The preemption flag, as the evaluation asks it after every round of batches (and after
    each perplexity cell): each ask is the rank's progress, and the first one switches every
    process group to the short timeout."""

    def __init__(self, flag, watchdog: Watchdog):
        self.flag, self.watchdog = flag, watchdog
        self._since = time.monotonic()

    def agreed(self) -> bool:
        stop = self.flag.agreed()
        now = time.monotonic()
        self.watchdog.step_done(now - self._since)
        self.watchdog.beat(PHASE, step=self.watchdog.step + 1)
        self._since = now
        return stop


@contextlib.contextmanager
def stalls_end_the_job(watchdog: Optional[Watchdog]) -> Iterator[None]:
    """A collective that gave up on a peer ends this rank with the stall's line and exit code."""
    try:
        yield
    except RuntimeError as e:
        if watchdog is not None and is_collective_timeout(e):
            watchdog.collective_failed(e)
        raise
