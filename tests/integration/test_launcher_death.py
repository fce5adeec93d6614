"""Workers die with their launcher: whatever process the user started -- torchrun,
launch/torchrun.sh (torchrun is its child), `accelerate launch` -- is SIGKILLed during start-up
or mid-run, and no worker outlives it (longctx/runtime/launcher_tie.py, launch/die_with_parent.py). The
same command started again resumes the run. The waits are hang guards, not timings: the workers
go within a second here (docs/launch.md)."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from helpers.recipes import ROOT
from helpers.train import TINY, env, free_port, metrics

GONE_WITHIN_S = 60  # the issue asks for 30 s; a generous guard against a loaded machine

LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                 "-m", "longctx"],
    "torchrun.sh": [str(ROOT / "launch" / "torchrun.sh"), "--nproc-per-node", "2", "--"],
    "accelerate": [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
                   "{port}", "-m", "longctx"],
}


def _env(tmp_path) -> dict:
    return dict(env(), LONGCTX_PYTHON=sys.executable, TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))


def _start(launcher, out, tmp_path, log_name):
    port = str(free_port())  # accelerate's default 29500 may be taken by another job on this machine
    launch = [port if a == "{port}" else a for a in LAUNCHERS[launcher]]
    cmd = [*launch, "train", *TINY, f"out_dir={out}", "train.steps=6", "checkpoint.every=2",
           "checkpoint.resume=auto", "log.every=1"]
    return subprocess.Popen(cmd, stdout=open(tmp_path / log_name, "w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env=_env(tmp_path), start_new_session=True)


def _workers(launcher: subprocess.Popen) -> list:
    try:
        tree = psutil.Process(launcher.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for p in tree:
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "longctx" in line and not any(w in line for w in ("torch.distributed.run", "accelerate", "preflight",
                                                              "die_with_parent")):
            found.append(p)
    return found


def _alive(procs) -> list:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _logged(out) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
@pytest.mark.parametrize("moment", ["start-up", "mid-run"])
def test_workers_die_with_their_sigkilled_launcher(tmp_path, launcher, moment):
    if launcher == "accelerate":
        pytest.importorskip("accelerate")
    out = tmp_path / "run"
    proc = _start(launcher, out, tmp_path, "first.log")
    deadline = time.monotonic() + 300  # against a hang only
    ready = (lambda: len(_workers(proc)) == 2) if moment == "start-up" else (lambda: _logged(out) >= 2)
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    workers = _workers(proc)
    assert len(workers) == 2
    if moment == "start-up":
        assert _logged(out) == 0  # before the first step
    tree = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone = time.monotonic() + GONE_WITHIN_S
    while _alive(tree) and time.monotonic() < gone:
        time.sleep(0.1)
    survivors = _alive(tree)
    for p in survivors:
        p.kill()
    assert not survivors, f"{len(survivors)} processes outlived the launcher: {[p.cmdline() for p in survivors]}"

    if moment == "mid-run":  # the same command resumes: the dead job's lock is taken over
        again = _start(launcher, out, tmp_path, "again.log")
        assert again.wait(timeout=600) == 0, (tmp_path / "again.log").read_text()[-3000:]
        log = (tmp_path / "again.log").read_text()
        assert "taking over" in log and "it is no longer running" in log
        assert [r["step"] for r in metrics(out)] == list(range(1, 7))
        assert not (out / ".longctx.lock").exists()
