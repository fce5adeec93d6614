"""SLURM scripts, run for real on one machine with stub sbatch/srun/scontrol (tests/helpers/slurm_stubs):
a 2-process CPU training is preempted by USR1, checkpoints, requeues itself and resumes to the
end; bad input stops with one clear line before anything starts; the scripts pass shellcheck."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.train import free_port

ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "tests" / "helpers" / "slurm_stubs"
SCRIPTS = sorted([*ROOT.glob("slurm/*.sbatch"), *ROOT.glob("launch/*.sh")])


def _env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PATH=f"{STUBS}:{Path(sys.executable).parent}:{env.get('PATH', '')}",
               SLURM_STUB_STATE=str(tmp_path / "state"),
               LONGCTX_PYTHON=sys.executable, LONGCTX_LOG_DIR=str(tmp_path / "logs"), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def _config(tmp_path: Path, steps: int) -> Path:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"""out_dir: {tmp_path / 'run'}
model: {{preset: debug-tiny}}
data: {{seq_len: 256, micro_batch_size: 2, shuffle: false}}
parallel: {{cp_size: 2, zero_stage: 3}}
train: {{steps: {steps}}}
checkpoint: {{every: 0, save_hf: false, export_hf: false}}
log: {{tensorboard: false, progress: false}}
""")
    return cfg


def _wait(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _metrics(out: Path) -> list:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_sbatch_train_preempted_by_usr1_requeues_and_resumes(tmp_path):
    # the script derives its port from the job id unless MASTER_PORT is set; on a shared test
    # machine the stub's predictable job ids could meet a port in use
    env = _env(tmp_path, MASTER_PORT=str(free_port()))
    steps = 60
    cfg = _config(tmp_path, steps)
    res = subprocess.run(["sbatch", "--nodes=1", "--gpus-per-node=2", f"--output={tmp_path}/%x-%j.out",
                          "slurm/train.sbatch", str(cfg)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0, res.stderr
    job = res.stdout.split()[-1]
    state, out = tmp_path / "state", tmp_path / "run"
    log = tmp_path / f"longctx-train-{job}.out"
    try:
        _wait(lambda: len(_metrics(out)) >= 3, 300, "3 training steps")
        # `#SBATCH --signal=B:USR1@600`: SLURM signals the batch shell
        os.kill(int((state / f"{job}.pid").read_text()), signal.SIGUSR1)
        _wait(lambda: (state / f"{job}.done").exists(), 400, "the job (and its requeued run) to finish")
    finally:
        print(log.read_text() if log.exists() else "(no log)")
    rc, restarts = (int(x) for x in (state / f"{job}.done").read_text().split())
    text = log.read_text()
    assert rc == 0 and restarts == 1, text[-3000:]
    assert "received SIGUSR1" in text and "requeueing job" in text and "training finished" in text
    preempted_at = int(re.search(r"preempted: checkpoint saved at step (\d+); requeueing job", text).group(1))
    assert 3 <= preempted_at < steps
    # the second run resumed from the preemption checkpoint (not from scratch) and finished
    rank_logs = "".join(p.read_text() for p in (out / "logs").glob("rank_*.log"))
    assert f"resumed from {out / 'checkpoints' / f'step_{preempted_at:07d}'} at step {preempted_at}" in rank_logs
    records = _metrics(out)
    assert records[-1]["step"] == steps and not (out / "PREEMPTED").exists()
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert (out / "checkpoints" / f"step_{steps:07d}" / "COMPLETE").exists()
    # per-job logs: torchrun kept each rank's output, for both runs
    job_logs = tmp_path / "logs" / f"longctx-train-{job}"
    assert (job_logs / "restart-0").is_dir() and (job_logs / "restart-1").is_dir()
    assert list(job_logs.glob("restart-1/**/stderr.log"))


def _run_script(tmp_path, script, args, **env_extra):
    env = _env(tmp_path, **env_extra)
    return subprocess.run(["bash", str(ROOT / script), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


SLURM_ENV = {"SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "t", "SLURM_JOB_NODELIST": "localhost",
             "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "2"}


@pytest.mark.parametrize("missing,needle", [
    ("SLURM_JOB_ID", "SLURM_JOB_ID is not set: run this script with sbatch"),
    ("SLURM_JOB_NODELIST", "SLURM_JOB_NODELIST is not set"),
    ("SLURM_JOB_NUM_NODES", "SLURM_JOB_NUM_NODES is not set (nor SLURM_NNODES)"),
    ("SLURM_GPUS_ON_NODE",
     "SLURM_GPUS_ON_NODE is not set (nor SLURM_GPUS_PER_NODE): request GPUs with --gpus-per-node"),
])
def test_missing_slurm_variable_is_a_clear_error(tmp_path, missing, needle):
    env = {k: v for k, v in SLURM_ENV.items() if k != missing}
    res = _run_script(tmp_path, "slurm/train.sbatch", [str(_config(tmp_path, 2))], **env)
    assert res.returncode == 2 and res.stderr.strip() == f"error: {res.stderr.strip()[7:]}"
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "state" / "srun.log").exists()


def test_unwritable_log_dir_is_a_clear_error(tmp_path):
    res = _run_script(tmp_path, "slurm/train.sbatch", [str(_config(tmp_path, 2))], **SLURM_ENV,
                      LONGCTX_LOG_DIR="/proc/longctx-logs")
    assert res.returncode == 2
    assert "log directory /proc/longctx-logs/t-77 is not writable; set LONGCTX_LOG_DIR" in res.stderr
    assert not (tmp_path / "state" / "srun.log").exists()


def test_recipe_needing_more_gpus_than_the_job_has_stops_before_srun(tmp_path):
    res = _run_script(tmp_path, "slurm/train.sbatch", ["configs/yarn-llama2-7b-128k.yaml"], **SLURM_ENV)
    assert res.returncode == 2, res.stderr
    assert ("configs/yarn-llama2-7b-128k.yaml is written for 64 GPUs (nodes=8 x gpus_per_node=8, global batch 64 rows) "
            "but this job has 2; submit with --nodes=8 --gpus-per-node=8, or set LONGCTX_ALLOW_FEWER_GPUS=1 to run "
            "it smaller (raise train.grad_accum to keep the global batch)") in res.stderr
    assert not (tmp_path / "state" / "srun.log").exists()
    # a plain config whose cp exceeds the job
    res = _run_script(tmp_path, "slurm/train.sbatch", [str(_config(tmp_path, 2)), "parallel.cp_size=4",
                                                       "data.seq_len=512"], **SLURM_ENV)
    assert res.returncode == 2 and "parallel.cp_size: 4 needs at least 4 GPUs" in res.stderr


def test_eval_array_runs_one_length_per_task(tmp_path):
    import longctx
    from longctx.model import build_model, get_preset

    model_dir = tmp_path / "model"
    longctx.save_pretrained(build_model(get_preset("debug-tiny"), seed=0), model_dir)
    env = _env(tmp_path, LONGCTX_EVAL_LENGTHS="256 512", LONGCTX_EVAL_TOKENS_PER_GPU="256")
    res = subprocess.run(["sbatch", "--array=0-1", "--gpus-per-node=2", f"--output={tmp_path}/%x-%A_%a.out",
                          "slurm/eval_array.sbatch", str(model_dir), str(tmp_path / "eval"), "--suite", "passkey",
                          "--samples", "2", "--style", "compact", "--tokenizer", "byte", "--no-progress"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    job = res.stdout.split()[-1]
    _wait(lambda: (tmp_path / "state" / f"{job}.done").exists(), 300, "the eval array")
    logs = "".join(p.read_text() for p in tmp_path.glob("longctx-eval-len-*.out"))
    assert (tmp_path / "state" / f"{job}.done").read_text().split()[0] == "0", logs[-3000:]
    assert "length 256, cp 1 x dp 2" in logs and "length 512, cp 2 x dp 1" in logs
    for length in (256, 512):
        results = json.loads((tmp_path / "eval" / f"len-{length}" / "results.json").read_text())
        assert length in results["meta"]["lengths"]


def test_eval_array_task_without_a_length(tmp_path):
    res = _run_script(tmp_path, "slurm/eval_array.sbatch", ["m", "o"], **SLURM_ENV, SLURM_ARRAY_TASK_ID="9")
    assert res.returncode == 2 and "array task 9 has no length" in res.stderr and "--array=0-5" in res.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck is not installed (apt-get install shellcheck)")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_pass_shellcheck(script):
    res = subprocess.run(["shellcheck", "-x", "-P", str(ROOT), str(script)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout
