"""The stall watch's rules (longctx/runtime/watchdog.py, parallel/timeouts.py): which limit applies
when, which peers a report names, and a stalled phase ending the process with its stacks. Its
store traffic (runtime/peer_progress.py) is tests/unit/test_peer_progress.py's."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from longctx.parallel.timeouts import timeout_problem
from longctx.runtime.peer_progress import describe_peers
from longctx.runtime.watchdog import (
    STALLED_EXIT_CODE,
    STEP_MULTIPLE,
    WARM_STEPS,
    Watchdog,
    is_collective_timeout,
    watched_batches,
)

TESTS = str(Path(__file__).resolve().parents[1])  # a script's `helpers` (the in-memory store)


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


@pytest.mark.parametrize("first_step_s", [0.05, 1.0])
def test_a_slow_second_step_does_not_stall(first_step_s):
    """Steps 2 to 4 take 2 x timeout_s, after a fast or an as slow first step: the watch lets
    them run (the old rule held step 2 to timeout_s alone and ended such a model at every start)."""
    script = textwrap.dedent(f"""
        import time
        from longctx.runtime.watchdog import Watchdog, watched_batches
        w = Watchdog(rank=0, world=1, timeout_s=0.5, startup_timeout_s=8.0, log_path=None, marker_dir=None).start()
        w.new_shape("stage 0")
        for step, seconds in ((1, {first_step_s}), (2, 1.0), (3, 1.0), (4, 1.0)):
            w.beat("data", step=step)
            for _ in watched_batches(iter([0]), w):
                time.sleep(seconds)  # compute
            w.step_done(seconds)
        print("trained")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "trained", done.stderr


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
    now = 1000.0
    progress = {0: {"step": 5, "phase": "compute", "idle_s": 0.0, "time": now},
                1: {"step": 5, "phase": "compute", "idle_s": 1.0, "time": now - 40},  # SIGSTOPped: nothing published
                2: {"step": 5, "phase": "data", "idle_s": 25.0, "time": now - 1},  # alive, its data read stuck
                3: {"step": 5, "phase": "compute", "idle_s": 3.0, "time": now - 1},  # fine
                5: {"step": 9, "phase": "done", "idle_s": 0.0, "time": now - 90}}  # finished, exited
    found = describe_peers(progress, me=0, world=6, limit_s=30.0, now=now)
    assert found == ["rank 1 silent for 40 s (stopped or cut off; last at step 5, phase compute)",
                     "rank 2 stuck for 25 s at step 5, phase data",
                     "rank 4 never reported progress"]


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


GLOO_PEER_LOST = textwrap.dedent("""
    import datetime, os, sys, time
    import torch, torch.distributed as dist
    from longctx.runtime.watchdog import is_collective_timeout
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=1))
    if rank == 1:
        time.sleep(3)  # misses the first collective; gone before the second
        os._exit(0)
    for _ in range(2):
        try:
            dist.all_reduce(torch.ones(1))
            print("no error")
        except Exception as e:
            print(is_collective_timeout(e), type(e).__name__, str(e).splitlines()[0][:160])
            time.sleep(3)
""")


def test_gloo_errors_of_a_lost_peer_are_recognised(tmp_path):
    """The errors torch's own gloo raises: a collective that times out on a silent peer, then one
    whose peer's process is gone."""
    script = tmp_path / "peer_lost.py"
    script.write_text(GLOO_PEER_LOST)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "rendezvous")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    out, err = procs[0].communicate(timeout=120)
    procs[1].communicate(timeout=60)
    lines = out.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("True ") for line in lines), out + err[-2000:]


def test_a_stalled_phase_ends_the_process_with_its_stacks(tmp_path):
    """The thread sees no progress past the limit: one line, the stacks in the log, STALLED, the
    on_end callback, exit 86 -- while the main thread is still stuck."""
    script = textwrap.dedent(f"""
        import pathlib, time
        from longctx.runtime.watchdog import Watchdog
        out = pathlib.Path({str(tmp_path)!r})
        w = Watchdog(rank=3, world=1, timeout_s=1.0, startup_timeout_s=1.0, log_path=out / "rank.log",
                     marker_dir=out, on_end=lambda: (out / "ended").touch()).start()
        for _ in range(3):
            w.step_done(0.01)
        w.beat("data", step=7)
        def stuck_in_a_read():
            time.sleep(60)
        stuck_in_a_read()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == STALLED_EXIT_CODE, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: stalled: rank 3 made no progress for ") and "step 7, phase data" in line
    assert (tmp_path / "STALLED").read_text() == line + "\n"
    assert "stuck_in_a_read" in (tmp_path / "rank.log").read_text()
    assert (tmp_path / "ended").exists()


def _peer_script(tmp_path, data: str, body: str, *, hang: bool = False, timeout_s: float = 2.0) -> str:
    """A rank 0 of 2 whose courier talks to an in-memory store holding `data` (python source of
    a dict), then `body`."""
    return textwrap.dedent(f"""
        import pathlib, sys, time
        sys.path.insert(0, {TESTS!r})
        from helpers.memory_store import MemoryStore
        from longctx.runtime.peer_progress import PeerProgress
        from longctx.runtime.watchdog import Watchdog

        out = pathlib.Path({str(tmp_path)!r})
        store = MemoryStore({data}, hang={hang})
        peers = PeerProgress(0, 2, connect=lambda: store, reader=True)
        peers.silent_after_s = 3.0  # 10 s in a job: shorter here, for the test's time
        w = Watchdog(rank=0, world=2, timeout_s={timeout_s}, startup_timeout_s=600.0, log_path=out / "rank.log",
                     marker_dir=out, peers=peers).start()
        w.step_done(0.01)
    """) + textwrap.dedent(body)


def test_a_silent_peer_ends_a_long_phase_after_timeout_s(tmp_path):
    """A checkpoint save has the start-up limit, but a peer whose progress has not changed for
    longer than timeout_s (and the courier's silence threshold) is stopped or cut off: the
    waiting rank ends the job then, names the peer and prints the line (it reported first)."""
    rank1 = '{"longctx/progress/1": \'{"step": 4, "phase": "data", "idle_s": 0.0, "time": %r}\' % (time.time() - 50)}'
    script = _peer_script(tmp_path, rank1, """
        w.beat("compute", step=4)
        w.step_done(0.01)
        with w.slow_phase("checkpoint"):
            time.sleep(60)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == STALLED_EXIT_CODE, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: stalled: rank 1 silent for 5"), line
    assert "(stopped or cut off; last at step 4, phase data); rank 0 waiting for " in line, line
    assert "phase checkpoint" in line
    assert (tmp_path / "STALLED").read_text() == line + "\n"


def test_a_rank_cut_off_from_the_store_ends_by_itself(tmp_path):
    """Every store call hangs (this node's link is cut): the watch's clock goes on, sees the
    store silent past timeout_s, and ends the rank with 86, the line and STALLED, while the main
    thread still waits (in a point-to-point receive, say)."""
    script = _peer_script(tmp_path, "{}", """
        w.beat("compute", step=2)
        def waiting_in_a_receive():
            time.sleep(120)
        waiting_in_a_receive()
    """, hang=True)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100)
    assert done.returncode == STALLED_EXIT_CODE, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: stalled: rank 0 cut off: the job's store"), line
    assert "at step 2, phase compute" in line and "the other ranks' progress is unknown" in line, line
    assert (tmp_path / "STALLED").read_text() == line + "\n"
    assert "waiting_in_a_receive" in (tmp_path / "rank.log").read_text()


def test_only_the_first_rank_to_report_prints_the_line(tmp_path):
    """Another rank reported the stall first (the store's counter): this one writes its line to
    its log, leaves that rank's STALLED alone, and exits 86 without printing. The line names the
    limit that ran out: a collective in a checkpoint save waited the start-up limit, not timeout_s."""
    (tmp_path / "STALLED").write_text("error: stalled: the first rank's line\n")
    script = _peer_script(tmp_path, '{"longctx/stall-reported": "1"}', """
        with w.slow_phase("checkpoint"):
            w.collective_failed(RuntimeError("Timed out waiting 600000ms for recv operation to complete"))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == STALLED_EXIT_CODE, done.stderr
    assert "error: stalled:" not in done.stderr, done.stderr
    assert (tmp_path / "STALLED").read_text() == "error: stalled: the first rank's line\n"
    logged = (tmp_path / "rank.log").read_text()
    assert "error: stalled: " in logged and "phase checkpoint: a collective gave up after 600 s" in logged, logged


@pytest.mark.parametrize("peer", ["publishing", "done"])
def test_a_live_or_finished_peer_does_not_end_a_long_phase(tmp_path, peer):
    """The same long phase with a peer that keeps publishing (it waits at the barrier), or that
    finished its work long ago (rank 0 still writes its reports): no stall."""
    if peer == "done":
        data = ('{"longctx/progress/1": \'{"step": 10, "phase": "done", "idle_s": 0.0, "time": %r}\' '
                '% (time.time() - 50)}')
        keep = ""
    else:
        data = "{}"
        keep = """
        import json, threading
        def rank_1():
            while True:
                store.data["longctx/progress/1"] = json.dumps({"step": 4, "phase": "checkpoint", "idle_s": 5.0,
                                                                 "time": time.time()}).encode()
                time.sleep(0.5)
        threading.Thread(target=rank_1, daemon=True).start()
        """
    script = _peer_script(tmp_path, data, keep + """
        with w.slow_phase("checkpoint"):
            time.sleep(6)  # past the silence threshold
        w.stop()
        print("saved")
    """, timeout_s=1.0)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "saved", done.stderr
