"""The stall watch's load on the job's c10d store at a simulated 1,024 ranks (issue 68, item 4).

One real TCPStore server (as torchrun's agent hosts it) and WORLD simulated ranks in this
process, each with its own store client, all in the worst case for the watch: every rank has
waited longer than timeout_s (a checkpoint save of several minutes), so every rank that may
read does. Two contenders, interleaved (new, old, new, old), each for --seconds:

- new (counted after a warm-up of two read intervals): longctx's courier
  (longctx/runtime/peer_progress.py): each rank writes its key once per publish interval (which
  grows with the world size), one rank per node reads every key in one multi_get at most once
  per read interval;
- old: the watch before issue 68: every rank writes its key every 2 s and reads 2 x world keys
  (check + get per rank) one after another every 2 s.

Reported per contender: the store requests answered per second (counted by the clients), the
requests per second the design asks for (what a store keeping up would see), and how stale a
reader's view of the others is (the age of a read pass: for old, the time one pass takes).

    python benchmarks/bench_watch_store.py --world 1024 --per-node 8 --seconds 20 \
        --json docs/results/2026-12-06-watch-store.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from benchlib.procs import free_port
from benchlib.report import write_json

from longctx.runtime.peer_progress import KEY, PeerProgress, publish_every_s, read_every_s

OLD_EVERY_S = 2.0  # the old watch: publish and read every 2 s


class Counted:
    """A store client that counts its calls (each is one request and its answer)."""

    def __init__(self, port: int):
        self.store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60),
                                   wait_for_workers=False)
        self.calls = 0

    def __getattr__(self, name):
        fn = getattr(self.store, name)

        def counted(*args):
            self.calls += 1
            return fn(*args)
        return counted


def run_new(port: int, world: int, per_node: int, seconds: float) -> dict:
    clients = [Counted(port) for _ in range(world)]
    couriers = [PeerProgress(rank, world, connect=lambda c=clients[rank]: c, reader=rank % per_node == 0,
                             nodes=world // per_node).start() for rank in range(world)]
    began = time.monotonic()
    ages: list[float] = []
    warm_s = 2 * read_every_s(world // per_node)  # every rank has written and each reader read once
    counted_from, start_calls = None, 0
    while counted_from is None or time.monotonic() - counted_from < seconds:
        if counted_from is None and time.monotonic() - began >= warm_s:
            counted_from, start_calls, ages = time.monotonic(), sum(c.calls for c in clients), []
        for courier in couriers:
            courier.post(step=7, phase="checkpoint", idle_s=time.monotonic() - began + 600)
            courier.want_read()
        time.sleep(0.5)
        for courier in couriers[::per_node]:
            _, at = courier.progress()
            if at is not None:
                ages.append(time.monotonic() - at)
    calls = sum(c.calls for c in clients) - start_calls
    elapsed = time.monotonic() - counted_from
    for courier in couriers:
        courier.close(None, wait_s=5)
    nodes = world // per_node
    designed = world / publish_every_s(world) + nodes / read_every_s(nodes)
    return {"requests_per_s": calls / elapsed, "designed_per_s": designed,
            "view_age_s_median": statistics.median(ages) if ages else None, "view_age_s_max": max(ages, default=None)}


def run_old(port: int, world: int, seconds: float) -> dict:
    """The watch before issue 68, as it read and wrote (one thread per rank)."""
    clients = [Counted(port) for _ in range(world)]
    stop = threading.Event()
    passes: list[float] = []

    def rank_thread(rank: int) -> None:
        store = clients[rank]
        while not stop.is_set():
            t0 = time.monotonic()
            store.set(KEY.format(rank=rank), json.dumps({"step": 7, "phase": "checkpoint", "idle_s": 600.0,
                                                          "time": time.time()}))
            for r in range(world):
                if stop.is_set():
                    return
                key = KEY.format(rank=r)
                if store.check([key]):
                    store.get(key)
            passes.append(time.monotonic() - t0)
            stop.wait(max(0.0, OLD_EVERY_S - (time.monotonic() - t0)))

    threads = [threading.Thread(target=rank_thread, args=(r,), daemon=True) for r in range(world)]
    began = time.monotonic()
    for t in threads:
        t.start()
    stop.wait(seconds)
    calls = sum(c.calls for c in clients)
    elapsed = time.monotonic() - began
    stop.set()
    for t in threads:
        t.join(30)
    return {"requests_per_s": calls / elapsed, "designed_per_s": world * (1 + 2 * world) / OLD_EVERY_S,
            "view_age_s_median": statistics.median(passes) if passes else None,
            "passes_done": len(passes), "pass_s_at_least": elapsed if not passes else max(passes)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=1024)
    p.add_argument("--per-node", type=int, default=8)
    p.add_argument("--seconds", type=float, default=20.0, help="per contender and round (default 20)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.world < 2 or args.per_node < 1 or args.world % args.per_node or args.seconds <= 0 or args.rounds < 1:
        p.exit(2, "error: --world >= 2, a multiple of --per-node >= 1; --seconds > 0; --rounds >= 1\n")
    results = {"new": [], "old": []}
    for _ in range(args.rounds):
        for name in ("new", "old"):
            port = free_port()
            server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=60))
            row = run_new(port, args.world, args.per_node, args.seconds) if name == "new" else \
                run_old(port, args.world, args.seconds)
            results[name].append(row)
            print(f"{name}: {row['requests_per_s']:.0f} requests/s answered, {row['designed_per_s']:.0f}/s asked, "
                  f"view age median {row['view_age_s_median']}", flush=True)
            del server
    summary = {name: {"requests_per_s_min": min(r["requests_per_s"] for r in rows),
                      "requests_per_s_median": statistics.median(r["requests_per_s"] for r in rows),
                      "designed_per_s": rows[0]["designed_per_s"]} for name, rows in results.items()}
    summary["asked_ratio_old_to_new"] = summary["old"]["designed_per_s"] / summary["new"]["designed_per_s"]
    payload = {"command": "python benchmarks/bench_watch_store.py " + " ".join(argv), "world": args.world,
               "per_node": args.per_node, "nodes": args.world // args.per_node, "seconds": args.seconds,
               "publish_every_s": publish_every_s(args.world),
               "read_every_s": read_every_s(args.world // args.per_node),
               "rounds": results, "summary": summary}
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
