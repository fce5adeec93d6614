"""Runs on several layouts for the resume-on-another-layout test and table
(tests/integration/test_resume_layout.py, scripts/faults/resume_layout_table.py)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from helpers.train import env

# every layout trains 4 rows per step (micro-batch 2 x grad_accum x dp)
LAYOUTS = {
    "2 ranks, ZeRO-1": (2, ["parallel.zero_stage=1"]),
    "1 rank, ZeRO-1": (1, ["parallel.zero_stage=1", "train.grad_accum=2"]),
    "1 rank, ZeRO-2": (1, ["parallel.zero_stage=2", "train.grad_accum=2"]),
    "2 ranks, ZeRO-2": (2, ["parallel.zero_stage=2"]),
    "2 ranks cp 2, ZeRO-1": (2, ["parallel.zero_stage=1", "parallel.cp_size=2", "train.grad_accum=2"]),
    "2 ranks, ZeRO-3": (2, ["parallel.zero_stage=3"]),
    "1 rank, ZeRO-0": (1, ["train.grad_accum=2"]),
    "1 rank, ZeRO-3": (1, ["parallel.zero_stage=3", "train.grad_accum=2"]),
}

# the trainer with a resume that loses the Adam moments (zeroed in the converted checkpoint)
NO_MOMENTS = """
import sys, torch
import longctx.checkpoint.store as checkpoint
import longctx.checkpoint.universal as universal
convert = universal.to_universal
def without_moments(ds_dir, folder, names):
    convert(ds_dir, folder, names)
    for file in (folder / universal.TAG / "zero").glob("*/exp_avg*.pt"):
        state = torch.load(file, weights_only=False)
        torch.save(dict(state, param=torch.zeros_like(state["param"])), file)
checkpoint.to_universal = without_moments
from longctx.commands.cli import main
sys.exit(main(sys.argv[1:]))
"""


def stopped_at(run: Path, out: Path, step: int) -> Path:
    """`out` as if `run` had stopped after `step`: its checkpoint of that step and its metrics."""
    name = f"step_{step:07d}"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / name, out / "checkpoints" / name)
    lines = (run / "metrics.jsonl").read_text().splitlines()[:step]
    (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return out


def train_without_moments(overrides: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    """One process of `longctx train` whose layout-change resume drops the Adam moments."""
    return subprocess.run([sys.executable, "-c", NO_MOMENTS, "train", *overrides], capture_output=True, text=True,
                          timeout=timeout, env=env())
