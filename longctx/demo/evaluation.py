"""Steps 2 and 4: RULER-style retrieval at 1x..8x the training length, in this process.

Each task runs at every length it fits (compact niah_multivalue needs ~389 byte tokens, so not
at 256); the needle task of the heatmap runs on a depth grid, the others with random needle
placement. Outputs are the eval suite's own (results.json, report.md, heatmap, curves).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from longctx.base.errors import UserError
from longctx.checkpoint.find import tokenizer_spec_for
from longctx.data import load_tokenizer
from longctx.demo.config import EVAL_TASKS, HEATMAP_TASK, DemoConfig
from longctx.eval.outputs import Results, write_outputs
from longctx.eval.report import aggregate
from longctx.eval.runner import Engine, run_samples
from longctx.eval.tasks import TaskOptions, build_samples
from longctx.model.hf import load_pretrained
from longctx.model.llama import count_parameters


def task_min_length(task: str, tokenizer, options) -> int:
    """Smallest target length the task's compact prompt fits (binary search over build_samples)."""
    lo, hi = 16, 4096
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            build_samples(task, tokenizer, mid, 1, seed=0, options=options)
            hi = mid
        except UserError:
            lo = mid + 1
    return lo


def busy_cores(window_s: float = 0.3) -> float | None:
    """Cores kept busy by other processes, measured over `window_s` from /proc/stat (None
    where there is no /proc/stat). Not the load average: its minute-long memory still counts
    the training job that just ended, and would leave the eval on one thread."""
    def sample():
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # total, idle + iowait
    try:
        total0, idle0 = sample()
        time.sleep(window_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return 0.0 if total <= 0 else (1.0 - (idle1 - idle0) / total) * (os.cpu_count() or 1)


def eval_threads(busy: float | None = None) -> int:
    """The cores other processes leave free (at least one): OpenMP threads that wait for each
    other on oversubscribed cores make a step several times slower than one thread. `busy`
    defaults to busy_cores(), else to the 1-minute load average."""
    cpus = os.cpu_count() or 1
    if busy is None:
        busy = busy_cores()
    if busy is None:
        busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(cpus, round(cpus - busy)))


def evaluate_model(model_dir: Path, demo: DemoConfig, out_dir: Path, *, label: str, progress: bool = True) -> dict:
    """Evaluate the HF model in model_dir; writes out_dir/{results.json,report.md,*.png}.
    Returns the eval summary plus `wall_seconds` and `missing` ({task: [lengths not evaluated]})."""
    t0 = time.time()
    torch.set_num_threads(eval_threads())
    tokenizer_spec = tokenizer_spec_for(model_dir, None)  # the export's own: "byte" or its tokenizer files
    tokenizer = load_tokenizer(tokenizer_spec)
    options = TaskOptions(style="compact")
    model = load_pretrained(model_dir, dtype=getattr(torch, demo.dtype)).eval()  # the training dtype
    samples, missing = [], {}
    for task in EVAL_TASKS:
        minimum = task_min_length(task, tokenizer, options)
        for L in demo.lengths:
            if L < minimum:
                missing.setdefault(task, []).append(L)
                continue
            if task == HEATMAP_TASK:
                samples += build_samples(task, tokenizer, L, demo.heatmap_samples, seed=demo.eval_seed,
                                         options=options, depths=list(demo.heatmap_depths))
            else:
                samples += build_samples(task, tokenizer, L, demo.samples, seed=demo.eval_seed, options=options)
    engine = Engine(model, tokenizer, max_batch_tokens=16384)
    records = run_samples(engine, samples, progress=progress, desc=f"eval {label}")
    summary = aggregate(records)
    wall = time.time() - t0
    meta = {"model": str(model_dir), "tokenizer": tokenizer_spec, "style": "compact", "seed": demo.eval_seed,
            "samples": demo.samples, "wall_seconds": round(wall, 1), "variant": label,
            "rope_parameters": model.config.rope_parameters,
            "max_position_embeddings": model.config.max_position_embeddings,
            "dtype": demo.dtype, "generation": dict(engine.stats)}
    notes = [f"{t}: not evaluated at {', '.join(map(str, Ls))} (the compact prompt needs more tokens)"
             for t, Ls in missing.items()]
    out_dir.mkdir(parents=True, exist_ok=True)
    write_outputs(out_dir, Results(meta, summary, records, ppl=None, skipped=notes, warnings=[], comparability=None),
                  max_position=model.config.max_position_embeddings)
    return {"summary": summary, "wall_seconds": wall, "missing": missing, "parameters": count_parameters(model)}


def score_table(summary: dict, lengths: list) -> dict:
    """{"average": {L: score}, "average_se": {L: standard error}, task: {L: score}} with None
    where a task was not evaluated."""
    out = {"average": {L: summary["average_by_length"].get(str(L)) for L in lengths},
           "average_se": {L: summary.get("average_stderr_by_length", {}).get(str(L)) for L in lengths}}
    for task in EVAL_TASKS:
        scores = summary["tasks"].get(task, {}).get("scores", {})
        out[task] = {L: scores.get(str(L)) for L in lengths}
    return out

