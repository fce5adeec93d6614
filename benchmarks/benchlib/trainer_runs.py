"""The real trainer at world 2 on CPU, one configuration per run, for the benchmarks that compare
two ways of training (bench_offload.py, bench_adapter.py): rank 0's peak RSS and tokens/s from
metrics.jsonl, and the planner's predicted peak and longest sequence for the same overrides.

glibc's mmap threshold is fixed at 64 KiB so that RSS tracks live memory (bench_plan.py's note);
the prediction uses the planner's CPU runtime constant (0.36 GiB, docs/plan.md), nothing fitted."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchlib.memory import mmap_env
from benchlib.procs import free_port
from longctx.config import load_config, resolve_stages, stage_model_config
from longctx.plan import estimate_memory, layout_of
from longctx.plan.advice import max_length

ROOT = Path(__file__).resolve().parents[2]
WORLD = 2
QUIET = ["data.micro_batch_size=1", "log.tensorboard=false", "log.progress=false", "checkpoint.save_hf=false",
         "checkpoint.export_hf=false", "data.shuffle=false", "data.prefetch=0"]


def with_length(overrides: list[str], seq_len: int, steps: int) -> list[str]:
    return [*QUIET, *overrides, f"data.seq_len={seq_len}", f"model.max_position_embeddings={seq_len}",
            f"train.steps={steps}"]


def measure(overrides: list[str], seq_len: int, steps: int, out: Path) -> dict:
    """One training run (torchrun, world 2, one thread per rank) into `out` (replaced): rank 0's
    peak RSS over the steps, the last step's tokens/s and time, every step's loss."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD), "--master_port",
           str(free_port()), "-m", "longctx", "train", f"out_dir={out}", *with_length(overrides, seq_len, steps)]
    env = mmap_env({k: v for k, v in os.environ.items()
                    if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")})
    env["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"training failed ({seq_len} tokens, {overrides}):\n{res.stderr[-3000:]}")
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"seq_len": seq_len, "peak_gib": max(r["peak_memory_gb"] for r in recs),
            "tokens_per_s": recs[-1]["tokens_per_s"], "step_time_s": recs[-1]["step_time_s"],
            "losses": [r["loss"] for r in recs], "wall_s": time.perf_counter() - start}


def predict(overrides: list[str], seq_len: int, budget_gib: float) -> dict:
    """The planner's peak per rank at `seq_len`, its breakdown, and its longest sequence within
    `budget_gib` per rank (the same layout, the length free)."""
    cfg = load_config(None, with_length(overrides, seq_len, 2))
    stage = resolve_stages(cfg)[0]
    model_cfg = stage_model_config(stage)
    est = estimate_memory(cfg, stage, model_cfg, WORLD, device="cpu")
    layout = layout_of(cfg, stage, WORLD)
    longest = max_length(model_cfg.replace(max_position_embeddings=2**24), dataclasses.replace(layout),
                         budget_gib * 2**30, device="cpu", runtime_gb=None)
    return {"predicted_gib": est.peak_gb, "predicted_longest": longest,
            "breakdown_gib": {k: round(v / 2**30, 4) for k, v in est.components().items()}}
