"""The stall watch's courier (longctx/runtime/peer_progress.py): what it asks of the job's store
(a bounded number of requests at any size: at most one write per rank per interval however fast
its steps go, one multi_get per node per interval, only while waiting), silence judged by when a
key last changed on the reader's clock, and that nothing the watch calls waits on the store."""
import json
import time

import pytest

from helpers.memory_store import MemoryStore
from longctx.runtime.peer_progress import (
    PUBLISHES_PER_S,
    READS_PER_S,
    PeerProgress,
    publish_every_s,
    read_every_s,
    silent_after_s,
    silent_ranks,
)


def _courier(store, rank=0, world=4, reader=True, every_s=0.2) -> PeerProgress:
    c = PeerProgress(rank, world, connect=lambda: store, reader=reader, nodes=2)
    c.publish_every_s = c.read_every_s = every_s  # seconds in a job; tenths here
    return c.start()


def _until(condition, timeout_s=20.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("world, nodes", [(8, 1), (1024, 128), (16384, 2048)])
def test_the_store_load_is_bounded_at_any_size(world, nodes):
    writes, reads = world / publish_every_s(world), nodes / read_every_s(nodes)
    assert writes <= max(PUBLISHES_PER_S, world / 2.0) and reads <= max(READS_PER_S, nodes / 2.0)
    assert writes + reads <= PUBLISHES_PER_S + READS_PER_S or world <= 512
    assert silent_after_s(world) >= 5 * publish_every_s(world)  # a rank is silent only after missed writes


def test_a_reader_reads_every_key_in_one_request_and_only_when_asked():
    store = MemoryStore({f"longctx/progress/{r}": '{"step": 3, "phase": "compute", "idle_s": 0, "time": 0}'
                         for r in (1, 2, 3)})
    c = _courier(store)
    c.post(3, "compute", 0.0)
    _until(lambda: store.calls["set"] >= 1)
    time.sleep(0.5)
    assert store.calls["multi_get"] == 0 and c.progress() == ({}, None)  # not waiting: no read
    c.want_read()
    _until(lambda: c.progress()[1] is not None)
    progress, _ = c.progress()
    assert sorted(progress) == [0, 1, 2, 3] and store.calls["multi_get"] == 1 and store.calls["check"] == 1
    c.want_read()
    _until(lambda: store.calls["multi_get"] == 2)
    assert store.calls["check"] == 1  # every key known: one request a read
    c.close(None, wait_s=5)


def test_a_rank_that_is_not_its_nodes_reader_never_reads():
    store = MemoryStore()
    c = _courier(store, rank=1, reader=False)
    for _ in range(5):
        c.post(1, "checkpoint", 100.0)
        c.want_read()
        time.sleep(0.1)
    c.close(None, wait_s=5)
    assert store.calls["multi_get"] == store.calls["check"] == 0 and store.calls["set"] >= 2


def test_writes_keep_to_their_interval_however_fast_the_steps_go():
    """A new step every 10 ms (100 steps/s) for 1.2 s, with a 0.5 s interval: the first post is
    written at once, the others are merged and the newest goes at each interval's end (at most
    one write per interval, not 120); the rank's last record as it ends is written at once."""
    store = MemoryStore()
    c = _courier(store, every_s=0.5)
    began = time.monotonic()
    step = 0
    while time.monotonic() - began < 1.2:
        step += 1
        c.post(step, "compute", 0.0)
        time.sleep(0.01)
    _until(lambda: store.calls["set"] >= 3)
    writes, elapsed = store.calls["set"], time.monotonic() - began
    assert writes <= 1 + elapsed / 0.5, (writes, elapsed)
    written = json.loads(store.data["longctx/progress/0"])
    assert written["seq"] == writes and written["step"] > 1  # a later step, merged
    c.close({"step": step, "phase": "done", "idle_s": 0.0}, wait_s=5)
    last = json.loads(store.data["longctx/progress/0"])
    assert (last["step"], last["phase"], last["seq"]) == (step, "done", store.calls["set"])


def test_silence_is_when_a_key_last_changed_on_the_readers_clock():
    """The writer's wall clock is 400 s behind (then ahead of) the reader's: it is shown, never
    compared. A key that changes is fresh at every read; one that stops changing ages from the
    read that first saw its last value."""
    for skew in (-400.0, 400.0):
        store = MemoryStore()
        writer = PeerProgress(1, 2, connect=lambda: store, reader=False, wall_clock=lambda: time.time() + skew)
        writer.publish_every_s = 0.1
        writer.start()
        reader = _courier(store, rank=0, world=2, every_s=0.1)
        for _ in range(6):
            writer.post(3, "checkpoint", 1.0)
            reader.want_read()
            time.sleep(0.1)
        progress, at = reader.progress()
        assert at is not None and progress[1]["unchanged_s"] < 0.5, progress
        assert abs(progress[1]["time"] - time.time() - skew) < 5  # the writer's clock, as written
        writer.close(None, wait_s=5)  # stops writing: its key ages from here
        reader.want_read()
        first = _read_after(reader, at)
        time.sleep(0.6)
        reader.want_read()
        aged = _read_after(reader, first)
        assert reader.progress()[0][1]["unchanged_s"] >= 0.5 and aged > first
        assert silent_ranks(reader.progress()[0], me=0, silent_s=0.4) == [1]
        reader.close(None, wait_s=5)


def _read_after(c: PeerProgress, before: float) -> float:
    _until(lambda: c.progress()[1] is not None and c.progress()[1] > before)
    return c.progress()[1]


def test_nothing_the_watch_calls_waits_on_a_store_that_hangs():
    store = MemoryStore(hang=True)
    c = _courier(store)
    began = time.monotonic()
    c.post(2, "compute", 0.0)
    c.want_read()
    assert c.progress() == ({}, None)
    assert c.claim_report(0.3) is None  # unknown: the caller prints its line itself
    c.read_now(0.3)
    assert time.monotonic() - began < 5
    time.sleep(0.3)
    assert c.unanswered_s() >= 0.5
    assert not c.close(None, wait_s=0.2)  # still inside the hung call: the caller knows


def test_the_first_reporter_is_the_one_that_takes_the_counter():
    store = MemoryStore()
    first, second = _courier(store, rank=0), _courier(store, rank=1)
    assert first.claim_report(5) is True and second.claim_report(5) is False
    for c in (first, second):
        c.close(None, wait_s=5)


def test_silent_ranks_are_those_not_done_whose_key_is_old():
    progress = {0: {"phase": "compute", "unchanged_s": 30.0}, 1: {"phase": "compute", "unchanged_s": 50.0},
                2: {"phase": "done", "unchanged_s": 100.0}, 3: {"phase": "data", "unchanged_s": 5.0}}
    assert silent_ranks(progress, me=0, silent_s=20.0) == [1]
