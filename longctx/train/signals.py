"""Preemption: SIGUSR1 / SIGTERM ask the trainer to finish the current step, save a
checkpoint and exit with PREEMPTED_EXIT_CODE, which the SLURM script turns into a requeue.

A second signal while saving only sets the flag again: the save is never interrupted
(and checkpoints are atomic anyway, so even SIGKILL cannot leave a partial one that counts).
A SIGUSR1 that arrives after the work finished (a time budget or SLURM's warning just too late)
does nothing while the process exits: its default action would kill a finished run, and the
launcher would report it as failed. Once the ranks agree on a signal, stopped_in_startup /
stopped_after_save write the PREEMPTED marker and say where the next start continues.
"""
from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from longctx.runtime import startup

PREEMPTED_EXIT_CODE = 85
PREEMPTED_MARKER = "PREEMPTED"  # written in the run directory (holds the saved step)
HANDLED = startup.HANDLED
log = logging.getLogger("longctx.train")


class PreemptionFlag:
    def __init__(self) -> None:
        self.received: Optional[int] = None
        self._previous = {}

    def install(self) -> "PreemptionFlag":
        for sig in HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)
        if self.received is None:  # a signal during start-up, recorded since the first statement
            self.received = startup.received()
        return self

    def uninstall(self) -> None:
        if self.received is not None:
            # Exiting for preemption: ignore repeats until the process ends. (SIG_IGN, not a
            # Python handler: the interpreter resets those to the default, fatal action at exit.)
            for sig in self._previous:
                signal.signal(sig, signal.SIG_IGN)
            return
        for sig, handler in self._previous.items():
            # SIGUSR1 only warns of a stop: with the work done, its default action (terminate) would
            # turn a finished run into a failure during teardown. A Python handler, not SIG_IGN:
            # exec resets handlers to the default but keeps SIG_IGN, and a shell started with
            # SIGUSR1 ignored cannot trap it (the launchers' time budgets rely on that trap).
            late_warning = sig == signal.SIGUSR1 and handler == signal.SIG_DFL
            signal.signal(sig, _after_the_work if late_warning else handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        self.received = signum

    def agreed(self) -> bool:
        """True on every rank if any rank was signalled (one tiny all-reduce per step)."""
        flag = torch.tensor([1.0 if self.received is not None else 0.0])
        if dist.is_initialized() and dist.get_world_size() > 1:
            if dist.get_backend() == "nccl":
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


def _after_the_work(signum, frame) -> None:  # noqa: ARG001
    """SIGUSR1 once the work finished: nothing left to stop."""


def stopped_in_startup(flag: PreemptionFlag, rank: int, out: Path, resumes: Optional[Path]) -> None:
    """The ranks agreed on a signal before the first step: rank 0 writes PREEMPTED with the step
    the next start continues from (`resumes`' number, 0: none), so launchers requeue; nothing
    else was written that the next start would find."""
    step = int(resumes.name.split("_")[-1]) if resumes is not None else 0  # its name: it may not verify
    name = signal.Signals(flag.received).name if flag.received else "a signal on another rank"
    after = f"resumes from step {step}" if step else "starts the run"
    log.warning("preemption signal %s during start-up: stopping before the first step, exit %d",
                name, PREEMPTED_EXIT_CODE)
    if rank == 0:
        (out / PREEMPTED_MARKER).write_text(f"{step}\n")
        print(f"preempted ({name}) during start-up, before the first step: nothing trained; exit code "
              f"{PREEMPTED_EXIT_CODE}; the same command {after}", file=sys.stderr, flush=True)


def stopped_after_save(flag: PreemptionFlag, rank: int, out: Path, step: int, progress) -> None:
    """The ranks agreed on a signal and step `step` is saved: rank 0 writes PREEMPTED with it and
    says so on `progress` (the run's Progress)."""
    log.warning("preemption signal %s: checkpoint saved at step %d, exiting with %d",
                flag.received, step, PREEMPTED_EXIT_CODE)
    if rank == 0:
        # torchrun reports its own exit code, so launchers can also read this marker
        (out / PREEMPTED_MARKER).write_text(f"{step}\n")
        progress.write(f"preempted: saved step {step}, exit code {PREEMPTED_EXIT_CODE}")
