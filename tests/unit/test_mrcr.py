"""MRCR: the set's scoring (the required prefix, then difflib's ratio; a wrong prefix scores 0) on
known answers, bins by token count and needle count, a generated file in the set's exact columns
read and run in process through `longctx eval --mrcr` (resumed from its records) and over
--endpoint-mode chat (the conversation sent as messages, the reply scored)."""
import json
from difflib import SequenceMatcher

import pytest

from helpers.lm_eval_tasks import write_model
from helpers.openai_standin import Script, serve
from longctx.base.errors import UserError
from longctx.commands.cli import main
from longctx.eval import mrcr
from longctx.eval.runner import Engine
from longctx.eval.state import EvalResult
from longctx.eval.wandb_table import result_rows

PREFIX = "aZ3k9"


def _row(i, needles, answer, turns=3):
    """One row in MRCR's columns: a conversation of `turns` user/assistant pairs, then the ask."""
    conv = []
    for t in range(turns):
        conv += [{"role": "user", "content": f"write a poem about tapirs #{t}"},
                 {"role": "assistant", "content": f"tapir poem {t}: snout and soft feet"}]
    conv.append({"role": "user", "content": f"Prepend {PREFIX} to the 2nd (1 indexed) poem about tapirs."})
    return {"prompt": json.dumps(conv), "answer": PREFIX + answer, "random_string_to_prepend": PREFIX,
            "n_needles": needles, "desired_msg_index": 3, "total_messages": len(conv),
            "n_chars": sum(len(m["content"]) for m in conv)}


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "mrcr" / "2needle.jsonl"
    path.parent.mkdir()
    rows = [_row(0, 2, "tapir poem 1: snout and soft feet"), _row(1, 2, "x" * 40), _row(2, 4, "abc", turns=1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_sets_scoring_on_known_answers():
    answer = PREFIX + "tapir poem 1: snout and soft feet"
    assert mrcr.grade(answer, answer, PREFIX) == 1.0
    assert mrcr.grade("tapir poem 1: snout and soft feet", answer, PREFIX) == 0.0  # no prefix
    assert mrcr.grade("zzzzz" + answer[5:], answer, PREFIX) == 0.0  # a wrong prefix
    half = PREFIX + "tapir poem 1: snout"
    assert mrcr.grade(half, answer, PREFIX) == pytest.approx(
        SequenceMatcher(None, "tapir poem 1: snout", "tapir poem 1: snout and soft feet").ratio())
    assert 0 < mrcr.grade(half, answer, PREFIX) < 1
    assert [mrcr.bin_of(n) for n in (100, 4096, 8191, 130000, 2_000_000)] == [
        "0-4k", "4k-8k", "4k-8k", "64k-128k", "512k-1M"]


def test_rows_answered_graded_and_reported_by_bin_and_needles(rows_file):
    rows = mrcr.load_rows(str(rows_file.parent))
    assert [r["index"] for r in rows] == [0, 1, 2]
    responses = {0: rows[0]["answer"], 1: "wrong" + rows[1]["answer"], 2: PREFIX + "ab"}
    tokens = {0: 100, 1: 5000, 2: 5000}
    records, finished = mrcr.run_rows(rows, lambda r: (responses[r["index"]], tokens[r["index"]]))
    assert finished and [r["score"] for r in records] == [1.0, 0.0, pytest.approx(0.8)]
    s = mrcr.summarize(records)
    assert s["all"]["score"] == pytest.approx(100 * 1.8 / 3) and s["all"]["n"] == 3
    assert s["by_bin"]["0-4k"]["score"] == 100.0 and s["by_bin"]["4k-8k"]["score"] == pytest.approx(40.0)
    assert s["by_needles"]["2"]["score"] == 50.0 and s["by_needles"]["4"]["score"] == pytest.approx(80.0)
    assert s["by_bin_and_needles"]["4k-8k/4"]["n"] == 1
    assert "| 0-4k | 100.0 (n=1) | - | 100.0 |" in mrcr.render(s)
    result = EvalResult(None, [], None, [], [], {}, None, None, None, lm_eval={"tasks": {"hs": {"metrics": {
        "acc,none": 0.5}}}}, mrcr={"summary": s})  # the W&B table's rows (--wandb-project)
    assert result_rows(result) == [["hs", 0, "acc,none", 0.5], ["mrcr", 4096, "score", 100.0],
                                   ["mrcr", 8192, "score", pytest.approx(40.0)]]
    bad = rows_file.parent / "bad.json"
    bad.write_text(json.dumps([{"prompt": "[]", "answer": "a"}]))
    with pytest.raises(UserError, match="eval.mrcr: .*bad.json lacks the column"):
        mrcr.load_rows(str(bad))


def test_in_process_with_the_chat_template_and_resumed(rows_file, tmp_path, monkeypatch):
    model = write_model(tmp_path / "model")
    out = tmp_path / "out"
    args = ["eval", "--model", str(model), "--suite", "none", "--mrcr", str(rows_file), "--max-new-tokens", "4",
            "--out", str(out), "--no-progress"]
    prompts = []
    real = Engine.generate_ids
    monkeypatch.setattr(Engine, "generate_ids", lambda self, p, n: prompts.extend(p) or real(self, p, n))
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    summary = results["mrcr"]["summary"]
    assert summary["all"]["n"] == 3 and set(summary["by_needles"]) == {"2", "4"}
    # the model read the conversation as transformers' apply_chat_template gives it, ids and all
    from transformers import AutoTokenizer

    want = AutoTokenizer.from_pretrained(str(model)).apply_chat_template(
        mrcr.messages(mrcr.load_rows(str(rows_file))[0]), add_generation_prompt=True, tokenize=True)
    assert prompts[0] == list(want["input_ids"])
    assert len(prompts) == 3 and "## MRCR" in (out / "report.md").read_text()
    records = [json.loads(x) for x in (out / "mrcr" / "records.jsonl").read_text().splitlines()]
    assert [r["score"] for r in records] == [mrcr.grade(r["response"], row["answer"], PREFIX)
                                             for r, row in zip(records, mrcr.load_rows(str(rows_file)))]
    prompts.clear()
    assert main(args) == 0  # the rerun answers nothing again
    assert prompts == [] and json.loads((out / "results.json").read_text())["mrcr"] == results["mrcr"]


def test_over_an_endpoint_in_chat_mode(rows_file, tmp_path, capsys):
    model = write_model(tmp_path / "model")
    script = Script(answer=PREFIX + "tapir poem 1: snout and soft feet")
    server, url = serve(script)
    try:
        rc = main(["eval", "--endpoint", url, "--endpoint-mode", "chat", "--tokenizer", str(model), "--suite",
                   "none", "--mrcr", str(rows_file), "--mrcr-samples", "2", "--out", str(tmp_path / "o"),
                   "--no-progress"])
    finally:
        server.shutdown()
        server.server_close()
    assert rc == 0
    sent = [body for path, _, body in script.requests if path == "/v1/chat/completions"][-2:]  # after the probe's
    assert [b["messages"] for b in sent] == [json.loads(r["prompt"]) for r in mrcr.load_rows(str(rows_file), 2)]
    assert all(b["temperature"] == 0 for b in sent)
    summary = json.loads((tmp_path / "o" / "results.json").read_text())["mrcr"]["summary"]
    assert summary["all"]["n"] == 2 and summary["all"]["score"] == pytest.approx(50.0)  # row 0 right, row 1 not
    capsys.readouterr()
    assert main(["eval", "--endpoint", url, "--tokenizer", str(model), "--suite", "none", "--mrcr", str(rows_file),
                 "--out", str(tmp_path / "o2")]) == 2
    assert "error: eval.endpoint_mode: MRCR sends its conversations as messages" in capsys.readouterr().err
