"""A rank that stops making progress ends the job, says where, and lets the launcher requeue it.

Each rank of `longctx train` and `longctx eval` runs one daemon thread that watches the rank's
own progress (the main loop calls `beat` as it moves from phase to phase). A second thread, the
courier (runtime/peer_progress.py), carries that progress to the job's c10d store and the
others' back, so any rank can tell which peer went quiet; the watch never waits on the network.
A stall is seen four ways:

- a collective or a point-to-point wait gives up (parallel/timeouts.py): the main thread
  catches the error and calls `collective_failed`;
- a phase runs longer than its limit with no collective to time out (a stuck file system, a
  rank spinning): the watch sees it (`limit_s`);
- while this rank waits longer than timeout_s, a peer's progress stops changing (its process
  stopped, its node cut off or lost);
- the job's store stops answering this rank for longer than that (this node cut off, or the
  store's node lost).

Whichever comes first, the rank writes every thread's Python stack to its log, leaves STALLED
(the line) in the run directory for the launchers, and exits with STALLED_EXIT_CODE; the first
rank of the job to report (a counter in the store) also prints the line, naming the stalled
rank(s), the step, the phase and the limit that ran out. torchrun's agent then ends the other
workers, and launch/torchrun.sh and slurm/*.sbatch requeue the job as for a lost node.
File-system work runs in a helper thread with a deadline, so a stuck file system cannot keep
the process alive.

The watch itself cannot stop quietly: an error inside it is logged once (each distinct error)
and the watch goes on; when it has failed at every look for longer than timeout_s, the rank
ends with a line that says so (a rank nobody watches could hang for ever).
"""
from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Hashable, Iterator, NoReturn, Optional

from longctx.parallel.mesh import last_barrier
from longctx.parallel.timeouts import set_collective_timeout
from longctx.runtime.peer_progress import (
    DONE,
    STORE_TIMEOUT_S,
    PeerProgress,
    describe_peers,
    silent_ranks,
    store_address,
)
from longctx.storage import atomic

STALLED_EXIT_CODE = 86  # launchers requeue it, as a lost node
STALLED_MARKER = "STALLED"  # in the run directory: the line that ended the job
STEP_MULTIPLE = 4  # a step's phase may last timeout_s + this many times the slowest step of its shape
WARM_STEPS = 3  # the first steps of a shape (a run's start, a stage, a resume) have the start-up limit
POLL_S = 1.0
REPORT_DEADLINE_S = 30.0  # the stacks, the marker and the lock release, at most
CLAIM_WAIT_S = 3.0  # how long the reporting rank asks the store whether another rank reported first
DESCRIBE_SILENT_WRITES = 2  # a stall line names a peer whose progress missed this many writes
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
    r"tcp/pair\.cc:\d+\] (read|write) error \[",  # gloo: the link to the peer's node failed (timed out)
    r"watchdog caught collective operation timeout",  # NCCL's watchdog (async error handling)
    r"ran for \d+ milliseconds before timing out",
    r"nccl communicator was aborted",  # a timed-out NCCL collective, seen by the waiting call
    r"remote process exited or there was a network error",  # ncclRemoteError
    r"some nccl operations have failed or timed out",
)), re.IGNORECASE)

TIMED_OUT = re.compile(r"timed out waiting|timeout|milliseconds before timing out", re.IGNORECASE)


def is_collective_timeout(exc: BaseException) -> bool:
    """A collective that gave up waiting for its peers (gloo's or NCCL's timeout, a peer gone),
    raised as is or as the cause of another error (DeepSpeed re-raises some)."""
    seen = 0
    while exc is not None and seen < 4:
        if isinstance(exc, RuntimeError) and LOST_PEER.search(str(exc)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class StepTimes:
    """The finished steps of one shape (a stage's sequence length, cp mesh and micro-batch: its
    kernels, its communicators): how many, and the slowest (the first included)."""

    def __init__(self):
        self.count, self.slowest_s = 0, 0.0

    def add(self, seconds: float) -> None:
        self.count, self.slowest_s = self.count + 1, max(self.slowest_s, seconds)


class Watchdog:
    """One rank's stall watch. `log_path`: the rank's log (stacks are appended); `marker_dir`:
    where STALLED goes (None: nowhere); `on_end`: run before the exit (release a lock); `peers`:
    the courier (default: one on the job's store when world > 1); `unit`: what the line calls a
    step (an evaluation counts its rounds of batches)."""

    def __init__(self, *, rank: int, world: int, timeout_s: float, startup_timeout_s: float,
                 log_path: Optional[Path], marker_dir: Optional[Path], on_end: Callable[[], None] = lambda: None,
                 peers: Optional[PeerProgress] = None, unit: str = "step"):
        self.rank, self.world, self.unit = rank, world, unit
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
        self.log_path, self.marker_dir, self.on_end = log_path, marker_dir, on_end
        self.peers = peers if peers is not None else (PeerProgress(rank, world) if world > 1 else None)
        self.step, self.phase = 0, "start-up"
        self.shape: Hashable = None
        self._steps: dict[Hashable, StepTimes] = {None: StepTimes()}  # read by the watch: an entry exists
        self._any_step_done = False  # before its shape is published, and is never removed
        self.collective_s = startup_timeout_s  # the collective timeout now
        self._last = time.monotonic()
        self._ending = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="longctx-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        if self.peers is not None:
            self.peers.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        """The rank's work is over: the courier publishes it as done (a peer that still writes
        its reports must not take this rank's quiet for a stall) and both threads end. They are
        joined here: a daemon thread still inside a store call when the interpreter exits aborts
        the process ("terminate called without an active exception")."""
        self.beat(DONE)
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2 * POLL_S)
        if self.peers is not None:
            self.peers.close({"step": self.step, "phase": DONE, "idle_s": 0.0}, wait_s=3 * STORE_TIMEOUT_S)

    # ------------------------------------------------------------ what the main loop says
    def beat(self, phase: str, step: Optional[int] = None) -> None:
        """Progress: the rank enters `phase` (of `step`; a new step goes to the courier at once)."""
        if step is not None and step != self.step:
            self.step = step
            if self.peers is not None:
                self.peers.post(step, phase, 0.0)
        self.phase, self._last = phase, time.monotonic()

    @property
    def steady(self) -> bool:
        """A step of the current shape has finished: collectives get the short timeout."""
        return self._steps[self.shape].count > 0

    def new_shape(self, shape: Hashable) -> None:
        """The steps from here on have another shape (a stage: another sequence length, cp mesh,
        fresh communicators): until one of them has finished, collectives get the start-up
        timeout again, and until WARM_STEPS of them have, their phases the start-up limit."""
        self._steps.setdefault(shape, StepTimes())  # first: the watch may read the new shape at once
        self.shape = shape
        self._set_collective(self.collective_timeout_s())

    def step_done(self, seconds: float) -> None:
        """A step of the current shape finished in `seconds`; collectives get the short timeout."""
        self._steps[self.shape].add(seconds)
        self._any_step_done = True
        self._set_collective(self.timeout_s)
        self.beat("between steps")

    @contextlib.contextmanager
    def slow_phase(self, phase: str) -> Iterator[None]:
        """A phase allowed the start-up timeout, collectives included (a checkpoint save: rank 0
        may write for minutes while the others wait at a barrier)."""
        self.beat(phase)
        self._set_collective(self.startup_timeout_s)
        try:
            yield
        finally:
            self._set_collective(self.collective_timeout_s())
            self.beat("between steps")

    def _set_collective(self, seconds: float) -> None:
        if seconds != self.collective_s:
            set_collective_timeout(seconds)
            self.collective_s = seconds

    def collective_timeout_s(self) -> float:
        """The collective timeout between steps (for a process group created from here on)."""
        return self.timeout_s if self.steady else self.startup_timeout_s

    def limit_s(self) -> float:
        """How long the current phase may go without progress. A step's phases: timeout_s plus
        STEP_MULTIPLE times the slowest step of this shape so far (never shorter than the
        collective timeout, so a collective's own error comes first), once WARM_STEPS steps of
        the shape have run; before that, and between steps, the start-up limit."""
        times = self._steps[self.shape]
        if self.phase not in IN_STEP or times.count < WARM_STEPS:
            return self.startup_timeout_s
        return self.timeout_s + STEP_MULTIPLE * times.slowest_s

    def cutoff_limit_s(self) -> float:
        """How long the job's store may leave this rank unanswered: as long as a silent peer
        (timeout_s, or the courier's silence threshold when longer); the start-up limit before
        the run's first step (a store busy with a large job's rendezvous)."""
        if not self._any_step_done:
            return self.startup_timeout_s
        return max(self.timeout_s, self.peers.silent_after_s)

    # ------------------------------------------------------------------------ the watch
    def _watch(self) -> None:
        failing_since: Optional[float] = None  # every look failed since (monotonic)
        logged: set[str] = set()
        while True:
            try:
                self._look()
                failing_since = None
            except Exception as e:  # noqa: BLE001 - a bug in the watch must not end the watching
                now, what = time.monotonic(), f"{type(e).__name__}: {e}"[:200]
                failing_since = now if failing_since is None else failing_since
                if what not in logged:
                    logged.add(what)
                    log.error("watchdog: rank %d's stall watch failed (%s); it goes on", self.rank, what,
                              exc_info=True)
                if now - failing_since > self.timeout_s:
                    self.stalled(f"rank {self.rank}'s stall watch has failed for {now - failing_since:.0f} s "
                                 f"({what}) at {self.unit} {self.step}, phase {self.phase}: nothing watches this "
                                 "rank (a bug: please report it)", own=True)
            if self._stop.wait(POLL_S):
                return

    def _look(self) -> None:
        """One look of the watch: this rank's progress to the courier, its own limit, its peers."""
        idle = time.monotonic() - self._last
        if self.peers is not None:
            self.peers.post(self.step, self.phase, idle)
        limit = self.limit_s()
        if idle > limit:
            self.stalled(f"rank {self.rank} made no progress for {idle:.0f} s at {self.unit} {self.step}, phase "
                         f"{self.phase} (limit {limit:.0f} s)", own=True)
        if self.peers is not None:
            self._judge_peers(idle)

    def _judge_peers(self, idle: float) -> None:
        """Waiting longer than timeout_s (in any phase, a checkpoint save's too): a peer whose
        progress stopped changing is stopped or cut off, not slow; a store that stopped
        answering means this node is cut off (or the store's node is gone). The store is read
        only then, so a large job's steady steps cost it nothing."""
        unanswered = self.peers.unanswered_s()
        if unanswered > self.cutoff_limit_s():
            self.stalled(f"rank {self.rank} cut off: the job's store ({store_address()}) has not answered for "
                         f"{unanswered:.0f} s (this node's network, or the store's node, is gone) at {self.unit} "
                         f"{self.step}, phase {self.phase}", own=True)
        if idle <= self.timeout_s:
            return
        self.peers.want_read()
        progress, read_at = self.peers.progress()
        if read_at is None or read_at < self._last:  # not read during this wait yet
            return
        silent_s = max(self.timeout_s, self.peers.silent_after_s)
        if silent_ranks(progress, self.rank, silent_s):
            self.stalled(f"rank {self.rank} waiting for {idle:.0f} s at {self.unit} {self.step}, phase "
                         f"{self.phase}", own=False)

    def collective_failed(self, exc: BaseException) -> NoReturn:
        """The main thread's end after a collective timed out (is_collective_timeout)."""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        how = (f"gave up after {self.collective_s:.0f} s" if TIMED_OUT.search(first)
               else "lost its peer")  # a connection reset or timed out below the collective's own limit
        self.stalled(f"rank {self.rank} at {self.unit} {self.step}, phase {self.phase}: a collective {how} "
                     f"({first[:200]})", own=False, detail="".join(traceback.format_exception(exc)))

    def stalled(self, what: str, *, own: bool, detail: str = "") -> NoReturn:
        """Report and exit (once per process; a second caller waits for the exit). The first rank
        of the job to report prints the line (and one that cannot ask the store: a node cut off
        has no other voice); every rank writes it to its log and leaves STALLED when none is there.
        `detail`: more for the rank's log (the failed collective's traceback)."""
        self._ending.acquire()
        try:
            first = self.peers.claim_report(CLAIM_WAIT_S) if self.peers is not None else True
            if first and self.peers is not None:
                self._look_at_peers()
            line = self._line(what, own)
            if first is not False:
                print(line, file=sys.stderr, flush=True)
            report = threading.Thread(target=self._report, args=(line, detail, first is not False),
                                      name="longctx-stall-report", daemon=True)
            report.start()
            report.join(REPORT_DEADLINE_S)
        except BaseException as e:  # noqa: BLE001 - the rank ends with its line whatever failed in the report
            print(f"error: stalled: {what}; exit code {STALLED_EXIT_CODE} (resume to continue; the report failed: "
                  f"{type(e).__name__}: {e})", file=sys.stderr, flush=True)
        os._exit(STALLED_EXIT_CODE)

    def describe_silent_s(self) -> float:
        """A stall line names a peer as silent when its key has not changed for this long."""
        return DESCRIBE_SILENT_WRITES * self.peers.publish_every_s + POLL_S

    def _look_at_peers(self) -> None:
        """The others' progress as it is now, for the line. Silence is seen only across reads (the
        reader's clock): when a peer's key was first read just now, a second read after
        describe_silent_s tells a silent peer from a live one (a few seconds, once per job)."""
        self.peers.read_now(STORE_TIMEOUT_S)
        progress, read_at = self.peers.progress()
        window = self.describe_silent_s() + 0.5
        if read_at is None or all(p["phase"] == DONE or p["unchanged_s"] > window
                                  for rank, p in progress.items() if rank != self.rank):
            return
        time.sleep(max(0.0, read_at + window - time.monotonic()))
        self.peers.read_now(STORE_TIMEOUT_S)

    def _line(self, what: str, own: bool) -> str:
        peers = []
        if self.peers is not None:
            progress, read_at = self.peers.progress()
            if read_at is None:
                peers = ["the other ranks' progress is unknown (the job's store did not answer)"]
            else:
                # the stall is decided: a peer that missed two of its writes is named as silent
                peers = describe_peers(progress, self.rank, self.world, self.timeout_s, self.unit,
                                       self.describe_silent_s())
        parts = [what, *peers] if own else [*peers, what]  # the stalled rank first
        where = f"; stacks in {self.log_path.parent}/" if self.log_path is not None else "; stacks in each rank's log"
        return f"error: stalled: {'; '.join(parts)}{where}; exit code {STALLED_EXIT_CODE} (resume to continue)"

    def _report(self, line: str, detail: str, first: bool) -> None:
        """The line, `detail` and the stacks into the rank's log (not through logging: the first
        rank's console has the line already; no log: stderr, which torchrun keeps per rank with
        --log-dir), STALLED into the run directory (the first rank's line wins), then on_end."""
        try:
            if self.log_path is not None:
                with open(self.log_path, "a") as f:
                    _write_stacks(f, f"{line}\n{detail}", self.rank)
            else:
                _write_stacks(sys.stderr, f"{line}\n{detail}" if not first else detail, self.rank)
            if self.marker_dir is not None and (first or not (self.marker_dir / STALLED_MARKER).exists()):
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


def meet_at_end(watchdog: Optional[Watchdog]) -> None:
    """The last barrier of a completed job (parallel/mesh.py), still watched: the others wait
    there while rank 0 writes its reports (the long limit), and a peer lost now ends the job as
    a stall, as at any step (unwatched, this rank and its launcher would wait for a node that
    is gone). Any other failure is logged: teardown must not replace the job's result."""
    with watchdog.slow_phase("finish") if watchdog is not None else contextlib.nullcontext():
        try:
            last_barrier()
        except RuntimeError as e:
            if watchdog is not None and is_collective_timeout(e):
                watchdog.collective_failed(e)
            log.warning("the last barrier failed: %s", e)
