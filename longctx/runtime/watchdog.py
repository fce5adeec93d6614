"""A rank that stops making progress ends the job, says where, and lets the launcher requeue it.

Each rank of `longctx train` and `longctx eval` runs one daemon thread that watches the rank's
own progress (the main loop calls `beat` as it moves from phase to phase) and publishes it to
the job's c10d store every few seconds, so any rank can tell which peer went quiet. Two ways a
stall is seen:

- a collective gives up (parallel/timeouts.py): the main thread catches the error and calls
  `collective_failed`;
- a step's phase (data loading, compute) runs far longer than the run's own steps, with no
  collective to time out (a stuck file system, a rank spinning): the thread sees it.

Either way the rank writes every thread's Python stack to its log, prints one line naming the
stalled rank(s), the step and the phase, leaves STALLED (that line) in the run directory for
the launchers, and exits with STALLED_EXIT_CODE; torchrun's agent then ends the other workers,
and launch/torchrun.sh and slurm/*.sbatch requeue the job as for a lost node. File-system work
runs in a helper thread with a deadline, so a stuck file system cannot keep the process alive.
"""
from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import re
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Callable, Iterator, NoReturn, Optional

from longctx.parallel.timeouts import set_collective_timeout
from longctx.storage import atomic

STALLED_EXIT_CODE = 86  # launchers requeue it, as a lost node
STALLED_MARKER = "STALLED"  # in the run directory: the line that ended the job
STEP_MULTIPLE = 4  # a step's phase may last timeout_s + this many times the slowest step so far
POLL_S = 1.0
PUBLISH_EVERY_S = 2.0
SILENT_AFTER_S = 10.0  # a peer whose thread published nothing for this long is stopped or cut off
STORE_TIMEOUT_S = 10.0
REPORT_DEADLINE_S = 30.0  # the stacks, the marker and the lock release, at most
KEY = "longctx/progress/{rank}"
DONE = "done"  # a rank whose work is over (it waits at the last barrier, or has exited): not silent
IN_STEP = ("data", "compute")  # the phases held to the step-time limit; between steps: the start-up one

log = logging.getLogger("longctx.runtime.watchdog")


# What torch raises when a collective gave up on a peer: its timeout ran out, or the peer's
# process or node is gone. Matched on the message, the only place torch says it (gloo raises a
# plain RuntimeError; NCCL a DistBackendError, a RuntimeError too). Any other "timeout" (a Hub
# download, a DataLoader's own) is a bug or a user error with its own report, not a stall.
LOST_PEER = re.compile("|".join((
    r"timed out waiting \d+ ?ms for (send|recv) operation",  # gloo: the collective's timeout
    r"application timeout caused pair closure",  # gloo: a peer's side timed out first
    r"connection (closed|reset) by peer",  # gloo: the peer's process or node went away
    r"watchdog caught collective operation timeout",  # NCCL's watchdog (async error handling)
    r"ran for \d+ milliseconds before timing out",
    r"nccl communicator was aborted",  # a timed-out NCCL collective, seen by the waiting call
    r"remote process exited or there was a network error",  # ncclRemoteError
    r"some nccl operations have failed or timed out",
)), re.IGNORECASE)


def is_collective_timeout(exc: BaseException) -> bool:
    """A collective that gave up waiting for its peers (gloo's or NCCL's timeout, a peer gone),
    raised as is or as the cause of another error (DeepSpeed re-raises some)."""
    seen = 0
    while exc is not None and seen < 4:
        if isinstance(exc, RuntimeError) and LOST_PEER.search(str(exc)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class PeerProgress:
    """Each rank's last progress in the job's c10d store (the launcher's, or rank 0's): a client
    of its own, with a short timeout, so a stopped peer or host cannot block the reader long."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self._store = None
        self._lock = threading.Lock()  # one client, used by the watch thread and a stalled main thread

    def _client(self):
        if self._store is None:
            import torch.distributed as dist  # the job has it loaded already

            self._store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                        timeout=timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=False)
        return self._store

    def publish(self, step: int, phase: str, idle_s: float) -> None:
        record = {"step": step, "phase": phase, "idle_s": round(idle_s, 1), "time": time.time()}
        with self._lock:
            self._client().set(KEY.format(rank=self.rank), json.dumps(record))

    def close(self) -> None:
        """Drop the store client (the watch thread has ended)."""
        with self._lock:
            self._store = None

    def read(self) -> dict[int, dict]:
        found = {}
        with self._lock:
            store = self._client()
            for rank in range(self.world):
                key = KEY.format(rank=rank)
                if store.check([key]):
                    found[rank] = json.loads(store.get(key))
        return found


def describe_peers(progress: dict[int, dict], me: int, world: int, limit_s: float, now: float,
                   unit: str = "step") -> list[str]:
    """The ranks that look stalled, each with where it was: silent (its process stopped or cut
    off) or stuck in one phase for at least half the limit. `unit`: what a step is called."""
    found = []
    for rank in range(world):
        if rank == me:
            continue
        p = progress.get(rank)
        if p is None:
            found.append(f"rank {rank} never reported progress")
            continue
        if p["phase"] == DONE:  # finished its work: waits for the others, or has exited
            continue
        quiet = now - p["time"]
        if quiet > SILENT_AFTER_S:
            found.append(f"rank {rank} silent for {quiet:.0f} s (stopped or cut off; last at {unit} {p['step']}, "
                         f"phase {p['phase']})")
        elif p["idle_s"] >= limit_s / 2:
            found.append(f"rank {rank} stuck for {p['idle_s']:.0f} s at {unit} {p['step']}, phase {p['phase']}")
    return found


class Watchdog:
    """One rank's stall watch. `log_path`: the rank's log (stacks are appended); `marker_dir`:
    where STALLED goes (None: nowhere); `on_end`: run before the exit (release a lock); `unit`:
    what the line calls a step (an evaluation counts its rounds of batches)."""

    def __init__(self, *, rank: int, world: int, timeout_s: float, startup_timeout_s: float,
                 log_path: Optional[Path], marker_dir: Optional[Path], on_end: Callable[[], None] = lambda: None,
                 peers: Optional[PeerProgress] = None, unit: str = "step"):
        self.rank, self.world, self.unit = rank, world, unit
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
        self.log_path, self.marker_dir, self.on_end = log_path, marker_dir, on_end
        self.peers = peers if peers is not None else (PeerProgress(rank, world) if world > 1 else None)
        self.step, self.phase = 0, "start-up"
        self.steady = False  # the first step has finished: the short limits apply
        self.slowest_step_s = 0.0
        self._last = time.monotonic()
        self._ending = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="longctx-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        """The rank's work is over: the watch publishes it as done (a peer that still writes its
        reports must not take this rank's quiet for a stall) and ends. The thread is joined and
        its store client closed here: a daemon thread still inside a store call when the
        interpreter exits aborts the process ("terminate called without an active exception")."""
        self.beat(DONE)
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(STORE_TIMEOUT_S + 2 * POLL_S)
        if self.peers is not None and not self._thread.is_alive():
            self.peers.close()

    # ------------------------------------------------------------ what the main loop says
    def beat(self, phase: str, step: Optional[int] = None) -> None:
        """Progress: the rank enters `phase` (of `step`)."""
        if step is not None:
            self.step = step
        self.phase, self._last = phase, time.monotonic()

    def step_done(self, seconds: float) -> None:
        """A step finished in `seconds`; after the first one, collectives get the short timeout."""
        if self.steady:
            self.slowest_step_s = max(self.slowest_step_s, seconds)
        else:
            self.steady = True
            set_collective_timeout(self.timeout_s)
        self.beat("between steps")

    @contextlib.contextmanager
    def slow_phase(self, phase: str) -> Iterator[None]:
        """A phase allowed the start-up timeout, collectives included (a checkpoint save: rank 0
        may write for minutes while the others wait at a barrier)."""
        self.beat(phase)
        set_collective_timeout(self.startup_timeout_s)
        try:
            yield
        finally:
            if self.steady:
                set_collective_timeout(self.timeout_s)
            self.beat("between steps")

    def collective_timeout_s(self) -> float:
        """The collective timeout now (for a process group created from here on)."""
        return self.timeout_s if self.steady else self.startup_timeout_s

    def limit_s(self) -> float:
        """How long the current phase may go without progress."""
        if not self.steady or self.phase not in IN_STEP:
            return self.startup_timeout_s
        return self.timeout_s + STEP_MULTIPLE * self.slowest_step_s  # past a collective's own timeout

    # ------------------------------------------------------------------------ the watch
    def _watch(self) -> None:
        published, published_step, checked = -PUBLISH_EVERY_S, -1, -PUBLISH_EVERY_S
        while True:  # publishes at once, then every PUBLISH_EVERY_S and at each new step
            now = time.monotonic()
            idle = now - self._last
            if self.peers is not None and (now - published >= PUBLISH_EVERY_S or self.step != published_step):
                published, published_step = now, self.step
                try:
                    self.peers.publish(self.step, self.phase, idle)
                except Exception as e:  # noqa: BLE001 - the store's host may be gone; the watch goes on
                    log.warning("watchdog: cannot publish progress (%s)", e)
            if idle > self.limit_s():
                self.stalled(f"rank {self.rank} made no progress for {idle:.0f} s at {self.unit} {self.step}, phase "
                             f"{self.phase} (limit {self.limit_s():.0f} s)", own=True)
            # waiting longer than timeout_s in a phase with the long limit (a checkpoint save, a
            # barrier): a peer whose watch went silent as long is stopped or cut off, not slow.
            # The store is read only then, so a large job's steady steps cost it nothing.
            if self.peers is not None and idle > self.timeout_s and now - checked >= PUBLISH_EVERY_S:
                checked = now
                if self._silent_peers():
                    self.stalled(f"rank {self.rank} waiting for {idle:.0f} s at {self.unit} {self.step}, phase "
                                 f"{self.phase}", own=False)
            if self._stop.wait(POLL_S):
                self._publish_done()
                return

    def _publish_done(self) -> None:
        if self.peers is not None:
            try:
                self.peers.publish(self.step, DONE, 0.0)
            except Exception as e:  # noqa: BLE001 - best effort, on the way out
                log.debug("watchdog: cannot publish the end (%s)", e)

    def _silent_peers(self) -> list[int]:
        """The peers that reported once and then nothing for longer than timeout_s (their watch
        thread runs whatever their main thread does; hosts' clocks may differ by seconds)."""
        try:
            progress = self.peers.read()
        except Exception:  # noqa: BLE001 - the store's host may be the stopped one: the collective decides
            return []
        silent_s = max(self.timeout_s, SILENT_AFTER_S)
        return [rank for rank, p in progress.items()
                if rank != self.rank and p["phase"] != DONE and time.time() - p["time"] > silent_s]

    def collective_failed(self, exc: BaseException) -> NoReturn:
        """The main thread's end after a collective timed out (is_collective_timeout)."""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        limit = self.timeout_s if self.steady else self.startup_timeout_s
        self.stalled(f"rank {self.rank} at {self.unit} {self.step}, phase {self.phase}: a collective gave up after "
                     f"{limit:.0f} s ({first[:200]})", own=False,
                     detail="".join(traceback.format_exception(exc)))

    def stalled(self, what: str, *, own: bool, detail: str = "") -> NoReturn:
        """Report and exit (once per process; a second caller waits for the exit). `detail`: more
        for the rank's log (the failed collective's traceback)."""
        self._ending.acquire()
        line = self._line(what, own)
        print(line, file=sys.stderr, flush=True)
        report = threading.Thread(target=self._report, args=(line, detail), name="longctx-stall-report",
                                  daemon=True)
        report.start()
        report.join(REPORT_DEADLINE_S)
        os._exit(STALLED_EXIT_CODE)

    def _line(self, what: str, own: bool) -> str:
        peers = []
        if self.peers is not None:
            try:
                peers = describe_peers(self.peers.read(), self.rank, self.world, self.timeout_s, time.time(), self.unit)
            except Exception as e:  # noqa: BLE001 - the store's host may be the stopped one
                peers = [f"the other ranks' progress is unknown ({type(e).__name__})"]
        parts = [what, *peers] if own else [*peers, what]  # the stalled rank first
        where = f"; stacks in {self.log_path.parent}/" if self.log_path is not None else "; stacks in each rank's log"
        return f"error: stalled: {'; '.join(parts)}{where}; exit code {STALLED_EXIT_CODE} (resume to continue)"

    def _report(self, line: str, detail: str) -> None:
        """The line, `detail` and the stacks into the rank's log (not through logging: rank 0's
        console has the line already; no log: stderr, which torchrun keeps per rank with
        --log-dir), STALLED into the run directory, then on_end."""
        try:
            if self.log_path is not None:
                with open(self.log_path, "a") as f:
                    _write_stacks(f, f"{line}\n{detail}", self.rank)
            else:
                _write_stacks(sys.stderr, detail, self.rank)
            if self.marker_dir is not None:
                atomic.write_text(self.marker_dir / STALLED_MARKER, line + "\n")
            self.on_end()
        except Exception as e:  # noqa: BLE001 - the exit comes anyway
            print(f"watchdog: report incomplete ({e})", file=sys.stderr, flush=True)


def _write_stacks(f, header: str, rank: int) -> None:
    f.write(f"{header}--- rank {rank}: Python stacks at the stall ---\n")
    f.flush()
    faulthandler.dump_traceback(f, all_threads=True)


def watched_batches(batches: Iterator, watchdog: Watchdog) -> Iterator:
    """`batches`, with the phase marked around each: "data" while the next one loads, "compute"
    once it is there (a step takes grad_accum of them)."""
    while True:
        watchdog.beat("data")
        try:
            batch = next(batches)
        except StopIteration:
            return
        watchdog.beat("compute")
        yield batch
