"""The courier's writes to the job's store while steps go fast (issue 75, item 3).

Each simulated rank is one courier (longctx/runtime/peer_progress.py) whose step changes at a
given rate, as `Watchdog.beat(step=...)` posts it, plus the watch's own post once a second. Its
store counts the `set` calls. Two contenders, interleaved (new, old, new, old) at every rate and
size:

- new: the courier as shipped: at most one write per `publish_every_s(world)`, posts merged;
- old: the courier before issue 75: every step change written at once (the interval applied to
  unchanged steps only).

Counted after a warm-up of 1.5 intervals (each courier's first write goes at once), for
--seconds. Reported per contender: writes a second per rank, and the job's total, against the cap the
courier documents (world / publish_every_s(world), 256 a second from the whole job once world >
512). One rank at world 8 (a 2 s interval) and 1,024 ranks at world 1,024 (a 4 s interval), each
at 10 and 100 steps a second; at 1,024 ranks the posts come from one driver thread, which reports
the step rate it reached.

    python benchmarks/bench_courier_writes.py --seconds 8 --rounds 2 \
        --json docs/results/2026-12-07-courier-writes.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from benchlib.report import write_json

from longctx.runtime.peer_progress import PeerProgress, publish_every_s

WATCH_POLL_S = 1.0  # the watch posts the rank's progress once a second, step changed or not


class CountingStore:
    """The calls a courier makes, counted (a store that answers at once)."""

    def __init__(self):
        self.sets = 0
        self._lock = threading.Lock()

    def set(self, key, value):
        with self._lock:
            self.sets += 1


class OldCourier(PeerProgress):
    """The courier before issue 75: a step change is due at once, whatever the interval."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._written_step: Optional[int] = None

    def post(self, step: int, phase: str, idle_s: float) -> None:
        with self._cond:
            self._record = {"step": step, "phase": phase, "idle_s": round(idle_s, 1)}
            if step != self._written_step:
                self._cond.notify()

    def _write_due(self) -> bool:
        if self._record is None:
            return False
        return self._record["step"] != self._written_step or super()._write_due()

    def _write(self, store, record: dict) -> None:
        self._written_step = record["step"]
        super()._write(store, record)


def run(kind: str, ranks: int, world: int, steps_per_s: float, seconds: float) -> dict:
    store = CountingStore()
    cls = OldCourier if kind == "old" else PeerProgress
    couriers = [cls(rank, world, connect=lambda: store, reader=False).start() for rank in range(ranks)]
    began = time.monotonic()
    warm_s = 1.5 * publish_every_s(world)  # each courier's first write (at once) and one interval: not counted
    step, next_poll, counted_from, counted_step, from_writes = 0, began, None, 0, 0
    while counted_from is None or time.monotonic() - counted_from < seconds:
        now = time.monotonic()
        if counted_from is None and now - began >= warm_s:
            counted_from, counted_step, from_writes = now, step, store.sets
        step += 1
        watch_poll = now >= next_poll
        for courier in couriers:
            courier.post(step, "compute", 0.0)
            if watch_poll:
                courier.post(step, "compute", 0.01)
        next_poll = next_poll + WATCH_POLL_S if watch_poll else next_poll
        time.sleep(max(0.0, began + step / steps_per_s - time.monotonic()))
    elapsed = time.monotonic() - counted_from
    writes, step = store.sets - from_writes, step - counted_step
    for courier in couriers:
        courier.close(None, wait_s=5)
    per_rank = writes / elapsed / ranks
    return {"writes_per_s_per_rank": per_rank, "writes_per_s_job": per_rank * world,
            "steps_per_s_reached": step / elapsed, "cap_per_s_per_rank": 1 / publish_every_s(world),
            "cap_per_s_job": world / publish_every_s(world)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=8.0, help="per contender, rate, size and round (default 8)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1:
        p.exit(2, "error: --seconds > 0 and --rounds >= 1\n")
    cases = [(1, 8), (1024, 1024)]  # (ranks simulated, world size)
    rows: list[dict] = []
    for round_ in range(args.rounds):
        for ranks, world in cases:
            for rate in (10.0, 100.0):
                for kind in ("new", "old"):
                    row = dict(run(kind, ranks, world, rate, args.seconds), contender=kind, ranks=ranks, world=world,
                               steps_per_s=rate, round=round_)
                    rows.append(row)
                    print(f"{kind}: {ranks} rank(s) of {world} at {rate:.0f} steps/s (reached "
                          f"{row['steps_per_s_reached']:.1f}): {row['writes_per_s_per_rank']:.2f} writes/s a rank, "
                          f"{row['writes_per_s_job']:.0f}/s the job (cap {row['cap_per_s_job']:.0f})", flush=True)
    summary = []
    for ranks, world in cases:
        for rate in (10.0, 100.0):
            for kind in ("new", "old"):
                mine = [r for r in rows if (r["contender"], r["ranks"], r["steps_per_s"]) == (kind, ranks, rate)]
                summary.append({"contender": kind, "ranks": ranks, "world": world, "steps_per_s": rate,
                                "steps_per_s_reached_min": min(r["steps_per_s_reached"] for r in mine),
                                "writes_per_s_per_rank_median": statistics.median(r["writes_per_s_per_rank"]
                                                                                  for r in mine),
                                "writes_per_s_per_rank_max": max(r["writes_per_s_per_rank"] for r in mine),
                                "writes_per_s_job_max": max(r["writes_per_s_job"] for r in mine),
                                "cap_per_s_job": mine[0]["cap_per_s_job"]})
    payload = {"command": "python benchmarks/bench_courier_writes.py " + " ".join(argv), "seconds": args.seconds,
               "rounds": args.rounds, "rows": rows, "summary": summary}
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
