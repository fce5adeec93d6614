"""One writer per run directory, as an operator meets it: the same job submitted twice, a job
SIGKILLed and resubmitted, a resume that falls back to an older checkpoint."""
import json
import os
import signal
import time

from helpers.process_hooks import stalled_data_env
from helpers.train import TINY, env, run_train, start_train
from longctx.train.run_lock import LOCK_NAME
from longctx.train.signals import PREEMPTED_EXIT_CODE

COMMON = [*TINY, "data.seq_len=256", "log.every=1", "checkpoint.every=2"]


def _steps(out):
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _wait_for_steps(proc, out, n, timeout=180):
    deadline = time.time() + timeout
    while not ((out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= n):
        assert proc.poll() is None, "the first job ended early"
        assert time.time() < deadline, "the first job made no progress"
        time.sleep(0.05)


def _held_first_job(tmp_path, out, at_batch):
    """The first job, held before batch `at_batch` until the test releases it: it cannot finish
    on its own before the test is done with it, however fast the machine."""
    first_env = env()
    mark, release = stalled_data_env(tmp_path, first_env, rank=0, at_batch=at_batch)
    first = start_train(1, [f"out_dir={out}", *COMMON, "train.steps=400"], tmp_path / "first.log", first_env)
    return first, mark, release


def test_a_second_job_into_a_live_run_directory_is_refused_and_touches_nothing(tmp_path):
    out = tmp_path / "run"
    first, _, release = _held_first_job(tmp_path, out, at_batch=2)
    try:
        _wait_for_steps(first, out, 2)
        before = {p: p.read_bytes() for p in (out / "resolved_config.yaml", out / "logs" / "rank_00000.log")}
        second = run_train(1, [f"out_dir={out}", *COMMON, "train.steps=400", "train.seed=7"])
        assert second.returncode == 2, second.stderr[-3000:]
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: out_dir: ") and f"pid {first.pid} on " in lines[0], lines
        assert (out / "resolved_config.yaml").read_bytes() == before[out / "resolved_config.yaml"]
        assert (out / "logs" / "rank_00000.log").read_bytes().startswith(before[out / "logs" / "rank_00000.log"])
        first.send_signal(signal.SIGUSR1)
        release.touch()  # it finishes the held step, saves and stops
        assert first.wait(timeout=180) == PREEMPTED_EXIT_CODE
    finally:
        release.touch()
        if first.poll() is None:
            first.kill()
    steps = _steps(out)
    assert steps == list(range(1, len(steps) + 1))  # every step once, one run's
    assert not (out / LOCK_NAME).exists()  # the finished job released it


def test_a_killed_job_is_taken_over_and_metrics_end_with_the_steps_that_count(tmp_path):
    out = tmp_path / "run"
    first, _, _ = _held_first_job(tmp_path, out, at_batch=5)
    try:
        _wait_for_steps(first, out, 5)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    assert (out / LOCK_NAME).exists()  # a killed job cannot release it
    logged = _steps(out)[-1]
    saved = max(int(d.name.split("_")[1]) for d in (out / "checkpoints").glob("step_*") if (d / "COMPLETE").exists())
    res = run_train(1, [f"out_dir={out}", *COMMON, f"train.steps={saved + 2}", "checkpoint.resume=auto"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"taking over {out / LOCK_NAME} from pid {first.pid}" in res.stderr and "no longer running" in res.stderr
    assert _steps(out) == list(range(1, saved + 3))
    if logged > saved:  # the killed job had logged steps past its last checkpoint: kept aside, not mixed in
        abandoned = [json.loads(line)["step"] for line in (out / "metrics.abandoned.jsonl").read_text().splitlines()
                     if line.startswith("{") and line.endswith("}")]
        assert abandoned[:logged - saved] == list(range(saved + 1, logged + 1))
        assert "moved from metrics.jsonl to metrics.abandoned.jsonl" in res.stderr
