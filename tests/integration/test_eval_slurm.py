"""slurm/eval_array.sbatch under the stub SLURM (tests/helpers/slurm_stubs): a USR1 to the batch
shell mid-eval (as `--signal=B:USR1@300` sends it) stops the eval after its batch in flight, the
task requeues itself and continues from its cells, and the final results.json is byte for byte
the one an uninterrupted eval writes."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import longctx
from helpers.process_hooks import slow_batches_env
from helpers.train import env as plain_env
from longctx.model import build_model, get_preset

ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "tests" / "helpers" / "slurm_stubs"


def _wait(predicate, timeout, what):
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_eval_array_task_preempted_by_usr1_requeues_and_ends_with_the_uninterrupted_bytes(tmp_path):
    model_dir = tmp_path / "model"
    longctx.save_pretrained(build_model(get_preset("debug-tiny"), seed=0), model_dir)
    args = ["--tasks", "passkey,niah_single_1", "--depths", "0,1", "--samples", "2", "--style", "compact",
            "--tokenizer", "byte", "--max-new-tokens", "4", "--batch-size", "1", "--no-progress"]
    direct = subprocess.run([sys.executable, "-m", "longctx", "eval", "--model", str(model_dir), "--lengths", "256",
                             "--cp", "1", "--out", str(tmp_path / "direct"), *args],
                            capture_output=True, text=True, timeout=600, env=plain_env(), cwd=ROOT)
    assert direct.returncode == 0, direct.stderr[-3000:]

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PATH=f"{STUBS}:{Path(sys.executable).parent}:{env.get('PATH', '')}",
               SLURM_STUB_STATE=str(tmp_path / "state"),
               LONGCTX_PYTHON=sys.executable, LONGCTX_LOG_DIR=str(tmp_path / "logs"), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", LONGCTX_EVAL_LENGTHS="256")
    mark = slow_batches_env(tmp_path, env)
    res = subprocess.run(["sbatch", "--array=0-0", "--gpus-per-node=2", f"--output={tmp_path}/%x-%A_%a.out",
                          "slurm/eval_array.sbatch", str(model_dir), str(tmp_path / "eval"), *args],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    job = int(res.stdout.split()[-1])
    task = job + 1  # the stub numbers array task i job + 1 + i
    _wait(mark.exists, 300, "the first decoding batch")
    os.kill(int((tmp_path / "state" / f"{task}.pid").read_text()), signal.SIGUSR1)
    _wait(lambda: (tmp_path / "state" / f"{job}.done").exists(), 600, "the eval array")
    log = "".join(p.read_text() for p in tmp_path.glob("longctx-eval-len-*.out"))
    rc, restarts = (tmp_path / "state" / f"{task}.done").read_text().split()
    assert (rc, restarts) == ("0", "1"), log[-4000:]
    assert "received SIGUSR1: the eval finishes its batch" in log
    assert "preempted (SIGUSR1): " in log and "exit code 85; run the same command again to continue" in log
    assert f"requeueing job {task} (restart 1)" in log
    assert "resuming: " in log and "cells already done in" in log
    out = tmp_path / "eval" / "len-256"
    assert not (out / "PREEMPTED").exists()
    assert (out / "results.json").read_bytes() == (tmp_path / "direct" / "results.json").read_bytes()
    assert json.loads((out / "results.json").read_text())["summary"]["tasks"].keys() == {"passkey", "niah_single_1"}
