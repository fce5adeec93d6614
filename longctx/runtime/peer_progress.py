"""Each rank's progress in the job's c10d store, carried by a thread of its own (the courier) so
that the stall watch's clock never waits on the network (longctx/runtime/watchdog.py).

The watch hands the courier its latest progress and, while it waits long, asks for the others';
it reads back only what the courier last got, with when. A store that stops answering (this node
cut off, or the store's host lost) shows as the time since its last answer, which the watch
judges like any other silence.

Silence is judged on the reader's own monotonic clock, never by comparing clocks of two hosts:
each write carries a sequence number, and the reader notes when it first saw each key's value.
A key whose value has not changed for a while is a silent rank; how far the hosts' wall clocks
disagree (NTP down, a VM resumed from a pause) does not matter. The writer's wall-clock time is
in the record only for the people who read a stall line.

What the job's store carries, at any size (benchmarks/bench_watch_store.py and
benchmarks/bench_courier_writes.py measure it):
- each rank writes its own key at most once per `publish_every_s(world)`, however often its step
  changes (a new step waits for the interval's end and goes with the newest record): at most
  PUBLISHES_PER_S writes a second from the whole job, plus one last write as the rank ends;
- one rank per node (local rank 0) reads every key in one `multi_get`, only while its rank has
  waited longer than timeout_s, at most once per `read_every_s(nodes)`: at most READS_PER_S
  reads a second from the whole job;
- the first rank that reports a stall takes one counter (`add`) so that only it prints the line.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import timedelta
from typing import Callable, Optional

KEY = "longctx/progress/{rank}"
CLAIM_KEY = "longctx/stall-reported"
DONE = "done"  # a rank whose work is over (it waits at the last barrier, or has exited): not silent
PUBLISH_EVERY_S = 2.0  # the shortest interval between two writes of one rank, and between two reads
PUBLISHES_PER_S = 256.0  # from the whole job, at most (the interval grows with the world size)
READS_PER_S = 32.0  # from the whole job, at most (one reader per node)
SILENT_AFTER_PUBLISHES = 5  # a rank that missed this many of its writes is stopped or cut off...
SILENT_AFTER_S = 10.0  # ... and at least this long
CHECKS_PER_READ = 16  # ranks looked up one by one in a read, while some rank never wrote
STORE_TIMEOUT_S = 5.0  # one store call (the courier's; the watch never waits for it)

log = logging.getLogger("longctx.runtime.watchdog")


def publish_every_s(world: int) -> float:
    return max(PUBLISH_EVERY_S, world / PUBLISHES_PER_S)


def read_every_s(nodes: int) -> float:
    return max(PUBLISH_EVERY_S, nodes / READS_PER_S)


def silent_after_s(world: int) -> float:
    """How long a rank's key may stay unchanged before the rank counts as stopped or cut off."""
    return max(SILENT_AFTER_S, SILENT_AFTER_PUBLISHES * publish_every_s(world))


def job_nodes(world: int) -> int:
    """The job's node count as the launcher tells it (torchrun: LOCAL_WORLD_SIZE ranks a node)."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return max(1, world // int(local)) if local.isdigit() and int(local) > 0 else 1


def is_node_reader() -> bool:
    """One reader per node: local rank 0 (a launcher that sets no LOCAL_RANK: every rank)."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def tcp_store_client():
    """A client of the job's c10d store (the launcher's, or rank 0's), of its own, with a short timeout."""
    import torch.distributed as dist  # the job has it loaded already

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=False)


def store_address() -> str:
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


class PeerProgress:
    """The courier of one rank. `connect`: makes a store client (the job's TCPStore; tests pass
    an in-memory one); `reader`: this rank reads the others' progress for its node."""

    def __init__(self, rank: int, world: int, *, connect: Callable[[], object] = tcp_store_client,
                 reader: Optional[bool] = None, nodes: Optional[int] = None,
                 wall_clock: Callable[[], float] = time.time):
        self.rank, self.world = rank, world
        self.reader = is_node_reader() if reader is None else reader
        self.publish_every_s = publish_every_s(world)
        self.read_every_s = read_every_s(job_nodes(world) if nodes is None else nodes)
        self.silent_after_s = silent_after_s(world)
        self.requests = 0  # store calls made (the benchmark counts them)
        self._connect, self._store = connect, None
        self._wall_clock = wall_clock  # the record's time, for people (never compared with another host's)
        self._seq = 0  # this rank's writes so far: every write changes the key
        self._cond = threading.Condition()
        self._record: Optional[dict] = None  # the newest progress to write
        self._written_at = -float("inf")
        self._read_wanted = self._forced = self._read_failed = False
        self._read_at = -float("inf")
        self._progress: dict[int, dict] = {}
        self._progress_at: Optional[float] = None  # the last read (monotonic)
        self._seen: dict[int, tuple[bytes, float]] = {}  # rank: (its key's value, when first read so; monotonic)
        self._known: set[int] = set()  # ranks whose key exists
        self._claim_wanted = False
        self._claim: Optional[bool] = None
        self._answered_at = time.monotonic()  # the store's last answer (the start counts as one)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="longctx-watch-store", daemon=True)

    # ------------------------------------------------------------ what the watch calls (never blocks)
    def start(self) -> "PeerProgress":
        self._thread.start()
        return self

    def post(self, step: int, phase: str, idle_s: float) -> None:
        """This rank's progress now: written when the interval since the last write has passed
        (at once if it has; posts in between are merged, the newest is written)."""
        with self._cond:
            self._record = {"step": step, "phase": phase, "idle_s": round(idle_s, 1)}
            if self._write_due():
                self._cond.notify()

    def want_read(self) -> None:
        """The watch waits long: read the others' progress (a node reader only; when due)."""
        if self.reader:
            with self._cond:
                if not self._read_wanted:
                    self._read_wanted = True
                    self._cond.notify()

    def read_now(self, wait_s: float) -> None:
        """Read the others' progress at once (any rank; the one that reports a stall), waiting at
        most `wait_s` for it."""
        with self._cond:
            before = self._progress_at
            self._read_wanted = self._forced = True
            self._read_failed = False
            self._cond.notify()
            self._cond.wait_for(lambda: self._progress_at is not before or self._read_failed, timeout=wait_s)

    def progress(self) -> tuple[dict[int, dict], Optional[float]]:
        """The others' progress as last read, and when (monotonic; None: never). Each record has
        `unchanged_s`: how long its key had not changed at that read, on this rank's clock (a
        lower bound: a key first read counts as just changed)."""
        with self._cond:
            return dict(self._progress), self._progress_at

    def unanswered_s(self) -> float:
        """Seconds since the store last answered this rank."""
        return time.monotonic() - self._answered_at

    def claim_report(self, wait_s: float) -> Optional[bool]:
        """True when this rank is the first of the job to report a stall, False when another one
        was; None when the store did not tell within `wait_s`."""
        with self._cond:
            self._claim_wanted = True
            self._cond.notify()
            self._cond.wait_for(lambda: self._claim is not None, timeout=wait_s)
            return self._claim

    def close(self, last: Optional[dict], wait_s: float) -> bool:
        """Write `last` (the rank is done), end the courier; False when it was still inside a store
        call after `wait_s` (the caller must not exit the interpreter under it, if it can help it)."""
        with self._cond:
            if last is not None:
                self._record = dict(last)
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait_s)
        return not self._thread.is_alive()

    # ------------------------------------------------------------------------ the courier
    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(self._due, timeout=self._until_due())
                stopping = self._stopping
                record = self._record if self._write_due() or stopping else None
                read = self._read_due() and not stopping
                claim = self._claim_wanted and self._claim is None
            if record is not None:
                self._call(self._write, record)
            if claim:
                self._call(self._take_claim)
            if read:
                self._call(self._read)
            if stopping:
                self._store = None
                return

    def _due(self) -> bool:
        return self._stopping or self._write_due() or self._read_due() or (self._claim_wanted and self._claim is None)

    def _until_due(self) -> float:
        now = time.monotonic()
        waits = [self._written_at + self.publish_every_s - now]
        if self._read_wanted:
            waits.append(self._read_at + self.read_every_s - now)
        return max(0.05, min(waits))

    def _write_due(self) -> bool:
        return self._record is not None and time.monotonic() - self._written_at >= self.publish_every_s

    def _read_due(self) -> bool:
        return self._read_wanted and (self._forced or time.monotonic() - self._read_at >= self.read_every_s)

    def _call(self, fn, *args) -> None:
        """One exchange with the store; a failure drops the client (the next call connects again)."""
        try:
            if self._store is None:
                self.requests += 1
                self._store = self._connect()
            fn(self._store, *args)
            self._answered_at = time.monotonic()
        except Exception as e:  # noqa: BLE001 - the store's host may be gone or cut off: the watch judges it
            log.debug("watchdog: the job's store did not answer (%s)", e)
            self._store = None
            with self._cond:  # no hot loop against a store that does not answer
                self._written_at = self._read_at = time.monotonic()
                if fn == self._take_claim:
                    self._claim_wanted = False  # unknown: the caller stopped waiting
                if fn == self._read:
                    self._read_failed = True
                self._cond.notify_all()

    def _write(self, store, record: dict) -> None:
        with self._cond:
            self._written_at = time.monotonic()
            self._seq += 1
            record = dict(record, seq=self._seq, time=round(self._wall_clock(), 1))
        self.requests += 1
        store.set(KEY.format(rank=self.rank), json.dumps(record))

    def _read(self, store) -> None:
        with self._cond:
            self._read_at, self._read_wanted, self._forced = time.monotonic(), False, False
        missing = [r for r in range(self.world) if r not in self._known]
        if missing:  # one check for all; while some rank never wrote, one per rank for a few of them
            self.requests += 1
            if store.check([KEY.format(rank=r) for r in missing]):
                self._known.update(missing)
            else:
                for r in missing[:CHECKS_PER_READ]:
                    self.requests += 1
                    if store.check([KEY.format(rank=r)]):
                        self._known.add(r)
        ranks = sorted(self._known)
        self.requests += 1
        values = store.multi_get([KEY.format(rank=r) for r in ranks])
        now = time.monotonic()
        found = {}
        for r, value in zip(ranks, values):
            value = bytes(value)
            if r not in self._seen or self._seen[r][0] != value:
                self._seen[r] = (value, now)  # written since the last read (or first read)
            found[r] = dict(json.loads(value), unchanged_s=now - self._seen[r][1])
        with self._cond:
            self._progress, self._progress_at = found, now
            self._read_failed = False
            self._cond.notify_all()

    def _take_claim(self, store) -> None:
        self.requests += 1
        first = store.add(CLAIM_KEY, 1) == 1
        with self._cond:
            self._claim = first
            self._cond.notify_all()


def silent_ranks(progress: dict[int, dict], me: int, silent_s: float) -> list[int]:
    """The ranks whose key had not changed for longer than `silent_s` when it was read (the
    reader's clock), and not done."""
    return [rank for rank, p in sorted(progress.items())
            if rank != me and p["phase"] != DONE and p["unchanged_s"] > silent_s]


NAMED_AT_MOST = 8  # ranks a stall line names; the rest are counted


def describe_peers(progress: dict[int, dict], me: int, world: int, limit_s: float,
                   unit: str = "step", silent_s: float = SILENT_AFTER_S) -> list[str]:
    """The ranks that look stalled, each with where it was: silent (its key unchanged for longer
    than `silent_s`: its process stopped or cut off) or stuck in one phase for at least half the
    limit (at most NAMED_AT_MOST of them, then how many more). `unit`: what a step is called. A
    silent rank's last write is given in its own host's UTC clock, for people to find in its log."""
    found = _stalled_peers(progress, me, world, limit_s, unit, silent_s)
    if len(found) > NAMED_AT_MOST:
        found = [*found[:NAMED_AT_MOST], f"{len(found) - NAMED_AT_MOST} more ranks as well"]
    return found


def _stalled_peers(progress: dict[int, dict], me: int, world: int, limit_s: float, unit: str,
                   silent_s: float) -> list[str]:
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
        quiet = p["unchanged_s"]
        if quiet > silent_s:
            found.append(f"rank {rank} silent for {quiet:.0f} s (stopped or cut off; last at {unit} {p['step']}, "
                         f"phase {p['phase']}{_its_clock(p)})")
        elif p["idle_s"] >= limit_s / 2:
            found.append(f"rank {rank} stuck for {p['idle_s']:.0f} s at {unit} {p['step']}, phase {p['phase']}")
    return found


def _its_clock(p: dict) -> str:
    """When the rank wrote its last record, by its own host's clock (for people; never compared)."""
    wall = p.get("time")
    if not isinstance(wall, (int, float)):
        return ""
    return f", written {time.strftime('%H:%M:%S', time.gmtime(wall))} UTC by its host's clock"
