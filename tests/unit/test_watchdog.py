"""The stall watch's rules (longctx/runtime/watchdog.py, parallel/timeouts.py): which limit applies
when, which peers a report names, and a stalled phase ending the process with its stacks."""
import subprocess
import sys
import textwrap

import pytest

from longctx.parallel.timeouts import timeout_problem
from longctx.runtime.watchdog import (
    STALLED_EXIT_CODE,
    STEP_MULTIPLE,
    Watchdog,
    describe_peers,
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
    w.beat("data", step=1)
    assert w.limit_s() == 600.0 and w.collective_timeout_s() == 600.0  # until the first step finished
    w.step_done(100.0)  # the first step (compilation, warm-up) does not count
    assert w.collective_timeout_s() == 30.0
    assert w.limit_s() == 600.0  # between steps: checkpoints, validation, logging
    w.beat("compute", step=2)
    assert w.limit_s() == 30.0
    w.step_done(2.0)
    w.beat("data", step=3)
    assert w.limit_s() == 30.0 + STEP_MULTIPLE * 2.0
    with w.slow_phase("checkpoint"):
        assert w.phase == "checkpoint" and w.limit_s() == 600.0
    assert w.phase == "between steps"


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


def test_a_silent_peer_ends_a_long_phase_after_timeout_s(tmp_path):
    """A checkpoint save has the start-up limit, but a peer whose watch published nothing for
    longer than timeout_s is stopped or cut off: the waiting rank ends the job then."""
    script = textwrap.dedent(f"""
        import pathlib, time
        from longctx.runtime.watchdog import Watchdog

        class Peers:  # rank 1 reported once, 50 s ago, then nothing (SIGSTOPped)
            def publish(self, step, phase, idle_s):
                pass

            def read(self):
                return {{1: {{"step": 4, "phase": "data", "idle_s": 0.0, "time": time.time() - 50}}}}

        out = pathlib.Path({str(tmp_path)!r})
        w = Watchdog(rank=0, world=2, timeout_s=2.0, startup_timeout_s=600.0, log_path=out / "rank.log",
                     marker_dir=out, peers=Peers()).start()
        w.step_done(0.01)
        w.beat("compute", step=4)
        w.step_done(0.01)
        with w.slow_phase("checkpoint"):
            time.sleep(60)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == STALLED_EXIT_CODE, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: stalled: rank 1 silent for 50 s (stopped or cut off; last at step 4, phase "
                           "data); rank 0 waiting for "), line
    assert "phase checkpoint" in line


@pytest.mark.parametrize("peer", ["publishing", "done"])
def test_a_live_or_finished_peer_does_not_end_a_long_phase(tmp_path, peer):
    """The same long phase with a peer that keeps publishing (it waits at the barrier), or that
    finished its work long ago (rank 0 still writes its reports): no stall."""
    script = f"PEER = {peer!r}\n" + textwrap.dedent("""
        import time
        from longctx.runtime.watchdog import Watchdog

        class Peers:
            def publish(self, step, phase, idle_s):
                pass

            def read(self):
                if PEER == "done":
                    return {1: {"step": 10, "phase": "done", "idle_s": 0.0, "time": time.time() - 50}}
                return {1: {"step": 4, "phase": "checkpoint", "idle_s": 5.0, "time": time.time() - 1}}

        w = Watchdog(rank=0, world=2, timeout_s=1.0, startup_timeout_s=600.0, log_path=None, marker_dir=None,
                     peers=Peers()).start()
        w.step_done(0.01)
        with w.slow_phase("checkpoint"):
            time.sleep(4)
        print("saved")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "saved", done.stderr
