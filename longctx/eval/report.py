"""Aggregate per-sample records into tables; write results.json and report.md (each whole or
not at all: a temporary sibling renamed; a failed write is one line naming the file)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

from longctx.eval.scoring import DEFAULT_THRESHOLD, effective_length, mean, weighted_average
from longctx.storage import atomic


def aggregate(records: Sequence[dict], threshold: float = DEFAULT_THRESHOLD) -> dict:
    """Scores per task x length (mean over samples), per-length averages over tasks (and which
    tasks each covers), RULER's weighted averages over lengths, effective lengths, and depth x
    length grids for samples generated at controlled depths."""
    tasks: dict = {}
    grids: dict = {}
    for r in records:
        t = tasks.setdefault(r["task"], {"metric": r["metric"], "_by_len": {}})
        t["_by_len"].setdefault(r["target_length"], []).append(r["score"])
        if r.get("depth") is not None:
            g = grids.setdefault(r["task"], {})
            g.setdefault((r["depth"], r["target_length"]), []).append(r["score"])
    lengths = sorted({r["target_length"] for r in records})
    out_tasks = {}
    for name, t in tasks.items():
        scores = {L: mean(v) for L, v in sorted(t["_by_len"].items())}
        out_tasks[name] = {
            "metric": t["metric"],
            "scores": {str(L): s for L, s in scores.items()},
            "stderr": {str(L): standard_error(v) for L, v in sorted(t["_by_len"].items())},
            "samples": {str(L): len(v) for L, v in sorted(t["_by_len"].items())},
            "average": mean(scores.values()),
            "effective_length": effective_length(scores, threshold),
        }
    avg_by_len, avg_se_by_len, avg_tasks = {}, {}, {}
    for L in lengths:
        avg_tasks[L] = [name for name, t in out_tasks.items() if str(L) in t["scores"]]
        vals = [out_tasks[name]["scores"][str(L)] for name in avg_tasks[L]]
        avg_by_len[L] = mean(vals)
        # the tasks' samples are independent: the average's variance is the mean of theirs / k
        ses = [t["stderr"][str(L)] for t in out_tasks.values() if str(L) in t["stderr"]]
        avg_se_by_len[L] = math.sqrt(sum(se * se for se in ses)) / len(ses)
    out_grids = {}
    for name, cells in grids.items():
        depths = sorted({d for d, _ in cells})
        lens = sorted({L for _, L in cells})
        out_grids[name] = {
            "depths": depths, "lengths": lens,
            "scores": [[mean(cells[(d, L)]) if (d, L) in cells else None for L in lens] for d in depths],
        }
    return {
        "threshold": threshold,
        "lengths": lengths,
        "tasks": out_tasks,
        "average_by_length": {str(L): v for L, v in avg_by_len.items()},
        "average_stderr_by_length": {str(L): v for L, v in avg_se_by_len.items()},
        "average_tasks_by_length": {str(L): v for L, v in avg_tasks.items()},
        "average": mean(avg_by_len.values()) if avg_by_len else float("nan"),
        "wavg_inc": weighted_average(avg_by_len, "inc"),
        "wavg_dec": weighted_average(avg_by_len, "dec"),
        "effective_length": effective_length(avg_by_len, threshold) if avg_by_len else 0,
        "grids": out_grids,
    }


def standard_error(scores: Sequence[float]) -> float:
    """Standard error of the mean of per-sample scores (sample standard deviation / sqrt(n));
    0 for a single sample: the sampling noise of a score on this many test samples."""
    n = len(scores)
    if n < 2:
        return 0.0
    m = sum(scores) / n
    return math.sqrt(sum((x - m) ** 2 for x in scores) / (n - 1) / n)


def _clean(x):
    """JSON-safe: NaN -> None."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_results(path: Path, meta: dict, summary: dict, records: Sequence[dict], ppl: Optional[dict],
                  skipped: Sequence[str], warnings_: Sequence[str], comparability: Optional[dict] = None) -> None:
    """results.json; `comparability` ({"ruler_comparable", "departures"}) goes at the top level."""
    doc = {"meta": meta, **(comparability or {}), "summary": summary, "ppl": ppl, "skipped": list(skipped),
           "warnings": list(warnings_), "samples": list(records)}
    atomic.write_result(path, json.dumps(_clean(doc), indent=1))


def write_markdown(path: Path, text: str) -> Path:
    """report.md (or any markdown result)."""
    return atomic.write_result(path, text)


def _fmt(x, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}"


def average_coverage(summary: dict) -> str:
    """Which tasks the per-length average covers, e.g. "11 tasks: niah_single_1, ..."."""
    by_len = summary.get("average_tasks_by_length", {})
    distinct = {tuple(v) for v in by_len.values()}
    if len(distinct) == 1:
        tasks = list(distinct.pop())
        return f"{len(tasks)} tasks: {', '.join(tasks)}"
    return "; ".join(f"at {L}: {len(v)} tasks ({', '.join(v)})" for L, v in by_len.items())


def _comparability_lines(comparability: Optional[dict]) -> list[str]:
    if not comparability:
        return []
    if comparability["ruler_comparable"]:
        return ["RULER-comparable: **yes** (RULER's 13 tasks, data and sample count).", ""]
    return (["## Not comparable with published RULER numbers", ""]
            + [f"- {d}" for d in comparability["departures"]] + [""])


def render_markdown(meta: dict, summary: dict, ppl: Optional[dict], skipped: Sequence[str],
                    warnings_: Sequence[str], figures: Sequence[str] = (),
                    comparability: Optional[dict] = None) -> str:
    lines = ["# Long-context evaluation", ""]
    for key in ("model", "endpoint", "endpoint_mode", "tokenizer", "suite", "style", "samples", "seed", "cp", "dtype",
                "model_overrides", "wall_seconds"):
        if meta.get(key) not in (None, {}):
            lines.append(f"- **{key}**: {meta[key]}")
    if meta.get("adapter"):  # an adapter run: which form of it was evaluated (checkpoint/adapter_source.py)
        lines.append(f"- **adapter**: {meta['adapter']['description']}")
    lines.append("")
    tasks = summary.get("tasks", {})
    lengths = summary.get("lengths", [])
    if tasks:
        thr = summary["threshold"]
        lines += ["## Scores (0-100, task x length)", "",
                  "| task | metric | " + " | ".join(str(L) for L in lengths) + " | avg | effective length |",
                  "|---|---|" + "---:|" * (len(lengths) + 2)]
        for name, t in tasks.items():
            row = [_fmt(t["scores"].get(str(L))) for L in lengths]
            lines.append(f"| {name} | {t['metric']} | " + " | ".join(row)
                         + f" | {_fmt(t['average'])} | {t['effective_length'] or '< ' + str(lengths[0])} |")
        avg = [_fmt(summary["average_by_length"].get(str(L))) for L in lengths]
        eff = summary["effective_length"]
        lines.append("| **average** | | " + " | ".join(avg) + f" | {_fmt(summary['average'])} | "
                     f"{eff or '< ' + str(lengths[0])} |")
        lines += ["", f"Average over {average_coverage(summary)}. RULER's weighted averages over the lengths: "
                      f"wAvg (inc) {_fmt(summary.get('wavg_inc'))}, wAvg (dec) {_fmt(summary.get('wavg_dec'))}.", "",
                  f"Effective length: the longest length whose average score (and that of every shorter "
                  f"length) is above {thr}: **{eff or 'none'}**.", ""]
        lines += _comparability_lines(comparability)
    for name, g in summary.get("grids", {}).items():
        lines += [f"## Needle grid: {name} (rows: depth, columns: length)", "",
                  "| depth | " + " | ".join(str(L) for L in g["lengths"]) + " |",
                  "|---:|" + "---:|" * len(g["lengths"])]
        for d, row in zip(g["depths"], g["scores"]):
            lines.append(f"| {d:.0%} | " + " | ".join(_fmt(x, 0) for x in row) + " |")
        lines.append("")
    if ppl:
        lines += ["## Perplexity vs context length", "",
                  f"Source: {ppl['source']}; {ppl['num_windows']} windows per length.", "",
                  "| length | ppl | nll | tokens | windows |", "|---:|---:|---:|---:|---|"]
        for r in ppl["rows"]:
            lines.append(f"| {r['length']} | {_fmt(r['ppl'], 3)} | {_fmt(r['nll'], 4)} | {r['tokens']} | "
                         f"{r['windows']} |")
        lines.append("")
    if figures:
        lines += ["## Figures", ""] + [f"![{Path(f).stem}]({Path(f).name})" for f in figures] + [""]
    if skipped:
        lines += ["## Skipped", ""] + [f"- {s}" for s in skipped] + [""]
    if warnings_:
        lines += ["## Warnings", ""] + [f"- {w}" for w in warnings_] + [""]
    return "\n".join(lines)
