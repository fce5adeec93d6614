"""The stall watch's rules (longctx/runtime/watchdog.py, parallel/timeouts.py): which limit applies
when, which peers a report names, and that the watch itself cannot stop quietly (a new shape
published while the watch reads it, an error inside a look). Its store traffic
(runtime/peer_progress.py) is tests/unit/test_peer_progress.py's; clocks that disagree are
tests/unit/test_clock_skew.py's; what crosses the process boundary (the exit, the stacks,
STALLED) is tests/integration/test_watchdog_exits.py's."""
import logging
import sys
import threading

import pytest

from longctx.parallel.timeouts import timeout_problem
from longctx.runtime import watchdog
from longctx.runtime.peer_progress import describe_peers
from longctx.runtime.watchdog import (
    STEP_MULTIPLE,
    WARM_STEPS,
    Watchdog,
    is_collective_timeout,
    watched_batches,
)


def _watchdog(**kw) -> Watchdog:
    return Watchdog(rank=0, world=1, timeout_s=30.0, startup_timeout_s=600.0, log_path=None, marker_dir=None, **kw)


@pytest.mark.parametrize("value, ok", [(30, True), (0.5, True), (0, False), (-1.0, False), (float("nan"), False),
                                       (float("inf"), False), ("30", False), (True, False)])
def test_timeout_problem(value, ok):
    assert (timeout_problem(value) is None) == ok


def test_limits_follow_the_run():
    w = _watchdog()
    w.new_shape("stage 0")
    w.beat("data", step=1)
    assert w.limit_s() == 600.0 and w.collective_timeout_s() == 600.0  # until the first step finished
    w.step_done(100.0)  # the first step (compilation, warm-up) counts as one of its shape
    assert w.collective_timeout_s() == 30.0 and w.collective_s == 30.0
    assert w.limit_s() == 600.0  # between steps: checkpoints, validation, logging
    for step in range(2, WARM_STEPS + 1):  # the first steps of a shape: the start-up limit
        w.beat("compute", step=step)
        assert w.limit_s() == 600.0
        w.step_done(2.0)
    w.beat("data", step=WARM_STEPS + 1)
    assert w.limit_s() == 30.0 + STEP_MULTIPLE * 100.0  # the slowest step of the shape, its first included
    with w.slow_phase("checkpoint"):
        assert w.phase == "checkpoint" and w.limit_s() == 600.0 and w.collective_s == 600.0
    assert w.phase == "between steps" and w.collective_s == 30.0


def test_a_new_stage_is_judged_as_a_start():
    """A stage with another shape (new kernels, a new cp mesh with fresh communicators) gets the
    start-up limits again until its own steps ran; going back to a shape seen keeps its times."""
    w = _watchdog()
    w.new_shape("stage 0")
    for step in range(1, WARM_STEPS + 2):
        w.step_done(1.0)
    w.beat("compute", step=WARM_STEPS + 2)
    assert w.limit_s() == 30.0 + STEP_MULTIPLE * 1.0
    w.new_shape("stage 1")
    assert w.collective_s == 600.0 and w.collective_timeout_s() == 600.0
    w.beat("compute", step=WARM_STEPS + 2)
    assert w.limit_s() == 600.0
    w.step_done(50.0)
    assert w.collective_s == 30.0
    w.new_shape("stage 0")
    assert w.collective_s == 30.0 and w.limit_s() == 600.0  # between steps
    w.beat("data")
    assert w.limit_s() == 30.0 + STEP_MULTIPLE * 1.0


def test_watched_batches_mark_the_phases():
    w, seen = _watchdog(), []

    def batches():
        for i in range(2):
            seen.append(w.phase)  # while a batch loads
            yield i

    for _ in watched_batches(batches(), w):
        seen.append(w.phase)  # while it is computed
    assert seen == ["data", "compute", "data", "compute"]
    assert w.phase == "data"


def test_describe_peers_names_silent_and_stuck_ranks():
    """Silence is how long a key stayed unchanged on the reader's clock; the peer's own wall time
    is only shown (here 400 s behind: it changes nothing)."""
    wall = 1_000_000.0 - 400
    progress = {0: {"step": 5, "phase": "compute", "idle_s": 0.0, "time": wall, "unchanged_s": 0.0},
                1: {"step": 5, "phase": "compute", "idle_s": 1.0, "time": wall, "unchanged_s": 40.2},  # SIGSTOPped
                2: {"step": 5, "phase": "data", "idle_s": 25.0, "time": wall, "unchanged_s": 1.0},  # its read stuck
                3: {"step": 5, "phase": "compute", "idle_s": 3.0, "time": wall + 800, "unchanged_s": 1.0},  # fine
                5: {"step": 9, "phase": "done", "idle_s": 0.0, "time": wall - 90, "unchanged_s": 90.0}}  # exited
    found = describe_peers(progress, me=0, world=6, limit_s=30.0)
    assert found == ["rank 1 silent for 40 s (stopped or cut off; last at step 5, phase compute, written "
                     "13:40:00 UTC by its host's clock)",
                     "rank 2 stuck for 25 s at step 5, phase data",
                     "rank 4 never reported progress"]


class _Ends(Watchdog):
    """A watch whose end is recorded instead of exiting the test's process."""

    def __init__(self, **kw):
        super().__init__(rank=0, world=1, log_path=None, marker_dir=None, **kw)
        self.ended: list[str] = []

    def stalled(self, what, *, own, detail=""):
        self.ended.append(what)
        self._stop.set()


class _LooksWhileAdding(dict):
    """The shape table, with the watch looking at the moment an entry is added: the thread switch
    that once found the new shape published and its entry not there yet."""

    def __init__(self, w: Watchdog, *args):
        super().__init__(*args)
        self.w, self.looks = w, []

    def setdefault(self, key, default=None):
        self.looks.append((self.w.shape, self.w.limit_s(), self.w.steady, self.w.collective_timeout_s()))
        return super().setdefault(key, default)


def test_a_new_shape_is_published_after_its_entry():
    w = _watchdog()
    w._steps = _LooksWhileAdding(w, w._steps)
    for shape in ("stage 0", "stage 1", "stage 0"):
        w.new_shape(shape)
        w.beat("compute", step=1)
        w.step_done(1.0)
    assert [look[0] for look in w._steps.looks] == [None, "stage 0", "stage 1"]  # the old shape, whole
    assert all(look[1] == 600.0 for look in w._steps.looks)


@pytest.fixture
def switch_often():
    """A thread switch forced every microsecond (Python's default: 5 ms)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_new_shapes_under_forced_thread_switches(switch_often):
    """The watch's reads against a main thread that publishes a new shape a thousand times: no
    read fails (the old order raised KeyError within a few)."""
    w, errors, done = _watchdog(), [], threading.Event()

    def watch():
        while not done.is_set():
            try:
                w.limit_s(), w.collective_timeout_s()
            except Exception as e:  # noqa: BLE001 - the test counts them
                errors.append(repr(e))

    reader = threading.Thread(target=watch)
    reader.start()
    try:
        for i in range(1000):
            w.new_shape(("stage", i))
            w.beat("compute", step=i)
    finally:
        done.set()
        reader.join()
    assert errors == []


def test_an_error_in_the_watch_is_logged_once_and_the_watch_goes_on(monkeypatch, caplog):
    """A look that raises (twice, the same error) is logged once; the watch goes on and still
    ends a phase that outlives its limit."""
    monkeypatch.setattr(watchdog, "POLL_S", 0.01)
    w = _Ends(timeout_s=30.0, startup_timeout_s=0.3)
    limit_s, failures = w.limit_s, []

    def flaky():
        if len(failures) < 2:
            failures.append(1)
            raise KeyError("stage 1")
        return limit_s()

    w.limit_s = flaky
    with caplog.at_level(logging.ERROR, logger="longctx.runtime.watchdog"):
        w.start()
        w._thread.join(10)
    assert not w._thread.is_alive() and len(failures) == 2
    assert len(w.ended) == 1 and w.ended[0].startswith("rank 0 made no progress for "), w.ended
    assert [r.getMessage() for r in caplog.records] == [
        "watchdog: rank 0's stall watch failed (KeyError: 'stage 1'); it goes on"]


def test_a_watch_that_keeps_failing_ends_the_rank_with_a_line(monkeypatch, caplog):
    monkeypatch.setattr(watchdog, "POLL_S", 0.01)
    w = _Ends(timeout_s=0.3, startup_timeout_s=600.0)

    def broken():
        raise RuntimeError("a bug")

    w.limit_s = broken
    with caplog.at_level(logging.ERROR, logger="longctx.runtime.watchdog"):
        w.start()
        w._thread.join(10)
    assert len(w.ended) == 1 and "rank 0's stall watch has failed for " in w.ended[0], w.ended
    assert "(RuntimeError: a bug) at step 0, phase start-up: nothing watches this rank" in w.ended[0]
    assert len(caplog.records) == 1


@pytest.mark.parametrize("text, timed_out", [
    ("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete", True),
    ("[gloo/transport/tcp/unbound_buffer.cc:133] Timed out waiting 5000ms for send operation to complete", True),
    ("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234", True),
    ("[gloo/transport/tcp/pair.cc:598] Read error [10.0.0.2]:40112: Connection reset by peer", True),
    ("[gloo/transport/tcp/pair.cc:446] Application timeout caused pair closure", True),
    ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.231.0.2]:28364: "
     "Connection timed out. This is typically caused by a remote worker hanging", True),  # a node cut off
    ("[PG ID 0 PG GUID 0 Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
     "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=300000) ran for 300012 milliseconds before timing out.",
     True),
    ("NCCL communicator was aborted on rank 3.", True),
    ("NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version "
     "2.21.5\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting", True),
    # other timeouts are not a peer lost: they keep their own report (a traceback, a user error)
    ("HTTPSConnectionPool(host='huggingface.co', port=443): Read timed out. (read timeout=10)", False),
    ("DataLoader timed out after 5 seconds", False),
    ("Socket Timeout", False),  # the c10d store, at start-up: torch's own error says enough
    ("timeout_s must be positive", False),
    ("CUDA out of memory", False)])
def test_is_collective_timeout(text, timed_out):
    assert is_collective_timeout(RuntimeError(text)) == timed_out
    assert not is_collective_timeout(ValueError(text))
    wrapped = RuntimeError("DeepSpeed engine step failed")
    wrapped.__cause__ = RuntimeError(text)
    assert is_collective_timeout(wrapped) == timed_out


