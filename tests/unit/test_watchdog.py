"""The stall watch's rules (longctx/watchdog.py, parallel/timeouts.py): which limit applies
when, which peers a report names, and a stalled phase ending the process with its stacks."""
import subprocess
import sys
import textwrap

import pytest

from longctx.parallel.timeouts import timeout_problem
from longctx.watchdog import (
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
                3: {"step": 5, "phase": "compute", "idle_s": 3.0, "time": now - 1}}  # fine
    found = describe_peers(progress, me=0, world=5, limit_s=30.0, now=now)
    assert found == ["rank 1 silent for 40 s (stopped or cut off; last at step 5, phase compute)",
                     "rank 2 stuck for 25 s at step 5, phase data",
                     "rank 4 never reported progress"]


@pytest.mark.parametrize("text, timed_out", [
    ("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete", True),
    ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE)", True),
    ("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234", True),
    ("CUDA out of memory", False)])
def test_is_collective_timeout(text, timed_out):
    assert is_collective_timeout(RuntimeError(text)) == timed_out
    assert not is_collective_timeout(ValueError(text))


def test_a_stalled_phase_ends_the_process_with_its_stacks(tmp_path):
    """The thread sees no progress past the limit: one line, the stacks in the log, STALLED, the
    on_end callback, exit 86 -- while the main thread is still stuck."""
    script = textwrap.dedent(f"""
        import pathlib, time
        from longctx.watchdog import Watchdog
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
