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

from longctx.base.errors import UserError
from longctx.eval.scoring import postprocess_pred, ruler_round
from longctx.eval.tasks import RULER_TASKS, TASKS, Sample, TaskOptions
from longctx.eval.tasks.base import count_tokens_fn
from longctx.storage import atomic

DATA_FILE = "validation.jsonl"  # prepare.py's default subset
GENERATOR_KEY, GENERATOR = "generator", "longctx"  # marks the lines --write-data writes (prepare.py has no such key)


def ruler_input(sample: Sample) -> str:
    """The sample's `input` as prepare.py writes it: everything before the answer prefix,
    model (chat) template included."""
    return sample.pre_template + sample.chat_template.replace("{input}", sample.input)


def sample_to_data_line(sample: Sample, tokenizer=None) -> dict:
    """One prepare.py line. With the tokenizer, `length` counts as RULER's does (the input and
    answer prefix without BOS, plus the generation budget) and niah lines carry
    `token_position_answer` (the tokens before the first answer); without it, `length` is the
    sample's own count (BOS included when the eval adds one)."""
    length = sample.length if tokenizer is None else len(tokenizer.encode(sample.prompt)) + sample.max_new_tokens
    line = {"index": sample.meta.get("ruler_index", sample.index), "input": ruler_input(sample),
            "outputs": list(sample.outputs), "length": length, "length_w_model_temp": length,
            "answer_prefix": sample.answer_prefix}
    if tokenizer is not None and TASKS[sample.task].family == "niah" and sample.outputs:
        text = line["input"]
        at = text.find(sample.outputs[0])
        if at >= 0:
            line["token_position_answer"] = len(tokenizer.encode(text[:at]))
    if sample.depth is not None:
        line["others"] = {"depth": sample.depth}
    line[GENERATOR_KEY] = GENERATOR  # read back, these prompts are still ours (comparability.py)
    return line


def _by_length_and_task(samples: Sequence[Sample]) -> dict:
    groups: dict = {}
    for s in samples:
        groups.setdefault(s.target_length, {}).setdefault(s.task, []).append(s)
    return groups


def _write_jsonl(path: Path, lines: Sequence[dict]) -> None:
    """JSON lines as RULER writes them (json.dumps defaults: ASCII), via a temporary sibling."""
    atomic.write_result(path, "".join(json.dumps(line) + "\n" for line in lines))


def write_ruler_data(root: str | Path, samples: Sequence[Sample], tokenizer=None) -> list[str]:
    """root/<L>/data/<task>/validation.jsonl for every (length, task) of `samples` (tokenizer:
    see sample_to_data_line)."""
    written = []
    for length, tasks in sorted(_by_length_and_task(samples).items()):
        for task, group in tasks.items():
            path = Path(root) / str(length) / "data" / task / DATA_FILE
            _write_jsonl(path, [sample_to_data_line(s, tokenizer) for s in sorted(group, key=lambda s: s.index)])
            written.append(str(path))
    return written


# --------------------------------------------------------------------------------------------
# Reading prepared data

def _task_dirs(folder: Path) -> dict[str, Path]:
    return {p.parent.name: p for p in sorted(folder.glob(f"*/{DATA_FILE}"))}


def _length_of_folder(folder: Path) -> Optional[int]:
    """prepare.py's save_dir is <L>/data: the length its path names (None when it names none)."""
    if folder.name == "data" and folder.parent.name.isdigit():
        return int(folder.parent.name)
    return int(folder.name) if folder.name.isdigit() else None


def find_ruler_data(root: str | Path, lengths: Optional[Sequence[int]] = None) -> dict[int, dict[str, Path]]:
    """{length: {task: file}}: the lengths come from the data's folders. `root` is one length's
    data folder (<task>/validation.jsonl: <L>/data names its length, else the one length of
    `lengths` labels it, checked against its lines by read_ruler_data) or a folder of
    <L>/data/<task>/ (or <L>/<task>/). `lengths` given (eval.lengths set explicitly): each must
    be one of the data's; None: every length in the data."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"eval.ruler_data: {root} is not a directory (expected RULER's <task>/{DATA_FILE} folders)")
    found: dict[int, dict[str, Path]] = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit()):
        files = _task_dirs(sub / "data") or _task_dirs(sub)
        if files:
            found[int(sub.name)] = files
    direct = _task_dirs(root)
    if direct and found:
        raise UserError(f"eval.ruler_data: {root} holds both <task>/{DATA_FILE} and <L>/ folders; point it at one "
                        "length's data folder or at the folder of lengths")
    if direct:
        named = _length_of_folder(root)
        if named is None and (lengths is None or len(lengths) != 1):
            raise UserError(f"eval.ruler_data: {root} holds one length's data (<task>/{DATA_FILE}) and its path "
                            f"names no length (prepare.py writes <L>/data/); give exactly one length in eval.lengths "
                            f"to label it (got {list(lengths) if lengths else 'none'})")
        found[named if named is not None else int(lengths[0])] = direct
    if not found:
        raise UserError(f"eval.ruler_data: no <task>/{DATA_FILE} under {root} (nor <L>/data/<task>/{DATA_FILE})")
    if lengths is not None:
        stray = [L for L in lengths if L not in found]
        if stray:
            have = ", ".join(map(str, sorted(found)))
            raise UserError(f"eval.lengths: {', '.join(map(str, stray))} not in the RULER data of {root} (its lengths: "
                            f"{have}); with ruler_data the lengths come from the data: leave lengths out, or pick "
                            f"among {have}")
        found = {L: files for L, files in found.items() if L in lengths}
    return found


def check_line_lengths(length: int, path: Path, lines: Sequence[dict], root: Path) -> None:
    """A length given for a folder whose path names none must fit its lines: RULER's `length`
    (input + generation budget) is at most the length prepared for and fills most of it."""
    counted = [line["length"] for line in lines if isinstance(line.get("length"), int)]
    if counted and not (max(counted) <= length < 2 * max(counted)):
        raise UserError(f"eval.lengths: {length} does not fit the RULER data of {root}: {path} has lines of up to "
                        f"{max(counted)} tokens (RULER's length); give the length it was prepared for, or put it "
                        f"under <L>/data/ as prepare.py writes it")


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
                    lengths: Optional[Sequence[int]] = None,
                    tasks: Optional[Sequence[str]] = None) -> tuple[list[Sample], list[str]]:
    """RULER's prepared samples as Samples (our runner reads `input + answer_prefix` and
    generates RULER's tokens_to_generate), and messages for folders skipped (unknown tasks).
    lengths: eval.lengths when set explicitly (find_ruler_data); the data's lengths otherwise."""
    root = Path(root)
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
            lines = _read_lines(path)
            if _length_of_folder(path.parent.parent) != length:  # a length given, not named by the path
                check_line_lengths(length, path, lines, root)
            for i, line in enumerate(lines):
                others = line.get("others", {}) or {}
                s = Sample(task=name, index=i, input=line["input"], answer_prefix=line.get("answer_prefix", ""),
                           outputs=[str(o) for o in line["outputs"]], metric=task.metric, target_length=length,
                           max_new_tokens=budget, depth=others.get("depth"),
                           meta={"source": "ruler_data", "ruler_index": line.get("index", i), "others": others,
                                 "ruler_length": line.get("length", -1),
                                 "generator": line.get(GENERATOR_KEY, "ruler")})
                s.prompt_tokens = count(s.prompt)
                samples.append(s)
    return samples, skipped


# --------------------------------------------------------------------------------------------
# Predictions and summary.csv

def _pred_line(sample: Sample, record: dict, bos_tokens: int = 0) -> dict:
    others = sample.meta.get("others")
    if others is None:
        others = {"depth": sample.depth} if sample.depth is not None else {}
    return {"index": sample.meta.get("ruler_index", sample.index), "pred": record["prediction"],
            "input": sample.prompt, "outputs": list(sample.outputs), "others": others, "truncation": -1,
            "length": sample.meta.get("ruler_length", sample.length - bos_tokens)}


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


def write_predictions(root: str | Path, samples: Sequence[Sample], records: Sequence[dict],
                      bos_tokens: int = 0) -> list[str]:
    """root/<L>/pred/<task>.jsonl for every task and length, and root/<L>/pred/summary.csv over
    RULER's tasks among them (RULER's evaluate.py reads only its own 13). bos_tokens: 1 when
    our samples' lengths count a BOS, which RULER's `length` does not."""
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
            lines = [_pred_line(by_key[(task, length, r["index"])], r, bos_tokens) for r in recs]
            _write_jsonl(folder / f"{task}.jsonl", lines)
            written.append(str(folder / f"{task}.jsonl"))
            preds = [line["pred"] for line in lines]
            nulls = sum(len(postprocess_pred(p)) == 0 for p in preds)
            rows[task] = (ruler_score(recs[0]["metric"], preds, [line["outputs"] for line in lines]),
                          f"{nulls}/{len(preds)}")
        if any(t in rows for t in RULER_TASKS):
            written.append(str(write_summary_csv(folder, rows)))
    return written
