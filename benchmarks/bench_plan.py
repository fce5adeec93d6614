"""Planner accuracy: `longctx plan`'s predicted peak memory vs the measured peak of real runs (CPU).

Each configuration trains a 20M-parameter model (4 layers, d512, GQA 8:4, vocab 8192) for 2
steps (the second runs with Adam states allocated) with the real trainer (torchrun for 2 ranks)
and reads the measured peak of rank 0 from metrics.jsonl (`peak_memory_gb`: peak RSS on CPU),
with glibc's mmap threshold fixed at 64 KiB (MALLOC_MMAP_THRESHOLD_, see the note below)
so that RSS tracks live memory. The prediction is `estimate_memory(...)` for the same config
with the CPU calibration: one fixed per-process runtime overhead, measured once per run of this
script as the peak RSS of the same trainer with the `debug-tiny` model (0.1M parameters, 256
tokens), where model states and activations are negligible. Nothing else is fitted.

    python benchmarks/bench_plan.py --out docs/results/bench_plan.json            # measure + predict
    python benchmarks/bench_plan.py --from-json docs/results/bench_plan.json      # re-predict, no training
    python benchmarks/bench_plan.py --from-json docs/results/bench_plan.json --only "T4k cp1 z0 none" \
        --out docs/results/bench_plan.json
                                                                          # re-measure some, keep the rest
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

MODEL = ["model.preset=debug-tiny", "model.overrides.hidden_size=512", "model.overrides.intermediate_size=1408",
         "model.overrides.num_hidden_layers=4", "model.overrides.num_attention_heads=8",
         "model.overrides.num_key_value_heads=4", "model.overrides.head_dim=64",
         "model.overrides.vocab_size=8192", "model.max_position_embeddings=32768"]
COMMON = ["data.micro_batch_size=1", "log.tensorboard=false", "log.progress=false", "checkpoint.save_hf=false",
          "checkpoint.export_hf=false", "train.steps=2", "data.shuffle=false", "data.prefetch=0"]
# name -> (processes, overrides)
CONFIGS: dict[str, tuple[int, list[str]]] = {
    "T4k cp1 z0 none": (1, ["data.seq_len=4096"]),
    "T8k cp1 z0 full": (1, ["data.seq_len=8192", "parallel.activation_checkpointing=full"]),
    "T8k cp2 z0 none": (2, ["data.seq_len=8192", "parallel.cp_size=2"]),
    "T8k cp2 z1 selective": (2, ["data.seq_len=8192", "parallel.cp_size=2", "parallel.zero_stage=1",
                                 "parallel.activation_checkpointing=selective"]),
    "T4k dp2 z2 none": (2, ["data.seq_len=4096", "parallel.zero_stage=2"]),
    "T16k cp2 z3 full": (2, ["data.seq_len=16384", "parallel.cp_size=2", "parallel.zero_stage=3",
                             "parallel.activation_checkpointing=full"]),
    # an adapter run of the layout above (LongLoRA's choice: LoRA on attention, embeddings and norms trained)
    "T16k cp2 z3 full lora": (2, ["data.seq_len=16384", "parallel.cp_size=2", "parallel.zero_stage=3",
                                  "parallel.activation_checkpointing=full",
                                  "train.adapter={r: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj], "
                                  "trainable: [embed_tokens, norm]}"]),
    "T8k cp2 z3 selective allgather": (2, ["data.seq_len=8192", "parallel.cp_size=2", "parallel.zero_stage=3",
                                           "parallel.cp_impl=allgather",
                                           "parallel.activation_checkpointing=selective"]),
}
# glibc serves allocations below its (adaptive, up to 32 MiB) mmap threshold from a heap that
# it rarely returns to the OS, so with the default the RSS of a CPU run creeps up step after
# step by whatever the heap has fragmented (measured in docs/plan.md). A fixed 64 KiB threshold
# makes every tensor its own mapping, returned on free, so RSS measures live memory -- what a GPU's caching
# allocator has to hold (the planner keeps a separate 8% reserve for its fragmentation).
# (benchlib.memory.MMAP_THRESHOLD, 64 KiB)
BASELINE = (1, ["model.preset=debug-tiny", "data.seq_len=256"])


def measure(nproc: int, overrides: list[str], workdir: Path) -> dict:
    """Train with the real CLI; returns the measured peak (GiB) of rank 0 and the wall time."""
    out = workdir / "run"
    shutil.rmtree(out, ignore_errors=True)
    args = ["-m", "longctx", "train", f"out_dir={out}", *COMMON, *overrides]
    cmd = [sys.executable, *args] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_port", str(free_port()), *args]
    env = mmap_env({k: v for k, v in os.environ.items()
                    if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")})
    env["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"training failed for {overrides}:\n{res.stderr[-3000:]}")
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    return {"measured_gb": max(r["peak_memory_gb"] for r in recs), "wall_s": time.perf_counter() - start,
            "tokens_per_s": recs[-1]["tokens_per_s"], "commit": commit}


def predict(nproc: int, overrides: list[str], overhead_gb: float) -> dict:
    from longctx.config import load_config, resolve_stages, stage_model_config
    from longctx.plan import estimate_memory

    cfg = load_config(None, [*COMMON, *MODEL, *overrides])
    stage = resolve_stages(cfg)[0]
    est = estimate_memory(cfg, stage, stage_model_config(stage), nproc, device="cpu",
                          runtime_overhead_gb=overhead_gb)
    return {"predicted_gb": est.peak_gb, "breakdown_gb": {k: v / 2**30 for k, v in est.components().items()}}


def table(rows: list[dict], overhead_gb: float) -> str:
    lines = [f"Fixed per-process runtime overhead (measured, debug-tiny trainer): {overhead_gb:.3f} GiB", "",
             "| configuration | ranks | measured peak (GiB) | predicted (GiB) | error | "
             "error without the runtime constant |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        err = (r["predicted_gb"] - r["measured_gb"]) / r["measured_gb"]
        err_model = (r["predicted_gb"] - r["measured_gb"]) / (r["measured_gb"] - overhead_gb)
        lines.append(f"| {r['name']} | {r['ranks']} | {r['measured_gb']:.3f} | {r['predicted_gb']:.3f} | {err:+.1%} "
                     f"| {err_model:+.1%} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write measurements and predictions as JSON")
    ap.add_argument("--from-json", help="reuse measurements from an earlier --out file (no training)")
    ap.add_argument("--only", help="comma list of configuration names to (re-)measure")
    args = ap.parse_args()
    names = [n.strip() for n in args.only.split(",")] if args.only else list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"--only: unknown {unknown}; valid: {list(CONFIGS)}")
    measured: dict = {}
    overhead = None
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        overhead = saved["overhead_gb"]
        measured = {r["name"]: r for r in saved["rows"]}
    to_run = names if not args.from_json else (names if args.only else [])
    if to_run:
        with tempfile.TemporaryDirectory() as tmp:
            if overhead is None:
                overhead = measure(*BASELINE, Path(tmp))["measured_gb"]
                print(f"baseline (runtime overhead): {overhead:.3f} GiB", flush=True)
            for name in to_run:
                m = measure(CONFIGS[name][0], [*MODEL, *CONFIGS[name][1]], Path(tmp))
                measured[name] = m
                print(f"{name}: measured {m['measured_gb']:.3f} GiB in {m['wall_s']:.0f} s", flush=True)
    names = [n for n in CONFIGS if n in measured]
    rows = []
    for name in names:
        if name not in measured:
            continue
        nproc, overrides = CONFIGS[name]
        row = {"name": name, "ranks": nproc, "overrides": overrides, "measured_gb": measured[name]["measured_gb"],
               "wall_s": measured[name].get("wall_s"), "tokens_per_s": measured[name].get("tokens_per_s"),
               "commit": measured[name].get("commit")}
        try:
            row.update(predict(nproc, overrides, overhead))
        except ImportError:
            row["predicted_gb"] = float("nan")
        rows.append(row)
    print(table(rows, overhead))
    worst = max(abs(r["predicted_gb"] - r["measured_gb"]) / r["measured_gb"] for r in rows)
    print(f"\nworst error: {worst:.1%} over {len(rows)} configurations")
    if args.out:
        write_json(args.out, {"overhead_gb": overhead, "rows": rows}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
