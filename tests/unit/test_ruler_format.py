"""RULER's file formats: our prompts written as prepare.py's data, read back and run through the
runner, predictions written as call_api.py's, scored by a re-implementation of RULER's
evaluate.py (scripts/eval/evaluate.py + scripts/eval/synthetic/constants.py) and compared with
our scores and our summary.csv."""
import csv
import json
import re

import pytest

from helpers.ruler_scorer import ruler_evaluate
from longctx.base.errors import UserError
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.report import aggregate
from longctx.eval.ruler_format import read_ruler_data, write_predictions, write_ruler_data
from longctx.eval.runner import Engine, run_samples
from longctx.eval.scoring import ruler_round, weighted_average
from longctx.eval.tasks import RULER_TASKS, TaskOptions, build_samples
from longctx.model import build_model, get_preset

BYTE = load_tokenizer("byte")
LENGTH = 2048
SYNTHETIC_TASKS = [t for t in RULER_TASKS if not t.startswith("qa")]  # no QA data in this test
PRED_FIELDS = {"index", "pred", "input", "outputs", "others", "truncation", "length"}
DATA_FIELDS = {"index", "input", "outputs", "length", "length_w_model_temp", "answer_prefix", "generator"}


def _predictor(sample):
    """Depends on the prompt only (both pipelines see the same prompts); right, half right,
    wrong and empty answers, so scores and Nulls are not all 0 or 100."""
    k = len(sample.prompt) % 4
    if k == 0:
        return ""
    if k == 1:
        return " " + ", ".join(sample.outputs)
    if k == 2:
        return " " + sample.outputs[0] + "\n"
    return " " + " ".join(re.findall(r"\b\d{7}\b", sample.prompt)[:2])


@pytest.fixture(scope="module")
def generated():
    return [s for t in SYNTHETIC_TASKS + ["passkey"] for s in build_samples(t, BYTE, LENGTH, 6, seed=3)]


def test_written_data_has_prepare_py_fields_and_reads_back_as_the_same_prompts(generated, tmp_path):
    files = write_ruler_data(tmp_path, generated)
    assert sorted(files) == sorted(str(tmp_path / "2048" / "data" / t / "validation.jsonl")
                                   for t in SYNTHETIC_TASKS + ["passkey"])
    line = json.loads((tmp_path / "2048" / "data" / "vt" / "validation.jsonl").read_text().splitlines()[0])
    assert set(line) == DATA_FIELDS
    assert line["answer_prefix"].startswith(" Answer: According to the chain(s)")
    back, skipped = read_ruler_data(tmp_path, BYTE)
    assert not skipped
    key = lambda s: (s.task, s.index)  # noqa: E731
    for ours, theirs in zip(sorted(generated, key=key), sorted(back, key=key)):
        assert (ours.task, ours.target_length, ours.outputs) == (theirs.task, theirs.target_length, theirs.outputs)
        assert ours.prompt == theirs.prompt and ours.prompt_tokens == theirs.prompt_tokens
        assert ours.max_new_tokens == theirs.max_new_tokens and ours.metric == theirs.metric
    # one length's folder (prepare.py's save_dir) is labelled by the one length given
    one, _ = read_ruler_data(tmp_path / "2048" / "data", BYTE, lengths=[2048], tasks=["fwe"])
    assert [s.prompt for s in one] == [s.prompt for s in generated if s.task == "fwe"]


def test_round_trip_scores_equal_and_ruler_evaluate_agrees(generated, tmp_path):
    write_ruler_data(tmp_path / "data", generated)
    back, _ = read_ruler_data(tmp_path / "data", BYTE)
    engine = Engine(None, BYTE)
    rec_ours = run_samples(engine, generated, progress=False, predictor=_predictor)
    rec_back = run_samples(engine, back, progress=False, predictor=_predictor)
    assert [r["score"] for r in rec_ours] == [r["score"] for r in rec_back]
    ours, theirs = aggregate(rec_ours), aggregate(rec_back)
    assert ours["tasks"] == theirs["tasks"]

    write_predictions(tmp_path / "pred_ours", generated, rec_ours)
    write_predictions(tmp_path / "pred_back", back, rec_back)
    d_ours, d_back = tmp_path / "pred_ours" / "2048" / "pred", tmp_path / "pred_back" / "2048" / "pred"
    for task in SYNTHETIC_TASKS + ["passkey"]:
        assert (d_ours / f"{task}.jsonl").read_text() == (d_back / f"{task}.jsonl").read_text()
        lines = [json.loads(x) for x in (d_ours / f"{task}.jsonl").read_text().splitlines()]
        assert all(set(x) == PRED_FIELDS for x in lines)
        assert [x["index"] for x in lines] == list(range(6))
    results, csv_text = ruler_evaluate(d_ours)
    assert list(results) == SYNTHETIC_TASKS  # passkey is not one of RULER's tasks
    for task, (score, nulls) in results.items():
        assert score == ruler_round(ours["tasks"][task]["scores"]["2048"]), task
    assert any(n != "0/6" for _, n in results.values()) and len({s for s, _ in results.values()}) > 2
    assert (d_ours / "summary.csv").read_text() == csv_text
    rows = list(csv.reader(csv_text.splitlines()))
    assert rows[0][0] == "0" and rows[1][0] == "Tasks" and rows[2][0] == "Score" and rows[3][0] == "Nulls"


def test_real_model_generates_the_same_tokens_from_either_pipeline(tmp_path):
    cfg = get_preset("debug-tiny", initializer_range=0.2, max_position_embeddings=1024)
    model = build_model(cfg, seed=0).eval()
    opts = TaskOptions(max_new_tokens=6)
    ours = [s for t in ("niah_single_1", "vt") for s in build_samples(t, BYTE, 1024, 2, seed=1, options=opts)]
    write_ruler_data(tmp_path, ours)
    back, _ = read_ruler_data(tmp_path, BYTE, opts)
    a = run_samples(Engine(model, BYTE), ours, progress=False)
    b = run_samples(Engine(model, BYTE), back, progress=False)
    assert [r["generated_ids"] for r in a] == [r["generated_ids"] for r in b]
    assert [r["prediction"] for r in a] == [r["prediction"] for r in b]


def test_single_task_summary_file_and_ruler_data_errors(tmp_path):
    samples = build_samples("niah_single_1", BYTE, 1024, 2, seed=0)
    recs = run_samples(Engine(None, BYTE), samples, progress=False, predictor=_predictor)
    files = write_predictions(tmp_path, samples, recs)
    assert files[-1].endswith("1024/pred/summary-niah_single_1.csv")  # evaluate.py's name for one task
    with pytest.raises(UserError, match="eval.ruler_data: .* is not a directory"):
        read_ruler_data(tmp_path / "missing", BYTE)
    with pytest.raises(UserError, match="no <task>/validation.jsonl"):
        read_ruler_data(tmp_path, BYTE)
    bad = tmp_path / "bad" / "niah_single_1"
    bad.mkdir(parents=True)
    (bad / "validation.jsonl").write_text('{"index": 0, "input": "x"}\n')
    with pytest.raises(UserError, match="line 1 lacks"):
        read_ruler_data(tmp_path / "bad", BYTE, lengths=[4096])
    with pytest.raises(UserError, match="give exactly one length"):
        read_ruler_data(tmp_path / "bad", BYTE, lengths=[4096, 8192])
    with pytest.raises(UserError, match="chat_template"):
        read_ruler_data(tmp_path / "bad", BYTE, TaskOptions(chat_template="chatml"), lengths=[4096])


def test_weighted_averages_over_lengths():
    scores = {4096: 90.0, 8192: 60.0, 16384: 30.0}
    assert weighted_average(scores, "inc") == pytest.approx((90 + 2 * 60 + 3 * 30) / 6)
    assert weighted_average(scores, "dec") == pytest.approx((3 * 90 + 2 * 60 + 30) / 6)
    summary = aggregate([{"task": "niah_single_1", "metric": "string_match_all", "target_length": L, "score": s}
                         for L, s in scores.items()])
    assert summary["wavg_inc"] == pytest.approx(50.0) and summary["wavg_dec"] == pytest.approx(70.0)
    assert summary["average_tasks_by_length"] == {"4096": ["niah_single_1"], "8192": ["niah_single_1"],
                                                  "16384": ["niah_single_1"]}
