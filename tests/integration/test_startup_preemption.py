"""A preemption signal during start-up stops the run with the preemption exit code (85), not by
the signal's default action: SIGUSR1 while Python imports torch, once the run directory's lock is
taken, inside a blocking call (the engine build, acted on as it returns), and on a resume; through
launch/torchrun.sh too. Nothing is left that the next start trips over: the same command then
trains the run to its end."""
import json
import signal
import subprocess
import sys
import time

import pytest

from helpers.recipes import ROOT
from helpers.startup_hooks import held_build_env
from helpers.train import TINY, env, metrics

PREEMPTED = 85


def _cmd(out, steps=2):
    return [sys.executable, "-m", "longctx", "train", *TINY, f"out_dir={out}", f"train.steps={steps}",
            "checkpoint.every=2", "checkpoint.resume=auto"]


def _env(tmp_path) -> dict:
    return dict(env(), TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"), LONGCTX_PYTHON=sys.executable)


def _catches_usr1(pid: int) -> bool:
    """The process has a handler for SIGUSR1 (its first statements ran; /proc/PID/status SigCgt)."""
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        return False
    caught = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGUSR1 - 1)))


def _signal_when(cmd, ready, tmp_path, e=None, then=lambda: None, log_name="first.log"):
    proc = subprocess.Popen(cmd, stdout=open(tmp_path / log_name, "w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env=e or _env(tmp_path), start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # against a hang only
        while not ready(proc) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, (tmp_path / log_name).read_text()[-3000:]
        proc.send_signal(signal.SIGUSR1)
        then()
        return proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _finishes_after(out, tmp_path, steps=2):
    res = subprocess.run(_cmd(out, steps), capture_output=True, text=True, cwd=ROOT, env=_env(tmp_path), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert [r["step"] for r in metrics(out)] == list(range(1, steps + 1))
    for left in ("PREEMPTED", ".longctx.lock"):
        assert not (out / left).exists()
    assert not list((out / "checkpoints").glob(".tmp-*"))


def _stopped_before_first_step(out, tmp_path, rc, resumes_from=0):
    log = (tmp_path / "first.log").read_text()
    assert rc == PREEMPTED, log[-3000:]
    assert "Traceback" not in log
    assert (out / "PREEMPTED").read_text().strip() == str(resumes_from)
    assert not (out / ".longctx.lock").exists()
    after = f"resumes from step {resumes_from}" if resumes_from else "starts the run"
    assert f"preempted (SIGUSR1) during start-up, before the first step: nothing trained; exit code 85; " \
           f"the same command {after}" in log


@pytest.mark.parametrize("moment", ["imports", "lock taken"])
def test_usr1_during_start_up_exits_85(tmp_path, moment):
    out = tmp_path / "run"
    # imports: as soon as the entry point's first statements installed the handler (torch not loaded yet)
    ready = (lambda p: _catches_usr1(p.pid)) if moment == "imports" else (lambda p: (out / ".longctx.lock").exists())
    rc = _signal_when(_cmd(out), ready, tmp_path)
    _stopped_before_first_step(out, tmp_path, rc)
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()
    _finishes_after(out, tmp_path)


def test_usr1_inside_a_blocking_call_is_acted_on_as_it_returns(tmp_path):
    out = tmp_path / "run"
    e = _env(tmp_path)
    mark, release = held_build_env(tmp_path, e)
    rc = _signal_when(_cmd(out), lambda p: mark.with_name(f"{mark.name}.0").exists(), tmp_path, e,
                      then=lambda: (time.sleep(0.5), release.touch()))
    _stopped_before_first_step(out, tmp_path, rc)
    assert not (out / "checkpoints").exists()
    _finishes_after(out, tmp_path)


def test_usr1_while_a_resume_starts_keeps_its_checkpoint(tmp_path):
    out = tmp_path / "run"
    res = subprocess.run(_cmd(out, 2), capture_output=True, text=True, cwd=ROOT, env=_env(tmp_path), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    before = (out / "checkpoints" / "step_0000002" / "MANIFEST.json").read_bytes()
    e = _env(tmp_path)
    mark, release = held_build_env(tmp_path, e)
    rc = _signal_when(_cmd(out, 4), lambda p: mark.with_name(f"{mark.name}.0").exists(), tmp_path, e,
                      then=release.touch)
    _stopped_before_first_step(out, tmp_path, rc, resumes_from=2)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_0000002"]
    assert (out / "checkpoints" / "step_0000002" / "MANIFEST.json").read_bytes() == before
    _finishes_after(out, tmp_path, steps=4)


def test_usr1_to_torchrun_sh_during_start_up_exits_85(tmp_path):
    out = tmp_path / "run"
    e = _env(tmp_path)
    mark, release = held_build_env(tmp_path, e)
    cmd = [str(ROOT / "launch" / "torchrun.sh"), "--nproc-per-node", "2", "--", *_cmd(out)[3:]]
    both = [mark.with_name(f"{mark.name}.{r}") for r in (0, 1)]
    rc = _signal_when(cmd, lambda p: all(m.exists() for m in both), tmp_path, e, then=release.touch)
    log = (tmp_path / "first.log").read_text()
    assert rc == PREEMPTED, log[-3000:]
    assert log.strip().splitlines()[-1] == \
        "[torchrun.sh] preempted before the first step; the same command starts the run"
    assert json.loads((out / "PREEMPTED").read_text()) == 0
    _finishes_after(out, tmp_path)
