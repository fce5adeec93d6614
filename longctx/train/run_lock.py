"""One writer per run directory: `<out_dir>/.longctx.lock` names the job that trains there.

Rank 0 takes it before anything in `out_dir` is written and every rank agrees on the result.
A second job finding a live holder stops with one line naming it (it would interleave its
steps and checkpoints with the first's). A holder that is gone from this host, or whose SLURM
job is this one (a requeue after preemption or a node failure), is taken over with a notice.
A holder on another host that is not this SLURM job cannot be checked from here: the line says
how to clear it. A finished or failed job removes the file; a killed one leaves it for the
next job to judge.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from longctx.base.errors import UserError
from longctx.storage.locks import Holder, is_alive, read_holder, release, remove_dead, this_process, try_take

LOCK_NAME = ".longctx.lock"


def lock_path(out_dir: str | Path) -> Path:
    return Path(out_dir) / LOCK_NAME


def _refusal(path: Path, holder: Holder, alive: Optional[bool]) -> str:
    out_dir = path.parent
    if alive:
        return (f"out_dir: {out_dir} is in use by another training job ({holder.describe()}); wait for it, stop it, "
                "or choose another out_dir")
    return (f"out_dir: {out_dir} is locked by a job on {holder.host} ({holder.describe()}), which cannot be checked "
            f"from here; if that job is gone, remove {path}")


def _may_take_over(holder: Holder, me: Holder) -> Optional[str]:
    """Why `me` may take a lock `holder` has (the notice's reason), or None."""
    if holder.job and holder.job == me.job:
        return f"it is this SLURM job ({me.job}), requeued"
    if is_alive(holder) is False:
        return "it is no longer running"
    return None


def acquire(out_dir: str | Path, notify: Callable[[str], None]) -> Holder:
    """Take `out_dir`'s lock for this process (creating `out_dir`), or raise UserError naming
    the live holder."""
    path, me = lock_path(out_dir), this_process()
    while not try_take(path, me):
        holder = read_holder(path)
        if holder is None:
            continue  # released between our attempt and the read
        reason = _may_take_over(holder, me)
        if reason is None:
            raise UserError(_refusal(path, holder, is_alive(holder)))
        notify(f"taking over {path} from {holder.describe()}: {reason}")
        remove_dead(path, holder)
    return me


def release_lock(out_dir: str | Path, me: Holder) -> None:
    release(lock_path(out_dir), me)
