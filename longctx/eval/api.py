"""In-process evaluation: what `longctx eval` calls.

    cfg = EvalConfig(tasks=["niah_single_1", "passkey"], lengths=["256", "512"], samples=20,
                     style="compact", out="run/eval")
    result = evaluate(model, tokenizer, cfg)
    result["summary"]["tasks"]["passkey"]["scores"]["512"]

Samples are generated for every (task, length[, depth]) cell *before* the model runs: a cell
below its task's minimum length is skipped with one notice (in "skipped"), and when no cell is
left the error names lengths that fit, in seconds, not after an hour of decoding.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch.distributed as dist

from longctx.errors import UserError
from longctx.eval import plots
from longctx.eval.comparability import assess
from longctx.eval.config import EvalConfig, select
from longctx.eval.ppl import perplexity_vs_length
from longctx.eval.report import aggregate, render_markdown, write_markdown, write_results
from longctx.eval.ruler_format import read_ruler_data, write_predictions
from longctx.eval.runner import Engine, run_samples
from longctx.eval.tasks import BelowMinimum, Sample, TaskOptions, build_samples, get_task, no_fit_error, skip_notice


def _is_main() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def generate_all(tasks: Sequence[str], lengths: Sequence[int], samples: int, tokenizer, *, seed: int = 0,
                 options: TaskOptions = TaskOptions(), depths: Optional[dict] = None,
                 require_samples: bool = False) -> tuple[list, list[str]]:
    """All samples, and the skip messages: tasks whose data is missing (QA), and one line for
    the (task, length) cells below the task's minimum with this tokenizer. With
    `require_samples`, nothing left to run is a UserError naming lengths that would work."""
    out, skipped, below = [], [], []
    for name in tasks:
        task = get_task(name)
        reason = task.unavailable_reason(options)
        if reason:
            skipped.append(reason)
            continue
        for L in lengths:
            try:
                out += build_samples(task, tokenizer, L, samples, seed=seed, options=options,
                                     depths=(depths or {}).get(name))
            except BelowMinimum as e:
                below.append(e)
    if require_samples and not out:
        if below:
            raise no_fit_error(below, skipped)
        raise UserError("eval.tasks: nothing to run (" + "; ".join(skipped) + ")")
    if below:
        skipped.append(skip_notice(below))
    return out, skipped


def evaluate(model, tokenizer, cfg: EvalConfig, *, cp_group=None, meta: Optional[dict] = None,
             warnings_: Sequence[str] = (), predictor: Optional[Callable[[Sample], str]] = None) -> dict:
    """Run cfg's tasks (and perplexity) and, with cfg.out, write results.json, report.md and figures.

    cp_group: the context-parallel group of the prefill (None: one process); meta: extra
    entries of results.json's meta; predictor replaces the model (an oracle or a baseline).
    Returns {"summary", "records", "ppl", "skipped", "files", "meta"}.
    """
    t0 = time.time()
    run = select(cfg)
    progress = not cfg.no_progress
    if cfg.ruler_data is not None:  # RULER's prepared prompts instead of ours
        all_samples, skipped = read_ruler_data(cfg.ruler_data, tokenizer, run.options, lengths=run.lengths,
                                               tasks=cfg.tasks)
    else:
        all_samples, skipped = generate_all(run.tasks, run.lengths if run.tasks else [], cfg.samples, tokenizer,
                                            seed=cfg.seed, options=run.options, depths=run.grids,
                                            require_samples=bool(run.tasks) and not run.ppl_lengths)
    if run.tasks and not all_samples and not run.ppl_lengths:
        raise UserError("eval.tasks: nothing to run (" + "; ".join(skipped) + ")")
    engine = Engine(model, tokenizer, cp_group=cp_group, cp_impl=cfg.cp_impl, batch_size=cfg.batch_size,
                    max_batch_tokens=cfg.max_batch_tokens, add_bos=run.options.add_bos)
    records = run_samples(engine, all_samples, progress=progress, predictor=predictor) if all_samples else []
    if cfg.save_inputs:
        by_key = {(s.task, s.target_length, s.index): s.prompt for s in all_samples}
        for r in records:
            r["prompt"] = by_key[(r["task"], r["target_length"], r["index"])]
    ppl = None
    if run.ppl_lengths:
        ppl = perplexity_vs_length(model, tokenizer, run.ppl_lengths, num_windows=cfg.ppl_windows,
                                   data_path=cfg.ppl_data, cp_group=cp_group, cp_impl=cfg.cp_impl,
                                   progress=progress and _is_main())
    summary = aggregate(records, cfg.threshold) if records else {
        "threshold": cfg.threshold, "lengths": [], "tasks": {}, "average_by_length": {}, "average": None,
        "effective_length": 0, "grids": {}}
    stats = dict(engine.stats)
    if stats["seconds"] > 0:
        stats["tokens_per_second"] = (stats["prompt_tokens"] + stats["new_tokens"]) / stats["seconds"]
    meta = dict(meta or {}, seed=cfg.seed, samples=cfg.samples, style=cfg.style,
                wall_seconds=round(time.time() - t0, 1), generation=stats)
    comparability = assess(records, run.options, tokenizer=tokenizer, model_dir=meta.get("model"),
                           ruler_data=cfg.ruler_data is not None) if records else None
    files: list[str] = []
    if cfg.out is not None and _is_main():
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        notes = list(warnings_) + (ppl or {}).get("notes", [])  # and ppl windows cut across documents
        files = write_outputs(out, meta, summary, records, ppl, skipped, notes,
                              max_position=getattr(getattr(model, "config", None), "max_position_embeddings", None),
                              comparability=comparability, samples=all_samples)
    return {"summary": summary, "records": records, "ppl": ppl, "skipped": skipped, "files": files, "meta": meta,
            "comparability": comparability}


def write_outputs(out: Path, meta: dict, summary: dict, records, ppl, skipped, warnings_,
                  max_position: Optional[int] = None, comparability: Optional[dict] = None,
                  samples: Sequence[Sample] = ()) -> list[str]:
    """results.json, report.md, figures and, given the samples, RULER's pred files (out/ruler/)."""
    figures = []
    for name, grid in summary.get("grids", {}).items():
        figures.append(str(plots.needle_heatmap(grid, out / f"heatmap_{name}.png", title=f"{name}: score by depth x length")))
    if summary.get("tasks"):
        figures.append(str(plots.score_curves(summary, out / "scores_vs_length.png", max_position)))
    if ppl:
        figures.append(str(plots.ppl_curve(ppl, out / "ppl_vs_length.png", max_position)))
    write_results(out / "results.json", meta, summary, records, ppl, skipped, warnings_, comparability)
    write_markdown(out / "report.md", render_markdown(meta, summary, ppl, skipped, warnings_, figures, comparability))
    pred_dirs = sorted({str(Path(f).parent) + "/" for f in write_predictions(out / "ruler", samples, records)})
    return [str(out / "results.json"), str(out / "report.md")] + figures + pred_dirs
