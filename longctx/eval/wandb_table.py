"""An evaluation's results as a W&B table (--wandb-project): one row per task and length (the
score), the average per length, perplexity per length, each lm-eval task's metrics (length 0:
the task's own) and MRCR's score per token bin (length: the bin's upper end); the run's config is
the eval config."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from longctx.eval.mrcr import bin_end
from longctx.eval.state import EvalResult
from longctx.reporting.wandb_log import log_table, open_run

COLUMNS = ["task", "length", "metric", "value"]


def result_rows(result: EvalResult) -> list[list]:
    summary, rows = result.summary or {}, []
    for name, task in (summary.get("tasks") or {}).items():
        rows += [[name, int(length), "score", float(score)] for length, score in task["scores"].items()]
    averages = summary.get("average_by_length") or {}
    rows += [["average", int(length), "score", float(v)] for length, v in averages.items()]
    ppl = (result.ppl or {}).get("rows", [])
    rows += [["ppl", int(r["length"]), "perplexity", float(r["ppl"])] for r in ppl]
    for name, task in ((result.lm_eval or {}).get("tasks") or {}).items():
        rows += [[name, 0, key, float(v)] for key, v in task["metrics"].items()]
    for name, cell in (((result.mrcr or {}).get("summary") or {}).get("by_bin") or {}).items():
        rows.append(["mrcr", bin_end(name), "score", float(cell["score"])])
    return rows


def log_results(cfg, result: EvalResult) -> None:
    """A W&B run in cfg.out/wandb holding the results table (key eval/results) and the effective length."""
    run = open_run(Path(cfg.out), cfg.wandb_project, cfg.wandb_entity, cfg.wandb_name, cfg.wandb_mode,
                   dataclasses.asdict(cfg), keep_id=False)
    try:
        log_table(run, "eval/results", COLUMNS, result_rows(result))
        effective = (result.summary or {}).get("effective_length")
        if effective is not None:
            run.summary["eval/effective_length"] = effective
    finally:
        run.finish()
