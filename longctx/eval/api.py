"""In-process evaluation: what the CLI and the demo call.

    result = evaluate(model, tokenizer, tasks=["niah_single_1", "passkey"], lengths=[256, 512],
                      samples=20, options=TaskOptions(style="compact"), out_dir="run/eval")
    result["summary"]["tasks"]["passkey"]["scores"]["512"]

Samples are generated for every (task, length[, depth]) cell *before* the model runs, so a
length below a task's minimum fails in seconds, not after an hour of decoding.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

import torch.distributed as dist

from longctx.errors import UserError
from longctx.eval.report import aggregate, render_markdown, write_results
from longctx.eval.runner import Engine, run_samples
from longctx.eval.scoring import DEFAULT_THRESHOLD
from longctx.eval.tasks import TaskOptions, build_samples, get_task

DEFAULT_DEPTHS = [i / 10 for i in range(11)]


def _is_main() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def generate_all(tasks: Sequence[str], lengths: Sequence[int], samples: int, tokenizer, *, seed: int = 0,
                 options: TaskOptions = TaskOptions(), depths: Optional[dict] = None) -> tuple[list, list[str]]:
    """All samples, and the skip messages for tasks whose data is missing (QA)."""
    out, skipped = [], []
    for name in tasks:
        task = get_task(name)
        reason = task.unavailable_reason(options)
        if reason:
            skipped.append(reason)
            continue
        for L in lengths:
            out += build_samples(task, tokenizer, L, samples, seed=seed, options=options,
                                 depths=(depths or {}).get(name))
    return out, skipped


def evaluate(model, tokenizer, *, tasks: Sequence[str] = (), lengths: Sequence[int] = (), samples: int = 10,
             seed: int = 0, options: TaskOptions = TaskOptions(), depths: Optional[dict] = None,
             ppl_lengths: Sequence[int] = (), ppl_windows: int = 4, ppl_data: Optional[str] = None,
             cp_group=None, cp_impl: str = "ring", batch_size: Optional[int] = None,
             max_batch_tokens: int = 16384, threshold: float = DEFAULT_THRESHOLD,
             out_dir: Optional[str | Path] = None, meta: Optional[dict] = None, progress: bool = True,
             save_inputs: bool = False, warnings_: Sequence[str] = (), predictor=None) -> dict:
    """Run tasks (and perplexity) and, with out_dir, write results.json, report.md and figures.

    depths maps a task name to the needle depths of its grid (e.g. {"niah_single_2": [0, .5, 1]}).
    Returns {"summary", "records", "ppl", "skipped", "files"}.
    """
    t0 = time.time()
    lengths = sorted(set(int(L) for L in lengths))
    all_samples, skipped = generate_all(tasks, lengths, samples, tokenizer, seed=seed, options=options, depths=depths)
    if tasks and not all_samples and not ppl_lengths:
        raise UserError("eval.tasks: nothing to run (" + "; ".join(skipped) + ")")
    engine = Engine(model, tokenizer, cp_group=cp_group, cp_impl=cp_impl, batch_size=batch_size,
                    max_batch_tokens=max_batch_tokens, add_bos=options.add_bos)
    records = run_samples(engine, all_samples, progress=progress, predictor=predictor) if all_samples else []
    if save_inputs:
        by_key = {(s.task, s.target_length, s.index): s.prompt for s in all_samples}
        for r in records:
            r["prompt"] = by_key[(r["task"], r["target_length"], r["index"])]
    ppl = None
    if ppl_lengths:
        from longctx.eval.ppl import perplexity_vs_length

        ppl = perplexity_vs_length(model, tokenizer, sorted(set(ppl_lengths)), num_windows=ppl_windows,
                                   data_path=ppl_data, cp_group=cp_group, cp_impl=cp_impl,
                                   progress=progress and _is_main())
    summary = aggregate(records, threshold) if records else {"threshold": threshold, "lengths": [], "tasks": {},
                                                             "average_by_length": {}, "average": None,
                                                             "effective_length": 0, "grids": {}}
    stats = dict(engine.stats)
    if stats["seconds"] > 0:
        stats["tokens_per_second"] = (stats["prompt_tokens"] + stats["new_tokens"]) / stats["seconds"]
    meta = dict(meta or {}, seed=seed, samples=samples, style=options.style, wall_seconds=round(time.time() - t0, 1),
                generation=stats)
    files: list[str] = []
    if out_dir is not None and _is_main():
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = write_outputs(out, meta, summary, records, ppl, skipped, list(warnings_),
                              max_position=getattr(getattr(model, "config", None), "max_position_embeddings", None))
    return {"summary": summary, "records": records, "ppl": ppl, "skipped": skipped, "files": files, "meta": meta}


def write_outputs(out: Path, meta: dict, summary: dict, records, ppl, skipped, warnings_,
                  max_position: Optional[int] = None) -> list[str]:
    from longctx.eval import plots

    figures = []
    for name, grid in summary.get("grids", {}).items():
        figures.append(str(plots.needle_heatmap(grid, out / f"heatmap_{name}.png", title=f"{name}: score by depth x length")))
    if summary.get("tasks"):
        figures.append(str(plots.score_curves(summary, out / "scores_vs_length.png", max_position)))
    if ppl:
        figures.append(str(plots.ppl_curve(ppl, out / "ppl_vs_length.png", max_position)))
    write_results(out / "results.json", meta, summary, records, ppl, skipped, warnings_)
    (out / "report.md").write_text(render_markdown(meta, summary, ppl, skipped, warnings_, figures))
    return [str(out / "results.json"), str(out / "report.md")] + figures
