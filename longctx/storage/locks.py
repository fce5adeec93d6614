"""A lock file judged by the liveness of the process that holds it, never by its age.

The file names its holder (host, pid, the pid's start time, when it was taken). A second
process finds it and looks: a holder on this host whose process is gone (or whose pid now
belongs to another process) is dead, and its lock is taken over at once with a notice; a live
holder is waited for with one line that says whom we wait for. A holder on another host cannot
be checked from here: it is waited for, and the line says how to clear the lock if that host is
gone. Releasing removes the file, so a finished holder leaves nothing behind.
"""
from __future__ import annotations

import json
import os
import socket
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Callable, Iterator, Optional


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    proc_start: Optional[int]  # the pid's start time in clock ticks since boot (None off Linux)
    taken: float  # time.time() when the lock was taken
    job: Optional[str] = None  # the SLURM job id it runs in (a requeued job is the same job)

    def describe(self) -> str:
        job = f" (SLURM job {self.job})" if self.job else ""
        return f"pid {self.pid} on {self.host}{job}, since {time.strftime('%H:%M:%S', time.localtime(self.taken))}"


_HOLDER_FIELDS = {f.name for f in dataclass_fields(Holder)}


def process_start(pid: int) -> Optional[int]:
    """The start time of `pid` (field 22 of /proc/PID/stat), None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # fields after the command name start at field 3


def this_process() -> Holder:
    return Holder(socket.gethostname(), os.getpid(), process_start(os.getpid()), time.time(),
                  os.environ.get("SLURM_JOB_ID") or None)


def is_alive(holder: Holder) -> Optional[bool]:
    """True/False for a holder on this host; None for one on another host (cannot tell)."""
    if holder.host != socket.gethostname():
        return None
    if holder.pid <= 0:
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    started = process_start(holder.pid)
    return holder.proc_start is None or started is None or started == holder.proc_start  # else a reused pid


def read_holder(path: Path) -> Optional[Holder]:
    """The holder named in `path`; None when the file is gone. A file that cannot be parsed
    (not written by this module) reads as a dead holder on this host."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        fields = json.loads(text)
        return Holder(**{k: v for k, v in fields.items() if k in _HOLDER_FIELDS})
    except (ValueError, TypeError, AttributeError):
        return Holder(socket.gethostname(), -1, None, 0.0)


def try_take(path: Path, me: Holder) -> bool:
    """Create `path` naming `me`, whole or not at all (written aside, then hard-linked, which
    fails when `path` exists); False when it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{me.host}.{me.pid}")
    try:
        aside.write_text(json.dumps(asdict(me)))
        os.link(aside, path)
        return True
    except FileExistsError:
        return False
    finally:
        with suppress(OSError):  # a full or read-only disk: the caller sees the write's error, not this one
            aside.unlink(missing_ok=True)


def remove_dead(path: Path, dead: Holder) -> None:
    """Remove `path` if it still names `dead`. Two processes taking over one dead holder at once
    must not let the second remove the lock the first has just taken: the check and the removal
    run under `path.break`, taken whole or not at all. A breaker that died there (it holds it for
    microseconds) is removed; the caller tries again either way."""
    breaker = path.with_name(f"{path.name}.break")
    me = this_process()
    if not try_take(breaker, me):
        other = read_holder(breaker)
        if other is not None and (is_alive(other) is False or time.time() - other.taken > 60):
            breaker.unlink(missing_ok=True)
        time.sleep(0.01)
        return
    try:
        if read_holder(path) == dead:
            path.unlink(missing_ok=True)
    finally:
        release(breaker, me)


def release(path: Path, me: Holder) -> None:
    """Remove `path` if `me` still holds it."""
    if read_holder(path) == me:
        path.unlink(missing_ok=True)


@contextmanager
def liveness_lock(path: Path, *, what: str, notify: Callable[[str], None], poll_s: float = 0.5,
                  expected: str = "") -> Iterator[Holder]:
    """Hold `path` for the block. `what` names the work (e.g. "the DeepSpeed build of cpu_adam");
    `expected` says how long such work takes, for the waiting line."""
    me = this_process()
    waited_for: Optional[Holder] = None
    while not try_take(path, me):
        holder = read_holder(path)
        if holder is None:
            continue  # released between our attempt and the read
        alive = is_alive(holder)
        if alive is False:
            notify(f"taking over {path}: its holder ({holder.describe()}) is no longer running")
            remove_dead(path, holder)
            continue
        if holder != waited_for:
            where = "" if alive else f"; if {holder.host} is gone, remove {path}"
            notify(f"waiting for {what} by {holder.describe()}{expected and f' ({expected})'}{where}")
            waited_for = holder
        time.sleep(poll_s)
    try:
        yield me
    finally:
        release(path, me)
