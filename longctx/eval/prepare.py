"""What an evaluation runs, known before any weight is read: its samples, its cells and, with
a cell store, the finished cells it reuses (`prepare` -> `Plan`); and one evaluation under way
(`Evaluation`: the plan with the model that runs it). api.py runs it; outputs.py writes it.

Samples are generated for every (task, length[, depth]) cell *before* the model runs: a cell
below its task's minimum length is skipped with one notice (in "skipped"), and when no cell is
left the error names lengths that fit, in seconds, not after an hour of decoding.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch.distributed as dist

from longctx.base.errors import UserError
from longctx.data.tokenizer import prepends_bos
from longctx.eval.cells import PPL, CellStore, ppl_cells, task_cells
from longctx.eval.chat import ChatChoice, stop_ids, tokenizer_dir, with_chat_template
from longctx.eval.config import EvalConfig, EvalSelection, select
from longctx.eval.ruler_format import read_ruler_data
from longctx.eval.state import CellState, EvalContext, PplCellState, TaskCellState, is_complete, samples_done
from longctx.eval.tasks import BelowMinimum, Sample, TaskOptions, build_samples, get_task, no_fit_error, skip_notice
from longctx.runtime.launch_env import read_env
from longctx.storage import atomic


def is_main() -> bool:
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
        attach_store(plan, cfg.out, identity, model_path, overwrite=overwrite, remove=remove, notify=notify)
    return plan


def attach_store(plan: Plan, out: str, identity: dict, model_path: Optional[str], *, overwrite: bool = False,
                 remove: bool = True, notify: Callable[[str], None] = atomic.note) -> Plan:
    """The plan with its cell store in `out` and the stored cells it reuses (prepare's last step,
    apart for the endpoint backend, which checks the prompts against the server in between)."""
    plan.store = CellStore(out, identity, model_path)
    by_rel = {c.rel: c for c in plan.cells}
    plan.done = {rel: (PplCellState if by_rel[rel].name == PPL else TaskCellState).from_file(doc)
                 for rel, doc in plan.store.check(plan.cells, overwrite=overwrite, remove=remove,
                                                  notify=notify).items()}
    return plan



@dataclass
class Evaluation:
    """One evaluation under way: what its steps share."""

    model: object
    tokenizer: object
    cfg: EvalConfig
    plan: Plan
    context: EvalContext
    predictor: Optional[Callable[[Sample], str]]
    stop: object
    main: bool = field(default_factory=is_main)  # rank 0: the rank that writes
    backend: object = None  # eval/endpoint/backend.EndpointBackend: a served model instead of `model`
