"""longctx/storage/locks.py: a lock is judged by whether its holder runs, never by its age."""
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from longctx.storage import locks

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from longctx.storage.locks import liveness_lock
    with liveness_lock(Path(sys.argv[1]), what="a test", notify=print):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
""")


def _holder(path, seconds):
    """A process holding `path` for `seconds` (returns once it holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _take(path, **kw):
    notes = []
    with locks.liveness_lock(path, what="the work", notify=notes.append, poll_s=0.05, **kw) as me:
        assert json.loads(path.read_text())["pid"] == os.getpid() == me.pid
    return notes


def test_a_live_holder_is_waited_for_and_named(tmp_path):
    path = tmp_path / "op.lock"
    holder = _holder(path, 1.0)
    notes = _take(path, expected="about a second")
    assert holder.wait(timeout=60) == 0  # it finished before we held the lock
    assert len(notes) == 1, notes  # one line, however long the wait
    assert notes[0].startswith(f"waiting for the work by pid {holder.pid} on {socket.gethostname()}, since ")
    assert notes[0].endswith("(about a second)")
    assert not path.exists()  # released: nothing left behind


def test_a_dead_holder_is_taken_over_at_once(tmp_path):
    path = tmp_path / "op.lock"
    holder = _holder(path, 600)
    holder.kill()
    holder.wait()
    assert path.exists()  # what a killed holder leaves
    notes = _take(path)
    assert len(notes) == 1 and notes[0].startswith(f"taking over {path}: its holder (pid {holder.pid} on ")
    assert notes[0].endswith("is no longer running") and not path.exists()


def test_a_reused_pid_is_not_the_holder(tmp_path):
    """The pid runs, but it started at another time than the holder: another process."""
    path = tmp_path / "op.lock"
    me = locks.this_process()
    path.write_text(json.dumps({**me.__dict__, "proc_start": (me.proc_start or 0) + 1}))
    assert locks.is_alive(locks.read_holder(path)) is False
    assert "no longer running" in _take(path)[0]


def test_an_unreadable_lock_counts_as_dead(tmp_path):
    path = tmp_path / "op.lock"
    path.write_text("")
    assert "no longer running" in _take(path)[0]


def test_a_holder_on_another_host_is_waited_for_with_how_to_clear_it(tmp_path):
    path = tmp_path / "op.lock"
    path.write_text(json.dumps({"host": "node-elsewhere", "pid": 1, "proc_start": 1, "taken": time.time()}))
    assert locks.is_alive(locks.read_holder(path)) is None
    threading.Timer(0.5, path.unlink).start()  # that host's job finishing
    notes = _take(path)
    assert (len(notes) == 1 and "pid 1 on node-elsewhere" in notes[0]
            and f"if node-elsewhere is gone, remove {path}" in notes[0])


def test_release_leaves_another_holders_lock(tmp_path):
    path = tmp_path / "op.lock"
    me = locks.this_process()
    assert locks.try_take(path, me) and not locks.try_take(path, me)
    other = locks.Holder("h", 12345, None, 0.0)
    path.write_text(json.dumps(other.__dict__))
    locks.release(path, me)
    assert path.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["op.lock"]  # no aside file either


@pytest.mark.parametrize("pid", [0, -1])
def test_nonpositive_pids_are_dead(pid):
    assert locks.is_alive(locks.Holder(socket.gethostname(), pid, None, 0.0)) is False


def _dead_holder_lock(path):
    dead = locks.Holder(socket.gethostname(), 0, None, 0.0)  # pid 0 is never a live holder
    path.write_text(json.dumps(dead.__dict__))
    return dead


def test_taking_over_a_dead_holder_never_removes_the_lock_another_process_took_since(tmp_path):
    path = tmp_path / "op.lock"
    dead = _dead_holder_lock(path)
    locks.remove_dead(path, dead)  # the first to take over removes it ...
    first = locks.Holder(socket.gethostname(), os.getpid(), None, 1.0)
    assert locks.try_take(path, first)  # ... and takes it
    locks.remove_dead(path, dead)  # a second, which read the dead holder before, comes late
    assert locks.read_holder(path) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["op.lock"]  # no breaker left


def test_a_breaker_a_dead_process_left_is_removed(tmp_path):
    path = tmp_path / "op.lock"
    dead = _dead_holder_lock(path)
    path.with_name("op.lock.break").write_text(json.dumps(dead.__dict__))
    notes = _take(path)
    assert notes and not path.exists() and not path.with_name("op.lock.break").exists()


RACE = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from longctx.storage import locks
    path, inside = Path(sys.argv[1]), Path(sys.argv[2])
    with locks.liveness_lock(path, what="w", notify=lambda line: None, poll_s=0.01):
        fd = os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # fails if another holds it too
        time.sleep(0.2)
        os.close(fd)
        os.unlink(inside)
""")


def test_processes_taking_over_one_dead_holder_at_once_hold_it_one_at_a_time(tmp_path):
    path, inside = tmp_path / "op.lock", tmp_path / "inside"
    _dead_holder_lock(path)
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(path), str(inside)], stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    assert sorted(p.name for p in tmp_path.iterdir()) == []
