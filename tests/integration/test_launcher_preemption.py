"""launch/torchrun.sh under a time budget: a USR1 to the launcher (as `timeout --foreground
--signal=USR1` sends it) reaches the workers, the trainer saves a checkpoint, and the launcher
exits 85 with one line naming the step, not torchrun's 1 (an eval: its cells kept, the line names
them); a USR1 that arrives once the work finished leaves a complete run's exit code 0; a stale
PREEMPTED marker from an earlier run does not turn a failure into a preemption."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil

import longctx
from helpers.process_hooks import held_after_work_env, slow_batches_env
from helpers.recipes import ROOT
from helpers.train import env
from longctx.model import build_model, get_preset
from longctx.storage.locks import this_process, try_take
from longctx.train.run_lock import lock_path

RECIPE = ROOT / "configs" / "cpu" / "smollm2-135m-32k.yaml"


def _launch(longctx_args: list, log_path, e: dict) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen([str(ROOT / "launch" / "torchrun.sh"), "--nproc-per-node", "2", "--", *longctx_args],
                                stdout=log, stderr=subprocess.STDOUT, env=e, cwd=ROOT, start_new_session=True)


def _launcher_env() -> dict:
    e = env()
    e["LONGCTX_PYTHON"] = sys.executable
    return e


def _start(out, log_path, *overrides):
    return _launch(["train", "--config", str(RECIPE), f"out_dir={out}", "log.progress=false", *overrides], log_path,
                   _launcher_env())


def _kill_all(launcher: subprocess.Popen) -> None:
    """SIGKILL to a launcher that still runs and to everything under it: torchrun's workers run
    in sessions of their own, out of reach of a kill to the launcher's process group."""
    if launcher.poll() is not None:
        return
    try:
        tree = [launcher.pid, *(p.pid for p in psutil.Process(launcher.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait(timeout=60)


def _usr1_once(launcher: subprocess.Popen, ready, log_path, then=lambda: None) -> int:
    """SIGUSR1 to the launcher once ready() holds (it must still run), then `then()`; its exit code."""
    try:
        deadline = time.monotonic() + 300  # against a hang only
        while not ready() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert launcher.poll() is None, log_path.read_text()[-3000:]
        launcher.send_signal(signal.SIGUSR1)
        then()
        return launcher.wait(timeout=300)
    finally:
        _kill_all(launcher)


def _steps(out) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_usr1_to_the_launcher_checkpoints_and_exits_85(tmp_path):
    out = tmp_path / "run"
    launcher = _start(out, tmp_path / "launch.log", "train.steps=100000")
    rc = _usr1_once(launcher, lambda: _steps(out) >= 2, tmp_path / "launch.log")
    log = (tmp_path / "launch.log").read_text()
    assert rc == 85, log[-3000:]
    step = int((out / "PREEMPTED").read_text())
    assert log.strip().splitlines()[-1] == (
        f"[torchrun.sh] preempted: checkpoint saved at step {step}; the same command resumes it")
    assert (out / "checkpoints" / f"step_{step:07d}" / "COMPLETE").exists()
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == \
        list(range(1, step + 1))


def _tiny_eval_command(tmp_path) -> tuple[list, object]:
    """A two-task debug-tiny eval (one cell per task) and its --out."""
    model_dir = tmp_path / "model"
    longctx.save_pretrained(build_model(get_preset("debug-tiny"), seed=0), model_dir)
    out = tmp_path / "eval"
    return ["eval", "--model", str(model_dir), "--lengths", "256", "--cp", "1", "--out", str(out),
            "--tasks", "passkey,niah_single_1", "--depths", "0,1", "--samples", "2", "--style", "compact",
            "--tokenizer", "byte", "--max-new-tokens", "4", "--batch-size", "1", "--no-progress"], out


def test_a_usr1_after_the_work_finished_leaves_exit_code_0(tmp_path):
    # a time budget or SLURM's warning that comes just too late: both workers have finished the
    # eval and are held in their teardown when the launcher forwards the signal
    command, out = _tiny_eval_command(tmp_path)
    e = _launcher_env()
    mark, release = held_after_work_env(tmp_path, e)
    log_path = tmp_path / "launch.log"
    finished = [mark.with_name(f"{mark.name}.{rank}") for rank in (0, 1)]

    def release_after_delivery():
        time.sleep(1.0)  # forwarded and delivered while both are held
        release.touch()

    rc = _usr1_once(_launch(command, log_path, e), lambda: all(f.exists() for f in finished), log_path,
                    then=release_after_delivery)
    log = log_path.read_text()
    assert rc == 0, log[-3000:]
    assert "preempted" not in log
    assert not (out / "PREEMPTED").exists()
    assert json.loads((out / "results.json").read_text())["summary"]["tasks"].keys() == {"passkey", "niah_single_1"}


def test_a_stale_marker_does_not_make_a_failure_a_preemption(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    marker = out / "PREEMPTED"
    marker.write_text("7\n")
    os.utime(marker, (time.time() - 3600, time.time() - 3600))  # an earlier run's
    # the workers fail after the preflight, before the trainer clears stale markers: this live
    # process holds the run directory's lock
    assert try_take(lock_path(out), this_process())
    launcher = _start(out, tmp_path / "launch.log", "train.steps=2")
    rc = launcher.wait(timeout=300)
    log = (tmp_path / "launch.log").read_text()
    assert rc not in (0, 85), log[-3000:]
    assert "is in use by another training job" in log
    assert "[torchrun.sh] preempted" not in log


def test_usr1_to_the_launcher_stops_an_eval_with_its_cells_and_exits_85(tmp_path):
    command, out = _tiny_eval_command(tmp_path)
    e = _launcher_env()
    mark = slow_batches_env(tmp_path, e)
    rc = _usr1_once(_launch(command, tmp_path / "launch.log", e), mark.exists, tmp_path / "launch.log")
    log = (tmp_path / "launch.log").read_text()
    assert rc == 85, log[-3000:]
    done = (out / "PREEMPTED").read_text().strip()  # "k of 2 cells", k < 2
    assert done.endswith(" of 2 cells") and int(done.split()[0]) < 2, done
    assert log.strip().splitlines()[-1] == (
        f"[torchrun.sh] preempted: {done} done in {out}; the same command continues it")
    assert not (out / "results.json").exists()

    again = _launch(command, tmp_path / "again.log", e)
    assert again.wait(timeout=600) == 0, (tmp_path / "again.log").read_text()[-3000:]
    assert "cells already done in" in (tmp_path / "again.log").read_text()
    assert not (out / "PREEMPTED").exists()
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["tasks"].keys() == {"passkey", "niah_single_1"}
