"""What a finished (or stopped) evaluation leaves in its out directory: results.json, report.md,
the figures and RULER's prediction files, built from every cell once the last is done (the same
bytes however many runs it took; timing.json has the seconds), or PREEMPTED when a stop ended it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from longctx.data.tokenizer import prepends_bos
from longctx.eval import plots
from longctx.eval.cells import MARKER, PPL
from longctx.eval.comparability import assess
from longctx.eval.prepare import Evaluation, Plan
from longctx.eval.report import aggregate, render_markdown, write_markdown, write_results
from longctx.eval.ruler_format import write_predictions
from longctx.eval.state import EvalResult, samples_done
from longctx.eval.tasks import Sample
from longctx.storage import atomic

TIMING = "timing.json"  # wall and generation seconds: apart from results.json, which two runs write alike


@dataclass(frozen=True)
class Results:
    """What results.json and report.md say: the run's meta, the summary (eval/report.aggregate),
    every record, perplexity (or None), the skip notices, the warnings, and how comparable the
    run is to RULER's own (or None)."""

    meta: dict
    summary: dict
    records: Sequence[dict]
    ppl: Optional[dict]
    skipped: Sequence[str]
    warnings: Sequence[str]
    comparability: Optional[dict]


def write_outputs(out: Path, results: Results, *, max_position: Optional[int] = None,
                  samples: Sequence[Sample] = (), bos_tokens: int = 0) -> list[str]:
    """results.json, report.md, figures and, given the samples, RULER's pred files (out/ruler/).
    max_position: the model's, marked on the curves; bos_tokens: what RULER's `length` counts."""
    r = results
    figures = []
    for name, grid in r.summary.get("grids", {}).items():
        figures.append(str(plots.needle_heatmap(grid, out / f"heatmap_{name}.png",
                                                title=f"{name}: score by depth x length")))
    if r.summary.get("tasks"):
        figures.append(str(plots.score_curves(r.summary, out / "scores_vs_length.png", max_position)))
    if r.ppl:
        figures.append(str(plots.ppl_curve(r.ppl, out / "ppl_vs_length.png", max_position)))
    write_results(out / "results.json", r.meta, r.summary, r.records, r.ppl, r.skipped, r.warnings, r.comparability)
    write_markdown(out / "report.md", render_markdown(r.meta, r.summary, r.ppl, r.skipped, r.warnings, figures,
                                                      r.comparability))
    pred_dirs = sorted({str(Path(f).parent) + "/" for f in write_predictions(out / "ruler", samples, r.records,
                                                                            bos_tokens)})
    return [str(out / "results.json"), str(out / "report.md")] + figures + pred_dirs


def _what_ran(plan: Plan, records: Sequence[dict], ppl: Optional[dict]) -> dict:
    """results.json's tasks, lengths and samples as they ran (with ruler_data: the data's, not
    the suite's or eval.samples): samples is the count per task and length (the fewest when
    cells differ), samples_per_cell each cell's."""
    if not records:
        return {"lengths": [r["length"] for r in (ppl or {}).get("rows", [])]} if ppl else {}
    per_cell: dict = {}
    for r in records:
        cell = per_cell.setdefault(r["task"], {})
        cell[str(r["target_length"])] = cell.get(str(r["target_length"]), 0) + 1
    counts = [n for cells in per_cell.values() for n in cells.values()]
    lengths = {r["target_length"] for r in records} | {r["length"] for r in (ppl or {}).get("rows", [])}
    order = list(dict.fromkeys(c.name for c in plan.cells if c.name != PPL))
    return {"tasks": [t for t in order if t in per_cell], "lengths": sorted(lengths), "samples": min(counts),
            "samples_per_cell": per_cell}


def preempted(plan: Plan, unfinished: list, main: bool, *, marker: bool = True) -> EvalResult:
    """The result of a stopped evaluation: what is done, what is left (OUT/PREEMPTED says so too,
    unless not `marker`: a stop that requeueing would not cure)."""
    done = len(plan.cells) - len(unfinished)
    partial = [f"{samples_done(plan.done[c.rel])} of {len(c.samples)} samples of {c.label}"
               for c in unfinished if samples_done(plan.done.get(c.rel))]
    info = {"cells_done": done, "cells": len(plan.cells), "partial": partial,
            "out": str(plan.store.out) if plan.store is not None else None}
    if main and marker and plan.store is not None:
        atomic.write_result(plan.store.out / MARKER, f"{done} of {len(plan.cells)} cells\n")
    return EvalResult(summary=None, records=[], ppl=None, skipped=plan.skipped, files=[], meta={},
                      comparability=None, preempted=info, timing=None)


def finish(ev: Evaluation, by_cell: dict, stats: list, ppl: Optional[dict], timing: dict) -> EvalResult:
    """results.json, report.md, figures and RULER's files from every cell (`by_cell`: {cell file:
    records}; `stats`: each task cell's generation counts); timing.json apart
    (results.json holds nothing that differs between two runs of the same evaluation)."""
    cfg, plan, tokenizer = ev.cfg, ev.plan, ev.tokenizer
    records = sorted((r for c in plan.cells if c.name != PPL for r in by_cell[c.rel]),
                     key=lambda r: (r["task"], r["target_length"], r["index"]))
    if cfg.save_inputs:
        by_key = {(s.task, s.target_length, s.index): s.prompt for s in plan.samples}
        for r in records:
            r["prompt"] = by_key[(r["task"], r["target_length"], r["index"])]
    summary = aggregate(records, cfg.threshold) if records else {
        "threshold": cfg.threshold, "lengths": [], "tasks": {}, "average_by_length": {}, "average": None,
        "effective_length": 0, "grids": {}}
    generation = {"prompt_tokens": sum(s.get("prompt_tokens", 0) for s in stats),
                  "new_tokens": sum(s.get("new_tokens", 0) for s in stats),
                  "peak_cache_bytes": max([s.get("peak_cache_bytes", 0) for s in stats] or [0])}
    meta = dict(ev.context.meta, seed=cfg.seed, samples=cfg.samples, style=cfg.style, generation=generation,
                chat_template=plan.chat.record, stop_ids=plan.stop_ids)
    if cfg.mode != "generate":
        meta["mode"] = cfg.mode
    meta.update(_what_ran(plan, records, ppl))
    seconds = sum(state.seconds for state in plan.done.values())
    timing = dict(timing, generation_seconds=round(seconds, 3))
    if seconds > 0:
        timing["tokens_per_second"] = round((generation["prompt_tokens"] + generation["new_tokens"]) / seconds, 1)
    comparability = assess(records, plan.run.options, tokenizer=tokenizer, model_dir=meta.get("model"),
                           ruler_data=cfg.ruler_data is not None) if records else None
    files: list[str] = []
    if cfg.out is not None and ev.main:
        out = Path(cfg.out)
        with atomic.user_errors(out):
            out.mkdir(parents=True, exist_ok=True)
        notes = list(ev.context.warnings) + (ppl or {}).get("notes", [])  # and ppl windows cut across documents
        max_position = getattr(getattr(ev.model, "config", None), "max_position_embeddings", None)
        files = write_outputs(out, Results(meta, summary, records, ppl, plan.skipped, notes, comparability),
                              max_position=max_position, samples=plan.samples,
                              bos_tokens=int(plan.run.options.add_bos and prepends_bos(tokenizer)))
        atomic.write_result(out / TIMING, json.dumps(timing, indent=1) + "\n")
    return EvalResult(summary=summary, records=records, ppl=ppl, skipped=plan.skipped, files=files, meta=meta,
                      comparability=comparability, preempted=None, timing=timing)
