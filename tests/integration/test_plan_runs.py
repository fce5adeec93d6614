"""The memory planner against real processes: `train --dry-run` prints the breakdown, and one
real run is within 20% of the estimate."""
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def test_train_dry_run_prints_the_breakdown():
    """Without a `# cluster:` line the dry run plans this machine: per GPU on a GPU machine, host
    memory per process without one."""
    res = subprocess.run([sys.executable, "-m", "longctx", "train", "--dry-run", "--world-size", "8",
                          "model.preset=llama2-7b", "parallel.cp_size=8", "data.seq_len=65536",
                          "data.micro_batch_size=1", "train.dtype=bfloat16", "parallel.zero_stage=3"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    what = "memory per GPU" if torch.cuda.is_available() else "host memory per process (CPU RSS)"
    assert f"{what}: ZeRO-3" in res.stdout and "total (peak)" in res.stdout


def test_planner_within_20_percent_of_a_real_run(tmp_path):
    """One configuration of benchmarks/bench_plan.py measured for real (the full table is in
    docs/results/2026-11-29-plan-accuracy.md); benchmarks/ is on pytest's pythonpath."""
    import bench_plan

    from longctx.plan import RUNTIME_GB

    overhead = RUNTIME_GB["cpu"]  # the documented calibration (benchmarks/bench_plan.py measures it)
    overrides = ["data.seq_len=2048", "model.overrides.num_hidden_layers=4"]
    measured = bench_plan.measure(1, [*bench_plan.MODEL, *overrides], tmp_path)["measured_gb"]
    predicted = bench_plan.predict(1, overrides, overhead)["predicted_gb"]
    assert abs(predicted - measured) / measured < 0.20, (predicted, measured, overhead)
