"""RULER's file formats: prepared data in, predictions and summary.csv out.

RULER's pipeline (github.com/NVIDIA/RULER, scripts/) keeps one folder per length:

    <L>/data/<task>/validation.jsonl   prepare.py: index, input, outputs, length, answer_prefix, ...
    <L>/pred/<task>.jsonl              call_api.py: index, pred, input, outputs, others, truncation, length
    <L>/pred/summary.csv               evaluate.py: rows Tasks / Score / Nulls, one column per task

    samples = read_ruler_data("ruler_root/llama/synthetic", tokenizer, options)   # RULER's prompts, our runner
    write_ruler_data("prompts/", samples)          # our prompts in RULER's layout (diff against prepare.py's)
    write_predictions("eval_out/ruler", samples, records)   # RULER's evaluate.py scores these unmodified

The model reads `input + answer_prefix` (as call_api.py sends it) and generates RULER's
tokens_to_generate for the task.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Optional, Sequence

from longctx import atomic
from longctx.errors import UserError
from longctx.eval.scoring import postprocess_pred, ruler_round
from longctx.eval.tasks import RULER_TASKS, TASKS, Sample, TaskOptions
from longctx.eval.tasks.base import count_tokens_fn

DATA_FILE = "validation.jsonl"  # prepare.py's default subset


def ruler_input(sample: Sample) -> str:
    """The sample's `input` as prepare.py writes it: everything before the answer prefix,
    model (chat) template included."""
    return sample.pre_template + sample.chat_template.replace("{input}", sample.input)


def sample_to_data_line(sample: Sample) -> dict:
    line = {"index": sample.meta.get("ruler_index", sample.index), "input": ruler_input(sample),
            "outputs": list(sample.outputs), "length": sample.length, "length_w_model_temp": sample.length,
            "answer_prefix": sample.answer_prefix}
    if sample.depth is not None:
        line["others"] = {"depth": sample.depth}
    return line


def _by_length_and_task(samples: Sequence[Sample]) -> dict:
    groups: dict = {}
    for s in samples:
        groups.setdefault(s.target_length, {}).setdefault(s.task, []).append(s)
    return groups


def _write_jsonl(path: Path, lines: Sequence[dict]) -> None:
    """JSON lines as RULER writes them (json.dumps defaults: ASCII), via a temporary sibling."""
    atomic.write_result(path, "".join(json.dumps(line) + "\n" for line in lines))


def write_ruler_data(root: str | Path, samples: Sequence[Sample]) -> list[str]:
    """root/<L>/data/<task>/validation.jsonl for every (length, task) of `samples`."""
    written = []
    for length, tasks in sorted(_by_length_and_task(samples).items()):
        for task, group in tasks.items():
            path = Path(root) / str(length) / "data" / task / DATA_FILE
            _write_jsonl(path, [sample_to_data_line(s) for s in sorted(group, key=lambda s: s.index)])
            written.append(str(path))
    return written


# --------------------------------------------------------------------------------------------
# Reading prepared data

def _task_dirs(folder: Path) -> dict[str, Path]:
    return {p.parent.name: p for p in sorted(folder.glob(f"*/{DATA_FILE}"))}


def find_ruler_data(root: str | Path, lengths: Sequence[int] = ()) -> dict[int, dict[str, Path]]:
    """{length: {task: file}}. `root` is one length's data folder (<task>/validation.jsonl:
    labelled with the one length in `lengths`) or a folder of <L>/data/<task>/ (or <L>/<task>/)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"eval.ruler_data: {root} is not a directory (expected RULER's <task>/{DATA_FILE} folders)")
    found: dict[int, dict[str, Path]] = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit()):
        files = _task_dirs(sub / "data") or _task_dirs(sub)
        if files:
            found[int(sub.name)] = files
    direct = _task_dirs(root)
    if direct:
        if found or len(lengths) != 1:
            raise UserError(f"eval.ruler_data: {root} holds one length's data (<task>/{DATA_FILE}); give exactly one "
                            f"length in eval.lengths to label it (got {list(lengths) or 'none'})")
        found[int(lengths[0])] = direct
    if not found:
        raise UserError(f"eval.ruler_data: no <task>/{DATA_FILE} under {root} (nor <L>/data/<task>/{DATA_FILE})")
    return found


def _read_lines(path: Path) -> list[dict]:
    lines = []
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"eval.ruler_data: {path} line {n} is not JSON ({e.msg})") from None
        missing = [k for k in ("input", "outputs") if k not in line]
        if missing or not isinstance(line.get("outputs"), list):
            raise UserError(f"eval.ruler_data: {path} line {n} lacks {missing or ['outputs as a list']} "
                            "(RULER's prepare.py writes index, input, outputs, length, answer_prefix)")
        lines.append(line)
    return lines


def read_ruler_data(root: str | Path, tokenizer, options: TaskOptions = TaskOptions(), *,
                    lengths: Sequence[int] = (), tasks: Optional[Sequence[str]] = None) -> tuple[list[Sample], list[str]]:
    """RULER's prepared samples as Samples (our runner reads `input + answer_prefix` and
    generates RULER's tokens_to_generate), and messages for folders skipped (unknown tasks)."""
    if options.chat_template is not None:
        raise UserError("eval.chat_template: RULER's data carries its model template already "
                        "(prepare.py --model_template_type); leave chat_template unset with ruler_data")
    count = count_tokens_fn(tokenizer, options)
    samples, skipped = [], []
    for length, files in sorted(find_ruler_data(root, lengths).items()):
        for name, path in files.items():
            if tasks is not None and name not in tasks:
                continue
            if name not in TASKS:
                skipped.append(f"{name} skipped: not a task this eval knows ({path})")
                continue
            task = TASKS[name]
            budget = options.max_new_tokens or task.ruler_max_new_tokens
            for i, line in enumerate(_read_lines(path)):
                others = line.get("others", {}) or {}
                s = Sample(task=name, index=i, input=line["input"], answer_prefix=line.get("answer_prefix", ""),
                           outputs=[str(o) for o in line["outputs"]], metric=task.metric, target_length=length,
                           max_new_tokens=budget, depth=others.get("depth"),
                           meta={"source": "ruler_data", "ruler_index": line.get("index", i), "others": others,
                                 "ruler_length": line.get("length", -1)})
                s.prompt_tokens = count(s.prompt)
                samples.append(s)
    return samples, skipped


# --------------------------------------------------------------------------------------------
# Predictions and summary.csv

def _pred_line(sample: Sample, record: dict) -> dict:
    others = sample.meta.get("others")
    if others is None:
        others = {"depth": sample.depth} if sample.depth is not None else {}
    return {"index": sample.meta.get("ruler_index", sample.index), "pred": record["prediction"],
            "input": sample.prompt, "outputs": list(sample.outputs), "others": others, "truncation": -1,
            "length": sample.meta.get("ruler_length", sample.length)}


def ruler_score(metric: str, preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """evaluate.py's task score: its arithmetic (per-sample hit fractions summed, / n, x 100),
    rounded as it rounds."""
    preds = [postprocess_pred(p).lower() for p in preds]
    per_sample = [[1.0 if r.lower() in p else 0.0 for r in ref] for p, ref in zip(preds, refs)]
    if metric == "string_match_part":
        total = sum(max(h) for h in per_sample)
    else:
        total = sum(sum(h) / len(h) for h in per_sample)
    return ruler_round(total / len(preds) * 100)


def write_summary_csv(folder: Path, rows: dict[str, tuple[float, str]]) -> Path:
    """summary.csv as evaluate.py writes it (pandas' header row 0..n, then Tasks / Score /
    Nulls); summary-<task>.csv when there is one task."""
    tasks = [t for t in RULER_TASKS if t in rows]
    path = folder / ("summary.csv" if len(tasks) > 1 else f"summary-{tasks[0]}.csv")
    table = [list(range(len(tasks) + 1)), ["Tasks"] + tasks, ["Score"] + [rows[t][0] for t in tasks],
             ["Nulls"] + [rows[t][1] for t in tasks]]
    with atomic.result_file(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\n").writerows(table)
    return path


def write_predictions(root: str | Path, samples: Sequence[Sample], records: Sequence[dict]) -> list[str]:
    """root/<L>/pred/<task>.jsonl for every task and length, and root/<L>/pred/summary.csv over
    RULER's tasks among them (RULER's evaluate.py reads only its own 13)."""
    by_key = {(s.task, s.target_length, s.index): s for s in samples}
    written = []
    for length, tasks in sorted(_by_length_and_task(samples).items()):
        folder = Path(root) / str(length) / "pred"
        rows = {}
        for task in tasks:
            recs = sorted((r for r in records if r["task"] == task and r["target_length"] == length),
                          key=lambda r: r["index"])
            if not recs:
                continue
            lines = [_pred_line(by_key[(task, length, r["index"])], r) for r in recs]
            _write_jsonl(folder / f"{task}.jsonl", lines)
            written.append(str(folder / f"{task}.jsonl"))
            preds = [line["pred"] for line in lines]
            nulls = sum(len(postprocess_pred(p)) == 0 for p in preds)
            rows[task] = (ruler_score(recs[0]["metric"], preds, [line["outputs"] for line in lines]),
                          f"{nulls}/{len(preds)}")
        if any(t in rows for t in RULER_TASKS):
            written.append(str(write_summary_csv(folder, rows)))
    return written
