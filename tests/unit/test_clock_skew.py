"""Two ranks whose hosts' wall clocks disagree by 400 s, one way and the other (issue 75): a
checkpoint save longer than timeout_s runs to its end with no stall, and a rank that really
stops is still named silent. The ranks are two watches with their couriers in this process, on
one in-memory store; only the wall clock each courier writes differs (the watch's judgement uses
the reader's monotonic clock alone). Limits are tenths of seconds here, seconds in a job."""
import time

import pytest

from helpers.memory_store import MemoryStore
from longctx.runtime import watchdog
from longctx.runtime.peer_progress import PeerProgress
from longctx.runtime.watchdog import Watchdog

TIMEOUT_S = 0.5
SILENT_S = 1.5  # the courier's silence threshold (10 s or 5 writes in a job)
SAVE_S = 3.0  # longer than timeout_s and the silence threshold together


class _Rank(Watchdog):
    """A watch whose end is recorded (its line) instead of exiting the test's process."""

    def __init__(self, rank: int, store: MemoryStore, skew_s: float):
        peers = PeerProgress(rank, 2, connect=lambda: store, reader=True, nodes=2,
                             wall_clock=lambda: time.time() + skew_s)
        peers.publish_every_s = peers.read_every_s = 0.1
        peers.silent_after_s = SILENT_S
        super().__init__(rank=rank, world=2, timeout_s=TIMEOUT_S, startup_timeout_s=60.0, log_path=None,
                         marker_dir=None, peers=peers)
        self.lines: list[str] = []

    def stalled(self, what, *, own, detail=""):
        self._look_at_peers()
        self.lines.append(self._line(what, own))
        self._stop.set()


def _two_ranks(monkeypatch, skew_s: float) -> tuple[_Rank, _Rank, MemoryStore]:
    monkeypatch.setattr(watchdog, "POLL_S", 0.05)
    store = MemoryStore()
    ranks = _Rank(0, store, 0.0), _Rank(1, store, skew_s)
    for r in ranks:
        r.start()
        r.new_shape("stage 0")
        r.beat("compute", step=1)
        r.step_done(0.01)
    return *ranks, store


@pytest.mark.parametrize("skew_s", [-400.0, 400.0])
def test_a_long_save_under_skewed_clocks_ends_without_a_stall(monkeypatch, skew_s):
    rank0, rank1, store = _two_ranks(monkeypatch, skew_s)
    with rank0.slow_phase("checkpoint"), rank1.slow_phase("checkpoint"):  # rank 0 writes, rank 1 waits
        time.sleep(SAVE_S)
    for r in (rank0, rank1):
        r.stop()
    assert rank0.lines == [] and rank1.lines == []
    assert store.calls["multi_get"] >= 2  # both waited long enough to read the other's progress
    written = [float(store.data[f"longctx/progress/{r}"].split(b'"time": ')[1].split(b",")[0].rstrip(b"}"))
               for r in (0, 1)]
    assert abs(written[1] - written[0] - skew_s) < 5  # the clocks did disagree in the store


@pytest.mark.parametrize("skew_s", [-400.0, 400.0])
def test_a_stopped_rank_under_skewed_clocks_is_still_named(monkeypatch, skew_s):
    rank0, rank1, _ = _two_ranks(monkeypatch, skew_s)
    rank1._stop.set()  # rank 1 stops (SIGSTOP, a node lost): its watch and courier say nothing more
    rank1.peers.close(None, wait_s=5)
    began = time.monotonic()
    with rank0.slow_phase("checkpoint"):
        while not rank0.lines and time.monotonic() - began < 15:
            time.sleep(0.05)
    ended_after = time.monotonic() - began
    rank0.stop()
    assert len(rank0.lines) == 1, rank0.lines
    line = rank0.lines[0]
    assert line.startswith("error: stalled: rank 1 silent for "), line
    assert "(stopped or cut off; last at step 1, phase " in line and " UTC by its host's clock)" in line
    assert "rank 0 waiting for " in line and "phase checkpoint" in line
    # seen once rank 0 waited timeout_s and rank 1's key stayed unchanged for the threshold, plus the
    # line's second look: a few tenths of a second here, never the 400 s of the clocks
    assert ended_after < TIMEOUT_S + SILENT_S + 3.0, ended_after
