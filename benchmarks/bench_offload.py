"""Activation offload on CPU: the real trainer at world 2 with `parallel.offload_activations=disk`
against none, interleaved (none, disk, none, disk, ...), at one length; the measured peak RSS and
tokens/s of rank 0 next to the planner's predicted peak, and the planner's longest sequence within
a per-rank budget for both.

The model and settings are bench_peers.py's longctx contender (bench-44m, cp 2 Ulysses, full
checkpointing with the attention recomputed, MLP tiles of 2048 tokens, 1024-token loss chunks),
with glibc's mmap threshold fixed at 64 KiB so that RSS tracks live memory (bench_plan.py's note).
The prediction uses the planner's CPU runtime constant (0.36 GiB, docs/plan.md).

    python benchmarks/bench_offload.py --seq-len 32768 --repeat 2 --out docs/results/bench_offload.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib.memory import mmap_env
from benchlib.procs import free_port
from benchlib.report import write_json

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
SETTINGS = ["model.preset=bench-44m", "parallel.cp_size=2", "parallel.cp_impl=ulysses",
            "parallel.activation_checkpointing=full", "parallel.recompute_attention=true",
            "parallel.mlp_tile_tokens=2048", "train.loss_chunk_size=1024", "data.micro_batch_size=1",
            "log.tensorboard=false", "log.progress=false", "checkpoint.save_hf=false", "checkpoint.export_hf=false",
            "data.shuffle=false", "data.prefetch=0"]
MODES = ("none", "disk")


def overrides(seq_len: int, mode: str, steps: int) -> list[str]:
    return [*SETTINGS, f"data.seq_len={seq_len}", f"model.max_position_embeddings={seq_len}",
            f"train.steps={steps}", f"parallel.offload_activations={mode}"]


def measure(seq_len: int, mode: str, steps: int, workdir: Path) -> dict:
    """One training run (torchrun, world 2); rank 0's peak RSS and its last step's tokens/s."""
    out = workdir / f"run-{mode}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD), "--master_port",
           str(free_port()), "-m", "longctx", "train", f"out_dir={out}", *overrides(seq_len, mode, steps)]
    env = mmap_env({k: v for k, v in os.environ.items()
                    if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")})
    env["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"training failed ({mode}, {seq_len}):\n{res.stderr[-3000:]}")
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"mode": mode, "peak_gib": max(r["peak_memory_gb"] for r in recs), "tokens_per_s": recs[-1]["tokens_per_s"],
            "step_time_s": recs[-1]["step_time_s"], "losses": [r["loss"] for r in recs],
            "wall_s": time.perf_counter() - start}


def predict(seq_len: int, mode: str, budget_gib: float) -> dict:
    """The planner's peak per rank at `seq_len` and its longest sequence within `budget_gib`."""
    import dataclasses

    from longctx.config import load_config, resolve_stages, stage_model_config
    from longctx.plan import estimate_memory, layout_of
    from longctx.plan.advice import max_length

    cfg = load_config(None, overrides(seq_len, mode, 2))
    stage = resolve_stages(cfg)[0]
    model_cfg = stage_model_config(stage)
    est = estimate_memory(cfg, stage, model_cfg, WORLD, device="cpu")
    layout = layout_of(cfg, stage, WORLD)
    longest = max_length(model_cfg.replace(max_position_embeddings=2**24), dataclasses.replace(layout),
                         budget_gib * 2**30, device="cpu", runtime_gb=None)
    return {"predicted_gib": est.peak_gb, "predicted_longest": longest,
            "breakdown_gib": {k: round(v / 2**30, 4) for k, v in est.components().items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=32768)
    ap.add_argument("--repeat", type=int, default=2, help="runs per mode, interleaved")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budget-gib", type=float, default=1.5, help="per-rank budget of the predicted longest")
    ap.add_argument("--out", help="write the runs and predictions as JSON")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for mode in MODES:
                r = measure(args.seq_len, mode, args.steps, Path(tmp))
                runs.append(r)
                print(f"{mode} #{i}: peak {r['peak_gib']:.3f} GiB, {r['tokens_per_s']:.0f} tokens/s, "
                      f"wall {r['wall_s']:.0f} s", flush=True)
    summary = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        rates = sorted(r["tokens_per_s"] for r in mine)
        peak = max(r["peak_gib"] for r in mine)
        pred = predict(args.seq_len, mode, args.budget_gib)
        summary[mode] = {"peak_gib": peak, "tokens_per_s_min": rates[0], "tokens_per_s_median": rates[len(rates) // 2],
                         **pred, "error": (pred["predicted_gib"] - peak) / peak}
        print(f"{mode}: measured peak {peak:.3f} GiB, predicted {pred['predicted_gib']:.3f} "
              f"({summary[mode]['error']:+.1%}); tokens/s median {summary[mode]['tokens_per_s_median']:.0f}; "
              f"predicted longest within {args.budget_gib} GiB: {pred['predicted_longest']:,}")
    same = all(r["losses"] == runs[0]["losses"] for r in runs)
    print(f"losses identical across modes and runs: {same}")
    if args.out:
        command = "python benchmarks/bench_offload.py " + " ".join(sys.argv[1:])
        write_json(args.out, {"command": command, "seq_len": args.seq_len, "world": WORLD, "settings": SETTINGS,
                              "runs": runs, "summary": summary, "losses_identical": same}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
