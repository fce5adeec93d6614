"""out_dir's lock: refused while its holder lives, taken over when it is gone or requeued."""
import json
import os
import socket
import subprocess
import sys
from dataclasses import asdict

import pytest

from longctx.base.errors import UserError
from longctx.storage.locks import Holder, process_start, read_holder
from longctx.train import run_lock


def _write_holder(out_dir, holder: Holder) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    run_lock.lock_path(out_dir).write_text(json.dumps(asdict(holder)))


def _live_parent() -> Holder:
    pid = os.getppid()
    return Holder(socket.gethostname(), pid, process_start(pid), 0.0)


def _exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_acquire_creates_out_dir_and_release_removes_the_lock(tmp_path):
    out = tmp_path / "run"
    me = run_lock.acquire(out, notify=pytest.fail)
    assert read_holder(run_lock.lock_path(out)) == me and me.pid == os.getpid()
    run_lock.release_lock(out, me)
    assert not run_lock.lock_path(out).exists()


def test_a_live_holder_is_refused_with_its_pid(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    holder = _live_parent()
    _write_holder(tmp_path, holder)
    with pytest.raises(UserError, match=rf"in use by another training job \(pid {holder.pid} on "):
        run_lock.acquire(tmp_path, notify=pytest.fail)
    assert read_holder(run_lock.lock_path(tmp_path)) == holder  # untouched


def test_a_dead_holder_is_taken_over_with_a_notice(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    _write_holder(tmp_path, Holder(socket.gethostname(), _exited_pid(), None, 0.0))
    notes = []
    me = run_lock.acquire(tmp_path, notify=notes.append)
    assert len(notes) == 1 and "no longer running" in notes[0]
    assert read_holder(run_lock.lock_path(tmp_path)) == me


def test_the_same_slurm_job_takes_over_a_live_or_remote_holder(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    _write_holder(tmp_path, Holder("node-elsewhere", 17, None, 0.0, job="4242"))
    notes = []
    run_lock.acquire(tmp_path, notify=notes.append)
    assert len(notes) == 1 and "this SLURM job (4242), requeued" in notes[0]


def test_another_hosts_holder_of_another_job_is_refused_with_how_to_clear_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    _write_holder(tmp_path, Holder("node-elsewhere", 17, None, 0.0, job="2"))
    with pytest.raises(UserError, match=r"cannot be checked from here; if that job is gone, remove .*\.longctx\.lock"):
        run_lock.acquire(tmp_path, notify=pytest.fail)
