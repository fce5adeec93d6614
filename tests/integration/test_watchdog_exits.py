"""The stall watch across the process boundary (longctx/runtime/watchdog.py): a stalled phase,
a silent peer, a store that stops answering and a collective's error each end the process with
exit 86, the line, the stacks and STALLED, while its main thread is still stuck; a live or
finished peer, or a slow step, does not. The rules themselves are tested in-process
(tests/unit/test_watchdog.py, tests/unit/test_clock_skew.py)."""
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from longctx.runtime.watchdog import STALLED_EXIT_CODE

TESTS = str(Path(__file__).resolve().parents[1])  # a script's `helpers` (the in-memory store)


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
    assert re.match(r"error: stalled: rank 1 silent for \d+ s ", line), line
    assert "(stopped or cut off; last at step 4, phase data, written " in line, line
    assert " UTC by its host's clock); rank 0 waiting for " in line, line
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


@pytest.mark.parametrize("lost", ["stopped", "exited"])
def test_a_peer_lost_at_the_last_barrier_ends_the_job(tmp_path, lost):
    """A completed job's ranks meet at a last barrier (runtime/watchdog.meet_at_end) while rank 0
    writes its reports; a node lost then (rank 1 stopped: silent; or gone: its connection
    closed) ends rank 0 with 86 and the line, as at any step. Unwatched, rank 0 waited there,
    and its torchrun agent after it, for a node that was gone (issue 75's lost-node CI run)."""
    rank1 = ('{"longctx/progress/1": \'{"step": 10, "phase": "finish", "idle_s": 0.0, "time": %r}\' '
             '% (time.time() - 50)}')
    script = _peer_script(tmp_path, rank1 if lost == "stopped" else "{}", f"""
        import datetime, os, signal
        import torch.distributed as dist
        from longctx.runtime.watchdog import meet_at_end
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://" + {str(tmp_path / "rendezvous")!r}, rank=rank,
                                world_size=2, timeout=datetime.timedelta(seconds=600))
        if rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP) if {lost == "stopped"} else os._exit(0)
        meet_at_end(w)
        print("met")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in (0, 1)]
    try:
        out, err = procs[0].communicate(timeout=120)
    finally:
        procs[1].kill()
        procs[1].communicate(timeout=60)
    assert procs[0].returncode == STALLED_EXIT_CODE, out + err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: stalled: ") and "phase finish" in line, line
    assert (tmp_path / "STALLED").read_text() == line + "\n"
