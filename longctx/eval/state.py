"""An evaluation's typed state: each (task, length) cell as far as it ran, what the eval
command adds to a run (EvalContext), and what evaluate returns (EvalResult). Plain data, no
torch: eval/end_summary.py and eval/wandb_table.py read results with this module alone."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union


@dataclass
class TaskCellState:
    """A task cell as far as it ran: its records (one per sample, by index), its generation
    counts and seconds; `complete` once every sample ran. From a cell file, or computed here."""

    records: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)  # prompt_tokens, new_tokens, peak_cache_bytes
    seconds: float = 0.0
    complete: bool = False
    key: Optional[str] = None  # the cell file's key (None: computed in this process)
    computed_with: list = field(default_factory=list)  # the layouts of the runs that computed it

    @classmethod
    def from_file(cls, doc: dict) -> TaskCellState:
        return cls(records=doc["records"], stats=doc["stats"], seconds=doc["seconds"],
                   complete=bool(doc.get("complete")), key=doc.get("key"), computed_with=doc.get("computed_with", []))


@dataclass
class PplCellState:
    """A perplexity cell (always complete: it is written only when its windows are done)."""

    row: dict
    notes: list
    source: object
    seconds: float
    key: Optional[str] = None
    computed_with: list = field(default_factory=list)
    complete: bool = True

    @classmethod
    def from_file(cls, doc: dict) -> PplCellState:
        return cls(row=doc["row"], notes=doc["notes"], source=doc["source"], seconds=doc["seconds"],
                   key=doc.get("key"), computed_with=doc.get("computed_with", []), complete=bool(doc.get("complete")))


CellState = Union[TaskCellState, PplCellState]


def is_complete(state: Optional[CellState]) -> bool:
    return state is not None and state.complete


def samples_done(state: Optional[CellState]) -> int:
    return len(state.records) if isinstance(state, TaskCellState) else 0



@dataclass(frozen=True)
class EvalContext:
    """What the eval command knows beyond the config: the context-parallel group of the prefill
    (None: one process), extra entries of results.json's meta, and warnings for the report."""

    cp_group: object = None
    meta: dict = field(default_factory=dict)
    warnings: Sequence[str] = ()


@dataclass
class EvalResult:
    """What evaluate returns. Its fields read as attributes, or as keys (`res["summary"]`, as
    docs/eval.md shows). summary, ppl, meta, comparability and timing are None (or empty) when a
    stop ended the evaluation: then `preempted` says what is done and what is left."""

    summary: Optional[dict]  # report.aggregate: scores by task and length, averages, effective length
    records: list  # one per sample: prompt-free, sorted by (task, length, index)
    ppl: Optional[dict]  # {"source", "num_windows", "rows", "notes"}, None without perplexity
    skipped: list  # one line per task or cell left out, and why
    files: list  # what was written under cfg.out (rank 0)
    meta: dict  # results.json's meta
    comparability: Optional[dict]  # {"ruler_comparable", "departures"}
    preempted: Optional[dict]  # {"cells_done", "cells", "partial", "out"} when a stop ended it
    timing: Optional[dict]  # timing.json's seconds and counts
    lm_eval: Optional[dict] = None  # results.json's "lm_eval" section (eval/harness/run.py), with --lm-eval
    mrcr: Optional[dict] = None  # results.json's "mrcr" section (eval/mrcr_run.py), with --mrcr

    def __getitem__(self, key: str):
        if key not in _RESULT_FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default=None):
        return getattr(self, key) if key in _RESULT_FIELDS else default

    def __contains__(self, key: object) -> bool:
        return key in _RESULT_FIELDS

    def keys(self) -> tuple[str, ...]:
        return _RESULT_FIELDS


_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(EvalResult))
