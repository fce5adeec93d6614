"""RULER's evaluate.py (scripts/eval/evaluate.py + scripts/eval/synthetic/constants.py),
re-implemented from its source as the tests' independent scorer of our prediction files (its
own script needs NeMo): per-task scores and the summary.csv text it writes."""
import json
import re

import pytest

from longctx.eval.tasks import RULER_TASKS


def _ruler_postprocess(pred):
    pred = pred.strip()
    return re.compile(r"[\x00-\x1f]").sub("\n", pred).strip()


def _ruler_match_all(preds, refs):
    score = sum([sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref)
                 for pred, ref in zip(preds, refs)]) / len(preds) * 100
    return round(score, 2)


def _ruler_match_part(preds, refs):
    score = sum([max([1.0 if r.lower() in pred.lower() else 0.0 for r in ref])
                 for pred, ref in zip(preds, refs)]) / len(preds) * 100
    return round(score, 2)


RULER_METRIC = {t: (_ruler_match_part if t.startswith("qa") else _ruler_match_all) for t in RULER_TASKS}


def ruler_evaluate(pred_dir):
    """{task: (score, nulls)} and the summary.csv text evaluate.py would write for pred_dir."""
    results = {}
    for task in RULER_TASKS:  # synthetic.yaml's order
        path = pred_dir / f"{task}.jsonl"
        if not path.exists():
            continue
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        preds = [_ruler_postprocess(x["pred"]) for x in lines]
        refs = [x.get("outputs", [x.get("output", "")]) for x in lines]
        ids = [x["others"].get("id", x["index"]) for x in lines]  # evaluate.py's submission ids
        assert len(ids) == len(preds)
        results[task] = (RULER_METRIC[task](preds, refs), f"{sum(len(p) == 0 for p in preds)}/{len(preds)}")
    pd = pytest.importorskip("pandas")
    tasks = list(results)
    df = pd.DataFrame([["Tasks"] + tasks, ["Score"] + [results[t][0] for t in tasks],
                       ["Nulls"] + [results[t][1] for t in tasks]])
    return results, df.to_csv(index=False)
