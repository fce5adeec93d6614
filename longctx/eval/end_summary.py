"""The lines an evaluation ends with: what was scored, the mean score, the wall time and where
the outputs are (results.json, report.md, figures, RULER's prediction files)."""
from __future__ import annotations

import math
import os
from typing import Optional

from longctx.eval.state import EvalResult
from longctx.reporting.progress import format_duration


def _scored(result: EvalResult) -> str:
    summary = result.summary
    tasks, lengths = summary.get("tasks", {}), summary.get("lengths", [])
    parts = []
    if tasks:
        average: Optional[float] = summary.get("average")
        mean = f"{average:.1f}" if average is not None and math.isfinite(average) else "-"
        parts.append(f"{len(tasks)} task{'s' if len(tasks) != 1 else ''} x {len(lengths)} "
                     f"length{'s' if len(lengths) != 1 else ''} ({', '.join(str(L) for L in lengths)}), "
                     f"{len(result.records)} samples, mean score {mean}")
    ppl = result.ppl
    if ppl:
        parts.append(f"ppl at {', '.join(str(r['length']) for r in ppl['rows'])}")
    lm_tasks = (result.lm_eval or {}).get("tasks") or {}
    if lm_tasks:
        parts.append(f"{len(lm_tasks)} lm-eval task{'s' if len(lm_tasks) != 1 else ''}")
    if result.mrcr:
        parts.append(f"MRCR {result.mrcr['summary']['all']['n']} samples")
    return "; ".join(parts) or "nothing scored"


def end_summary(result: EvalResult, wall_seconds: float) -> str:
    """e.g.
    eval done: 2 tasks x 2 lengths (512, 1024), 44 samples, mean score 12.5; ppl at 512, 1024; wall 0:27
      results: runs/x/eval/results.json, runs/x/eval/report.md
      figures: runs/x/eval/heatmap_passkey.png, runs/x/eval/scores_vs_length.png
      RULER predictions: runs/x/eval/ruler/<length>/pred/"""
    lines = [f"eval done: {_scored(result)}; wall {format_duration(wall_seconds)}"]
    files = result.files
    figures = [f for f in files if f.endswith(".png")]
    predictions = [f for f in files if f.endswith("/")]
    reports = [f for f in files if f not in figures and f not in predictions]
    lines.append(f"  results: {', '.join(reports)}" if reports else "  results: not written (no --out)")
    if figures:
        lines.append(f"  figures: {', '.join(figures)}")
    if predictions:
        root = os.path.dirname(os.path.dirname(predictions[0].rstrip("/")))  # <out>/ruler
        lines.append(f"  RULER predictions: {os.path.join(root, '<length>', 'pred')}/ "
                     f"({len(predictions)} length{'s' if len(predictions) != 1 else ''})")
    return "\n".join(lines)
