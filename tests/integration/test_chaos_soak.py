"""A seeded 10-fault chaos soak of one train configuration (2 processes, dp 2, ZeRO-1, a packed
data cache, under torchrun): kills of a worker, the job and the launcher, SIGTERM/SIGUSR1 at
start-up, mid-run and mid-save, damaged checkpoints, stale locks, a full disk (as root) and an
edited data file, each followed by the same command until the run ends. Every run must end at
its last step with the losses and final weights of an uninterrupted run and nothing left behind
(scripts/faults/chaos_soak.py checks it; the full matrix is its 100-fault run, docs/operations.md).
Seed 3 draws no stall (SIGSTOP, held read): those cost ~45 s each and are tested apart
(test_stalls.py, test_eval_stalls.py; the soak's own in docs/results/2026-12-06-chaos-soak-stalls.md).
2 to 6 minutes on this 2-core machine (118 s at load 3, 378 s at load 14)."""
import json
import subprocess
import sys

import pytest

from helpers.recipes import ROOT
from helpers.train import env


@pytest.mark.slow  # minutes; CI runs it (slow is not heavy)
def test_a_seeded_ten_fault_soak_loses_nothing(tmp_path):
    report = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "faults" / "chaos_soak.py"), "--faults", "10", "--seed", "3",
           "--configs", "1", "--eval-share", "0", "--work", str(tmp_path / "work"), "--json", str(report)]
    e = dict(env(), TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"), TMPDIR=str(tmp_path))
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=e, timeout=3600)  # a hang guard
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    soak = json.loads(report.read_text())
    assert sum(run["faults"] for run in soak["runs"]) == 10
    assert all(run["ok"] and run["max_loss_diff"] <= 1e-6 and run["max_weight_diff"] <= 1e-6 for run in soak["runs"])
