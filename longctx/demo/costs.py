"""What each extension run cost and bought, one row per run (the demo report's cost table and
summary.json's `runs`): the parameters it trained, its retrieval at the extension length, rank
0's peak memory, the training job's wall time and its training throughput.

Memory and throughput are the trainer's own numbers from the run's metrics.jsonl (peak memory:
CUDA max allocated, on CPU the process's peak RSS; tokens/s: row positions per second of step
time, as the trainer's progress line counts them). The trained-parameter count is the trainer's:
the model the job started from, with the run's train.adapter applied as the trainer applies it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from longctx.config.adapter import AdapterSection
from longctx.model.adapter import apply_adapter, trainable_count
from longctx.model.hf import load_pretrained
from longctx.model.llama import count_parameters


def trained_parameters(init_from: Path, adapter: Optional[AdapterSection], seed: int) -> tuple[int, int]:
    """(parameters a run from `init_from` trains, parameters of the model it trains, the LoRA
    factors included) for a full run (adapter None) or an adapter run: the trainer's own count."""
    model = load_pretrained(init_from)
    if adapter is None:
        return count_parameters(model), count_parameters(model)
    apply_adapter(model, adapter, seed)
    return trainable_count(model), count_parameters(model)


def step_rates(run_dir: Path) -> dict:
    """Peak memory (GiB, rank 0, the largest over the steps), tokens/s over the steps after the
    first (its allocations and first gathers are warm-up; a one-step run keeps it) and the step
    count, from run_dir/metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "step_time_s" in r]
    if not rows:
        raise RuntimeError(f"{path}: no step records; see {run_dir / 'train.log'}")
    timed = rows[1:] or rows
    return {"steps": len(rows), "peak_memory_gb": max(r["peak_memory_gb"] for r in rows),
            "tokens_per_s": sum(r["slots"] for r in timed) / sum(r["step_time_s"] for r in timed)}


def run_cost(variant: str, run_dir: Path, init_from: Path, adapter: Optional[AdapterSection], seed: int,
             wall_seconds: float, scores: dict, extend_len: int) -> dict:
    """One row of the cost table: `scores` is the variant's score table (evaluation.score_table)."""
    trained, total = trained_parameters(init_from, adapter, seed)
    rates = step_rates(run_dir)
    return {"variant": variant, "run_dir": run_dir.name, "steps": rates["steps"],
            "adapter": None if adapter is None else {
                "type": adapter.type, "r": adapter.r, "alpha": adapter.alpha,
                "target_modules": list(adapter.target_modules), "trainable": list(adapter.trainable)},
            "trained_parameters": trained, "model_parameters": total,
            "retrieval_at_extend_len": scores["average"].get(extend_len),
            "retrieval_at_extend_len_stderr": scores.get("average_se", {}).get(extend_len),
            "peak_memory_gb_per_rank": rates["peak_memory_gb"], "wall_seconds": wall_seconds,
            "tokens_per_s": rates["tokens_per_s"]}
