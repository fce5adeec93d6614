"""In-process evaluation: what `longctx eval` calls.

    cfg = EvalConfig(tasks=["niah_single_1", "passkey"], lengths=["256", "512"], samples=20,
                     style="compact", out="run/eval")
    result = evaluate(model, tokenizer, cfg)          # an EvalResult
    result.summary["tasks"]["passkey"]["scores"]["512"]   # or result["summary"][...], as before

Samples are generated for every (task, length[, depth]) cell *before* the model runs: a cell
below its task's minimum length is skipped with one notice (in "skipped"), and when no cell is
left the error names lengths that fit, in seconds, not after an hour of decoding.

With `identity` (cells.run_identity of the model and tokenizer) and cfg.out, every finished
(task, length) cell is in cfg.out/cells/ and the same evaluation rerun continues from them;
`stop` (a PreemptionFlag) ends it after the batch in flight, with the finished cells and
samples written. results.json, report.md, the figures and RULER's files are built from all
cells once the last is done, the same bytes however many runs it took (timing.json has the
seconds).
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import torch.distributed as dist

from longctx.base.errors import UserError
from longctx.data.tokenizer import prepends_bos
from longctx.eval import plots
from longctx.eval.cells import MARKER, PPL, CellStore, acquire, ppl_cells, release_lock, task_cells
from longctx.eval.chat import ChatChoice, stop_ids, tokenizer_dir, with_chat_template
from longctx.eval.comparability import assess
from longctx.eval.config import EvalConfig, EvalSelection, select
from longctx.eval.ppl import perplexity_vs_length
from longctx.eval.report import aggregate, render_markdown, write_markdown, write_results
from longctx.eval.ruler_format import read_ruler_data, write_predictions
from longctx.eval.runner import Engine, dp_layout, run_cell
from longctx.eval.state import (
    CellState,
    EvalContext,
    EvalResult,
    PplCellState,
    TaskCellState,
    is_complete,
    samples_done,
)
from longctx.eval.tasks import BelowMinimum, Sample, TaskOptions, build_samples, get_task, no_fit_error, skip_notice
from longctx.reporting.progress import Progress
from longctx.runtime.launch_env import read_env
from longctx.storage import atomic

TIMING = "timing.json"  # wall and generation seconds: apart from results.json, which two runs write alike


def _is_main() -> bool:
    """Rank 0 (from the launcher's environment before the process group exists)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return read_env().rank == 0


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


@dataclass
class Plan:
    """What an evaluation runs, known before any weight is read: its samples, its cells and,
    with a store, the finished (or partial) cells it reuses."""

    run: EvalSelection
    samples: list
    skipped: list
    cells: list  # cells.Cell: the task cells by length, then perplexity's
    store: Optional[CellStore] = None
    done: dict[str, CellState] = field(default_factory=dict)  # {cell file: the cell so far}
    chat: ChatChoice = field(default_factory=lambda: ChatChoice(None))  # the chat template chosen
    stop_ids: list = field(default_factory=list)  # every token id that ends a generation

    def signature(self) -> str:
        """The same on every rank that sees the same cells (ranks compare it)."""
        seen = sorted((rel, state.key, state.complete, samples_done(state)) for rel, state in self.done.items())
        return json.dumps([len(self.cells), seen])

    def resume_line(self) -> Optional[str]:
        complete = [c for c in self.cells if is_complete(self.done.get(c.rel))]
        partial = [c for c in self.cells if c.rel in self.done and not self.done[c.rel].complete]
        if not complete and not partial:
            return None
        line = f"resuming: {len(complete)} of {len(self.cells)} cells already done in {self.store.out}"
        if partial:
            line += " (and " + ", ".join(f"{samples_done(self.done[c.rel])} of {len(c.samples)} samples of {c.label}"
                                         for c in partial) + ")"
        return line


def prepare(cfg: EvalConfig, tokenizer, *, identity: Optional[dict] = None, model_path: Optional[str] = None,
            overwrite: bool = False, remove: bool = True, notify: Callable[[str], None] = atomic.note) -> Plan:
    """The samples and cells of `cfg`; with `identity` (cells.run_identity) and cfg.out, the
    cells already in cfg.out that this evaluation reuses (a conflict is one UserError line,
    unless `overwrite`; `remove`: this process may delete the conflicting files). The chat
    template (eval/chat.py: unset or "auto" is the tokenizer's own) and the stop ids (the
    tokenizer's, and model_path's config.json and generation_config.json) are settled here."""
    chat, cfg = with_chat_template(cfg, tokenizer)
    stops = stop_ids(Path(model_path) if model_path else None, tokenizer_dir(getattr(tokenizer, "source", None)),
                     tokenizer)
    run = select(cfg)
    # a tokenizer whose own config adds no BOS (SmolLM2) gets none here either
    run = dataclasses.replace(run, options=dataclasses.replace(run.options,
                                                               add_bos=run.options.add_bos and prepends_bos(tokenizer)))
    if cfg.ruler_data is not None:  # RULER's prepared prompts instead of ours, at the data's lengths
        samples, skipped = read_ruler_data(cfg.ruler_data, tokenizer, run.options,
                                           lengths=run.lengths if cfg.lengths is not None else None, tasks=cfg.tasks)
        run = dataclasses.replace(run, lengths=sorted({s.target_length for s in samples}) or run.lengths)
    else:
        samples, skipped = generate_all(run.tasks, run.lengths if run.tasks else [], cfg.samples, tokenizer,
                                        seed=cfg.seed, options=run.options, depths=run.grids,
                                        require_samples=bool(run.tasks) and not run.ppl_lengths)
    if run.tasks and not samples and not run.ppl_lengths:
        raise UserError("eval.tasks: nothing to run (" + "; ".join(skipped) + ")")
    eos_only = stops == ([tokenizer.eos_id] if getattr(tokenizer, "eos_id", None) is not None else [])
    cells = (task_cells(samples, run.options.add_bos, () if eos_only else stops, cfg.mode)
             + ppl_cells(run.ppl_lengths, cfg.ppl_windows, cfg.ppl_data))
    plan = Plan(run, samples, skipped, cells, chat=chat, stop_ids=stops)
    if identity is not None and cfg.out is not None:
        plan.store = CellStore(cfg.out, identity, model_path)
        by_rel = {c.rel: c for c in cells}
        plan.done = {rel: (PplCellState if by_rel[rel].name == PPL else TaskCellState).from_file(doc)
                     for rel, doc in plan.store.check(cells, overwrite=overwrite, remove=remove,
                                                      notify=notify).items()}
    return plan


@contextmanager
def out_lock(out: Optional[str]) -> Iterator[None]:
    """One eval writing `out` at a time (rank 0 holds the lock; None: nothing to hold)."""
    holder = acquire(Path(out)) if out is not None and _is_main() else None
    try:
        yield
    finally:
        if holder is not None:
            release_lock(Path(out), holder)


def evaluate(model, tokenizer, cfg: EvalConfig, *, context: EvalContext = EvalContext(),
             predictor: Optional[Callable[[Sample], str]] = None, identity: Optional[dict] = None,
             overwrite: bool = False, stop=None, plan: Optional[Plan] = None) -> EvalResult:
    """Run cfg's tasks (and perplexity) and, with cfg.out, write results.json, report.md and figures.

    context: where it runs (the CP group) and what results.json adds (see EvalContext);
    predictor replaces the model (an oracle or a baseline). identity (cells.run_identity of
    the model and tokenizer) with cfg.out: every cell is written to cfg.out/cells/ as it
    finishes and a rerun reuses the finished ones (conflicting cells: a UserError line unless
    `overwrite`). stop: a PreemptionFlag (or anything with a collective agreed()): when it
    agrees, the batch in flight finishes, the finished cells and samples are written and the
    result has `preempted` set (no results.json). plan: from prepare() (the CLI prepares it
    before loading the weights).
    """
    if plan is not None:
        return _run_plan(_Evaluation(model, tokenizer, cfg, plan, context, predictor, stop))
    with out_lock(cfg.out if identity is not None else None):
        plan = prepare(cfg, tokenizer, identity=identity, overwrite=overwrite)
        return _run_plan(_Evaluation(model, tokenizer, cfg, plan, context, predictor, stop))


@dataclass
class _Evaluation:
    """One evaluation under way: what its steps share."""

    model: object
    tokenizer: object
    cfg: EvalConfig
    plan: Plan
    context: EvalContext
    predictor: Optional[Callable[[Sample], str]]
    stop: object
    main: bool = field(default_factory=_is_main)  # rank 0: the rank that writes


def _device_type(model) -> str:
    """"cpu" or "cuda": where the model's weights are ("none" without a model)."""
    param = next(model.parameters(), None) if model is not None else None
    return param.device.type if param is not None else "none"


def _layout(engine: Engine, model, length: int, cp_impl: str) -> dict:
    """How a cell was computed (recorded in it, not part of its key)."""
    layout = {"batch_size": engine.batch_for(length), "cp": engine.cp_size, "dp": dp_layout(engine.cp_size)[0],
              "device": _device_type(model)}
    if engine.cp_size > 1:
        layout["cp_impl"] = cp_impl
    return layout


def _json_roundtrip(obj):
    """As a cell file gives it back: what results.json is built from, fresh or resumed alike."""
    return json.loads(json.dumps(obj))


def _run_plan(ev: _Evaluation) -> EvalResult:
    t0 = time.monotonic()
    plan = ev.plan
    if ev.main and plan.store is not None:
        line = plan.resume_line()
        if line:
            print(line, file=sys.stderr, flush=True)
        (plan.store.out / MARKER).unlink(missing_ok=True)
    results, stats, computed, stopping = _run_tasks(ev)
    ppl = None
    if plan.run.ppl_lengths:
        ppl, ppl_computed = _run_ppl(ev, stopping)
        computed += ppl_computed
    unfinished = [c for c in plan.cells if not is_complete(plan.done.get(c.rel))]
    if unfinished:
        return _preempted(plan, unfinished, ev.main)
    return _finish(ev, results, stats, ppl, {"wall_seconds": round(time.monotonic() - t0, 3),
                                             "cells_computed": computed, "cells_reused": len(plan.cells) - computed})


def _run_tasks(ev: _Evaluation) -> tuple[dict, list, int, bool]:
    """The task cells, each written as it finishes: ({cell file: records}, each cell's
    generation counts, how many cells were computed, whether a stop ended the run)."""
    cfg, plan, store = ev.cfg, ev.plan, ev.plan.store
    engine = Engine(ev.model, ev.tokenizer, cp_group=ev.context.cp_group, cp_impl=cfg.cp_impl,
                    batch_size=cfg.batch_size, max_batch_tokens=cfg.max_batch_tokens,
                    add_bos=plan.run.options.add_bos, stop_ids=plan.stop_ids, mode=cfg.mode)
    task_list = [c for c in plan.cells if c.name != PPL]
    bar = Progress(len(plan.samples), "eval", "sample", enabled=not cfg.no_progress and ev.main and bool(plan.samples),
                   initial=sum(samples_done(plan.done.get(c.rel)) for c in task_list))
    results, stats, computed, stopping = {}, [], 0, False
    for cell in task_list:
        prior = plan.done.get(cell.rel) or TaskCellState()
        if not (prior.complete or stopping):
            have = {r["index"] for r in prior.records}
            ran = run_cell(engine, [s for s in cell.samples if s.index not in have], stop=ev.stop, bar=bar,
                           predictor=ev.predictor)
            records = sorted(prior.records + _json_roundtrip(ran.records), key=lambda r: r["index"])
            state = TaskCellState(records=records, stats=_add_stats(prior.stats, ran.stats),
                                  seconds=prior.seconds + ran.stats["seconds"], complete=ran.finished,
                                  computed_with=prior.computed_with)
            computed += 1
            if ev.main and store is not None:
                store.write(cell, {"records": state.records}, complete=state.complete, stats=state.stats,
                            seconds=state.seconds, layout=_layout(engine, ev.model, cell.length, cfg.cp_impl),
                            computed_with=prior.computed_with)
            plan.done[cell.rel] = prior = state
            stopping = ran.stop
        results[cell.rel] = prior.records
        stats.append(prior.stats)
    if not stopping:
        bar.update(bar.total - bar.n)
    bar.close()
    return results, stats, computed, stopping


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


def _add_stats(a: dict, b: dict) -> dict:
    return {"prompt_tokens": a.get("prompt_tokens", 0) + b["prompt_tokens"],
            "new_tokens": a.get("new_tokens", 0) + b["new_tokens"],
            "peak_cache_bytes": max(a.get("peak_cache_bytes", 0), b["peak_cache_bytes"])}


def _run_ppl(ev: _Evaluation, stopping: bool) -> tuple[dict, int]:
    """Perplexity, one cell per length (each written as it finishes); and how many were computed."""
    cfg, plan, cp_group = ev.cfg, ev.plan, ev.context.cp_group
    rows, notes, source, computed = [], [], None, 0
    cells = [c for c in plan.cells if c.name == PPL]
    reused = sum(1 for c in cells if is_complete(plan.done.get(c.rel)))
    bar = Progress(len(cells) * cfg.ppl_windows, "ppl", "window", enabled=not cfg.no_progress and ev.main,
                   initial=reused * cfg.ppl_windows)
    for cell in cells:
        state = plan.done.get(cell.rel)
        if not is_complete(state):
            if stopping:
                continue
            t = time.monotonic()
            out = perplexity_vs_length(ev.model, ev.tokenizer, [cell.length], num_windows=cfg.ppl_windows,
                                       data_path=cfg.ppl_data, cp_group=cp_group, cp_impl=cfg.cp_impl)
            bar.update(cfg.ppl_windows)
            fresh = _json_roundtrip({"row": out["rows"][0], "notes": out["notes"], "source": out["source"]})
            state = PplCellState(**fresh, seconds=time.monotonic() - t)
            if _is_main() and plan.store is not None:
                plan.store.write(cell, fresh, complete=True, stats={}, seconds=state.seconds,
                                 layout={"cp": dist.get_world_size(cp_group) if cp_group is not None else 1,
                                         "device": _device_type(ev.model)})
            plan.done[cell.rel] = state
            computed += 1
            stopping = ev.stop is not None and ev.stop.agreed()
        rows.append(state.row)
        notes += state.notes
        source = state.source
    bar.close()
    return {"source": source, "num_windows": cfg.ppl_windows, "rows": rows, "notes": notes}, computed


def _preempted(plan: Plan, unfinished: list, main: bool) -> EvalResult:
    """The result of a stopped evaluation: what is done, what is left (OUT/PREEMPTED says so too)."""
    done = len(plan.cells) - len(unfinished)
    partial = [f"{samples_done(plan.done[c.rel])} of {len(c.samples)} samples of {c.label}"
               for c in unfinished if samples_done(plan.done.get(c.rel))]
    info = {"cells_done": done, "cells": len(plan.cells), "partial": partial,
            "out": str(plan.store.out) if plan.store is not None else None}
    if main and plan.store is not None:
        atomic.write_result(plan.store.out / MARKER, f"{done} of {len(plan.cells)} cells\n")
    return EvalResult(summary=None, records=[], ppl=None, skipped=plan.skipped, files=[], meta={},
                      comparability=None, preempted=info, timing=None)


def _finish(ev: _Evaluation, results: dict, stats: list, ppl: Optional[dict], timing: dict) -> EvalResult:
    """results.json, report.md, figures and RULER's files from every cell; timing.json apart
    (results.json holds nothing that differs between two runs of the same evaluation)."""
    cfg, plan, tokenizer = ev.cfg, ev.plan, ev.tokenizer
    records = sorted((r for c in plan.cells if c.name != PPL for r in results[c.rel]),
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
        files = write_outputs(out, meta, summary, records, ppl, plan.skipped, notes,
                              max_position=getattr(getattr(ev.model, "config", None), "max_position_embeddings", None),
                              comparability=comparability, samples=plan.samples,
                              bos_tokens=int(plan.run.options.add_bos and prepends_bos(tokenizer)))
        atomic.write_result(out / TIMING, json.dumps(timing, indent=1) + "\n")
    return EvalResult(summary=summary, records=records, ppl=ppl, skipped=plan.skipped, files=files, meta=meta,
                      comparability=comparability, preempted=None, timing=timing)


def write_outputs(out: Path, meta: dict, summary: dict, records, ppl, skipped, warnings_,
                  max_position: Optional[int] = None, comparability: Optional[dict] = None,
                  samples: Sequence[Sample] = (), bos_tokens: int = 0) -> list[str]:
    """results.json, report.md, figures and, given the samples, RULER's pred files (out/ruler/)."""
    figures = []
    for name, grid in summary.get("grids", {}).items():
        figures.append(str(plots.needle_heatmap(grid, out / f"heatmap_{name}.png",
                                                title=f"{name}: score by depth x length")))
    if summary.get("tasks"):
        figures.append(str(plots.score_curves(summary, out / "scores_vs_length.png", max_position)))
    if ppl:
        figures.append(str(plots.ppl_curve(ppl, out / "ppl_vs_length.png", max_position)))
    write_results(out / "results.json", meta, summary, records, ppl, skipped, warnings_, comparability)
    write_markdown(out / "report.md", render_markdown(meta, summary, ppl, skipped, warnings_, figures, comparability))
    pred_dirs = sorted({str(Path(f).parent) + "/" for f in write_predictions(out / "ruler", samples, records,
                                                                            bos_tokens)})
    return [str(out / "results.json"), str(out / "report.md")] + figures + pred_dirs
