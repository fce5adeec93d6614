"""`longctx eval --compare BASE`: the extended model against its base, sample by sample, and the
short-context regression gate.

    base = load_base("runs/base/eval/results.json")      # or its directory
    report = compare(base, results, threshold=1.0, tasks=None)
    report["regressed"]                                   # the gated tasks that regressed

Every task both results hold is paired on its samples (eval/paired.py: the mean of the per-sample
differences, its standard error and a 95% paired-bootstrap interval): each lm-eval task on its
first metric's per-sample scores (0-100 when they lie in [0, 1]), an lm-eval group on its subtasks
as strata, each RULER task on its (length, index) samples with the lengths as strata.

The gate judges the lm-eval tasks (the short suite; `gate_tasks` narrows or names groups): a task
regresses when its difference (extended - base) is below -threshold points and its whole 95%
interval lies below 0, so a drop the samples cannot tell from noise passes. A regression ends the
command with REGRESSED_EXIT_CODE.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from longctx.base.errors import UserError
from longctx.eval.paired import fmt_diff, paired_difference

REGRESSED_EXIT_CODE = 4  # a gated short-context task regressed beyond the threshold (docs/eval.md)


def base_file(path: str) -> Path:
    p = Path(path).expanduser()
    return p / "results.json" if p.is_dir() else p


def load_base(path: str) -> dict:
    """The base model's results.json (a file or the eval directory holding it); UserError otherwise."""
    p = base_file(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"eval.compare: {p} is not a readable results.json ({type(e).__name__})") from None
    if not isinstance(data, dict) or not ("lm_eval" in data or "samples" in data):
        raise UserError(f"eval.compare: {p} holds no per-sample scores (a results.json of `longctx eval`)")
    return data


def _lm_eval_scores(results: dict) -> tuple[dict, dict]:
    """({task: {doc_id: score}}, {group: [subtasks]}) of a results.json's lm-eval section."""
    section = results.get("lm_eval") or {}
    scores = {t: e["scores"] for t, e in (section.get("tasks") or {}).items() if e.get("scores")}
    return scores, section.get("groups") or {}


def _ruler_scores(results: dict) -> dict:
    """{task: {(length, index): score}} of a results.json's samples."""
    out: dict = {}
    for r in results.get("samples") or []:
        out.setdefault(r["task"], {})[(r["target_length"], r["index"])] = r["score"]
    return out


def compare(base: dict, new: dict, *, threshold: float, tasks: Optional[Sequence[str]] = None) -> dict:
    """{"threshold", "rows": one per paired task, "regressed": the gated tasks that regressed}."""
    a_lm, groups = _lm_eval_scores(base)
    b_lm, new_groups = _lm_eval_scores(new)
    groups = {**groups, **new_groups}
    gated = list(tasks) if tasks else sorted(set(a_lm) & set(b_lm))
    for name in gated:
        members = groups.get(name, [name])
        if not all(m in a_lm and m in b_lm for m in members):
            raise UserError(f"eval.gate_tasks: {name} has no per-sample scores in both the base and this evaluation "
                            f"(both: {', '.join(sorted(set(a_lm) & set(b_lm))) or 'none'})")
    rows = []
    for name in gated:
        members = groups.get(name, [name])
        a = {(m, doc): v for m in members for doc, v in a_lm[m].items()}
        b = {(m, doc): v for m in members for doc, v in b_lm[m].items()}
        d = paired_difference(a, b, stratum_of=lambda k: k[0])
        rows.append(dict(d, task=name, kind="lm_eval", gated=True,
                         regressed=bool(d["n"] and d["mean"] < -threshold and d["hi"] < 0)))
    a_ruler, b_ruler = _ruler_scores(base), _ruler_scores(new)
    for name in sorted(set(a_ruler) & set(b_ruler)):
        d = paired_difference(a_ruler[name], b_ruler[name], stratum_of=lambda k: k[0])
        rows.append(dict(d, task=name, kind="ruler", gated=False, regressed=False))
    return {"threshold": threshold, "rows": rows, "regressed": [r["task"] for r in rows if r["regressed"]]}


def render(report: dict, base_path: str) -> str:
    """report.md's section: each paired task's base and new means and the difference with its interval."""
    lines = ["## Against the base model", "", f"base: {base_path}; a gated task regresses when extended - base < "
             f"-{report['threshold']:g} points with its 95% paired interval below 0", "",
             "| task | samples | base | extended | difference [95% CI] | gate |", "|---|---:|---:|---:|---|---|"]
    for r in report["rows"]:
        gate = ("**regressed**" if r["regressed"] else "pass") if r["gated"] else "-"
        lines.append(f"| {r['task']} | {r['n']} | {r['a']:.1f} | {r['b']:.1f} | {fmt_diff(r)} | {gate} |")
    return "\n".join(lines) + "\n"


def lines(report: dict) -> list[str]:
    """The command's summary lines (one per gated task, then the verdict)."""
    out = [f"gate {r['task']}: {r['a']:.1f} -> {r['b']:.1f}, {fmt_diff(r)} ({'REGRESSED' if r['regressed'] else 'ok'})"
           for r in report["rows"] if r["gated"]]
    if report["regressed"]:
        out.append(f"regression beyond {report['threshold']:g} points in {', '.join(report['regressed'])}; exit code "
                   f"{REGRESSED_EXIT_CODE}")
    return out


def add_to_outputs(out: Path, report: dict, base_path: str) -> None:
    from longctx.storage import atomic

    results = json.loads((out / "results.json").read_text())
    results["compare"] = dict(report, base=str(base_file(base_path)))
    atomic.write_json(out / "results.json", results)
    text = (out / "report.md").read_text()
    marker = "\n## Against the base model"
    if marker in text:
        text = text[:text.index(marker)]
    atomic.write_text(out / "report.md", text.rstrip("\n") + "\n\n" + render(report, str(base_file(base_path))))
