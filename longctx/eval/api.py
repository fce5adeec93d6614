"""In-process evaluation: what `longctx eval` calls.

    cfg = EvalConfig(tasks=["niah_single_1", "passkey"], lengths=["256", "512"], samples=20,
                     style="compact", out="run/eval")
    result = evaluate(model, tokenizer, cfg)          # an EvalResult
    result.summary["tasks"]["passkey"]["scores"]["512"]   # or result["summary"][...], as before

What runs (samples, cells, the finished cells reused) is settled before the model runs
(prepare.py); this module runs the cells; outputs.py writes what they found.

With `identity` (cells.run_identity of the model and tokenizer) and cfg.out, every finished
(task, length) cell is in cfg.out/cells/ and the same evaluation rerun continues from them;
`stop` (a PreemptionFlag) ends it after the batch in flight, with the finished cells and
samples written. results.json, report.md, the figures and RULER's files are built from all
cells once the last is done, the same bytes however many runs it took (timing.json has the
seconds).
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch.distributed as dist

from longctx.eval.cells import MARKER, PPL, acquire, release_lock
from longctx.eval.config import EvalConfig
from longctx.eval.outputs import finish, preempted
from longctx.eval.ppl import perplexity_vs_length
from longctx.eval.prepare import Evaluation, Plan, is_main, prepare
from longctx.eval.runner import Engine, dp_layout, run_cell
from longctx.eval.state import EvalContext, EvalResult, PplCellState, TaskCellState, is_complete, samples_done
from longctx.eval.tasks import Sample
from longctx.reporting.progress import Progress


@contextmanager
def out_lock(out: Optional[str]) -> Iterator[Callable[[], None]]:
    """One eval writing `out` at a time (rank 0 holds the lock; None: nothing to hold). Yields
    the release, for an end that leaves no `finally` to run (a stall's exit: runtime/watchdog.py)."""
    holder = [acquire(Path(out))] if out is not None and is_main() else []

    def release() -> None:
        if holder:
            release_lock(Path(out), holder.pop())

    try:
        yield release
    finally:
        release()


def evaluate(model, tokenizer, cfg: EvalConfig, *, context: EvalContext = EvalContext(),
             predictor: Optional[Callable[[Sample], str]] = None, identity: Optional[dict] = None,
             overwrite: bool = False, stop=None, plan: Optional[Plan] = None, backend=None) -> EvalResult:
    """Run cfg's tasks (and perplexity) and, with cfg.out, write results.json, report.md and figures.

    context: where it runs (the CP group) and what results.json adds (see EvalContext);
    predictor replaces the model (an oracle or a baseline). identity (cells.run_identity of
    the model and tokenizer) with cfg.out: every cell is written to cfg.out/cells/ as it
    finishes and a rerun reuses the finished ones (conflicting cells: a UserError line unless
    `overwrite`). stop: a PreemptionFlag (or anything with a collective agreed()): when it
    agrees, the batch in flight finishes, the finished cells and samples are written and the
    result has `preempted` set (no results.json). plan: from prepare() (the CLI prepares it
    before loading the weights). backend: eval/endpoint/backend.EndpointBackend, a served model
    that runs the task cells in place of `model` (None: no perplexity).
    """
    if plan is not None:
        return _run_plan(Evaluation(model, tokenizer, cfg, plan, context, predictor, stop, backend=backend))
    with out_lock(cfg.out if identity is not None else None):
        plan = prepare(cfg, tokenizer, identity=identity, overwrite=overwrite)
        return _run_plan(Evaluation(model, tokenizer, cfg, plan, context, predictor, stop, backend=backend))


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


def _run_plan(ev: Evaluation) -> EvalResult:
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
    if unfinished:  # a signal (PREEMPTED marks --out for the SLURM scripts) or a served model that failed
        failed = ev.backend is not None and ev.backend.failure is not None
        return preempted(plan, unfinished, ev.main, marker=not failed)
    return finish(ev, results, stats, ppl, {"wall_seconds": round(time.monotonic() - t0, 3),
                                             "cells_computed": computed, "cells_reused": len(plan.cells) - computed})


def _run_tasks(ev: Evaluation) -> tuple[dict, list, int, bool]:
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
            todo = [s for s in cell.samples if s.index not in have]
            if ev.backend is not None:  # a served model (eval/endpoint/)
                ran = ev.backend.run_cell(todo, stop=ev.stop, bar=bar)
            else:
                ran = run_cell(engine, todo, stop=ev.stop, bar=bar, predictor=ev.predictor)
            records = sorted(prior.records + _json_roundtrip(ran.records), key=lambda r: r["index"])
            state = TaskCellState(records=records, stats=_add_stats(prior.stats, ran.stats),
                                  seconds=prior.seconds + ran.stats["seconds"], complete=ran.finished,
                                  computed_with=prior.computed_with)
            computed += 1
            if ev.main and store is not None:
                layout = (ev.backend.layout() if ev.backend is not None
                          else _layout(engine, ev.model, cell.length, cfg.cp_impl))
                store.write(cell, {"records": state.records}, complete=state.complete, stats=state.stats,
                            seconds=state.seconds, layout=layout, computed_with=prior.computed_with)
            plan.done[cell.rel] = prior = state
            stopping = ran.stop
        results[cell.rel] = prior.records
        stats.append(prior.stats)
    if not stopping:
        bar.update(bar.total - bar.n)
    bar.close()
    return results, stats, computed, stopping


def _add_stats(a: dict, b: dict) -> dict:
    return {"prompt_tokens": a.get("prompt_tokens", 0) + b["prompt_tokens"],
            "new_tokens": a.get("new_tokens", 0) + b["new_tokens"],
            "peak_cache_bytes": max(a.get("peak_cache_bytes", 0), b["peak_cache_bytes"])}


def _run_ppl(ev: Evaluation, stopping: bool) -> tuple[dict, int]:
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
            if is_main() and plan.store is not None:
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

