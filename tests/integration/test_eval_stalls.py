"""A stalled rank ends a `longctx eval` at cp = 2 like a lost node (issue 63): rank 1 is held
before the first batch of the second cell, then SIGSTOPped; with eval.timeout_s=15 the job
ends by itself, launch/torchrun.sh exits 86, the line names rank 1, every rank's stacks are in
its log, no process is left, and the same command continues with the finished cell kept.
The bound below is a guard against a hang, not a timing: the job ends about 15 s (the timeout)
+ 30 s (torchrun's grace for the stopped worker) after the stall."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import longctx
from helpers.process_hooks import held_batch_env
from helpers.recipes import ROOT
from helpers.stalls import left_running, worker
from helpers.train import env
from longctx.model import build_model, get_preset

pytestmark = pytest.mark.slow

ENDS_WITHIN_S = 150
FIRST_CELL = "256/passkey.json"  # 2 samples (depths 0, 1) in 2 batches of 1; then 512/passkey, the same


def _command(model_dir, out, log_dir) -> list[str]:
    return [str(ROOT / "launch" / "torchrun.sh"), "--nproc-per-node", "2", "--log-dir", str(log_dir), "--",
            "eval", "--model", str(model_dir), "--tasks", "passkey", "--depths", "0,1", "--lengths", "256,512",
            "--samples", "1", "--style", "compact", "--tokenizer", "byte", "--max-new-tokens", "4",
            "--batch-size", "1", "--no-progress", "--cp", "2", "--timeout-s", "15", "--out", str(out)]


def _env(tmp_path) -> dict:
    return dict(env(), LONGCTX_PYTHON=sys.executable, TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))


def test_a_stalled_rank_ends_the_eval_and_the_rerun_keeps_the_finished_cell(tmp_path):
    model_dir, out = tmp_path / "model", tmp_path / "eval"
    longctx.save_pretrained(build_model(get_preset("debug-tiny"), seed=0), model_dir)
    first_env, log_path = _env(tmp_path), tmp_path / "first.log"
    mark, release = held_batch_env(tmp_path, first_env, rank=1, at_batch=3)
    job = subprocess.Popen(_command(model_dir, out, tmp_path / "logs1"), stdout=open(log_path, "w"),
                           stderr=subprocess.STDOUT, cwd=ROOT, env=first_env, start_new_session=True)
    try:
        deadline = time.monotonic() + 600  # start-up on a loaded machine; against a hang only
        while not mark.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists(), log_path.read_text()[-3000:]  # rank 1 is held: the eval cannot finish by itself
        tree = psutil.Process(job.pid).children(recursive=True)
        stalled_at = time.monotonic()
        os.kill(worker(job, 1).pid, signal.SIGSTOP)
        rc = job.wait(timeout=ENDS_WITHIN_S)
        ended_after = time.monotonic() - stalled_at
    finally:
        release.touch()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    text = log_path.read_text()
    assert rc == 86, text[-3000:]
    survivors = left_running(tree)
    assert not survivors, survivors
    line = next(x for x in text.splitlines() if "error: stalled:" in x)
    assert "rank 1 silent for" in line and "rank 0 at batch round" in line and "a collective gave up" in line, line
    assert "[torchrun.sh] stalled:" in text
    assert (out / "STALLED").read_text().startswith("error: stalled:")
    assert not (out / ".longctx-eval.lock").exists()  # released by the stall's exit (rank 0 held it)
    logs = "".join(p.read_text() for p in (tmp_path / "logs1").rglob("*.log"))
    assert "--- rank 0: Python stacks at the stall ---" in logs and "File " in logs
    kept = (out / "cells" / FIRST_CELL).read_bytes()
    assert json.loads(kept)["complete"] and not (out / "results.json").exists()

    again = subprocess.run(_command(model_dir, out, tmp_path / "logs2"), capture_output=True, text=True, cwd=ROOT,
                           env=_env(tmp_path), timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert (out / "cells" / FIRST_CELL).read_bytes() == kept  # reused, not recomputed
    assert json.loads((out / "timing.json").read_text())["cells_reused"] == 1
    assert not (out / "STALLED").exists()
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert set(summary["tasks"]["passkey"]["scores"]) == {"256", "512"}
    print(f"the eval ended {ended_after:.0f} s after the stall")
