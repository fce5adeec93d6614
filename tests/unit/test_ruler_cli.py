"""`longctx eval` with RULER's files: --write-data (no weights), --ruler-data, pred/ + summary.csv,
results.json's verdict and the CLI's one warning line."""
import json
from pathlib import Path

import pytest

import longctx
from longctx.commands.cli import main
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.api import evaluate
from longctx.eval.config import EvalConfig
from longctx.eval.ruler_format import write_ruler_data
from longctx.eval.tasks import RULER_TASKS, Sample
from longctx.model import build_model, get_preset

TASKS = "niah_single_1,niah_single_2,vt"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    cfg = get_preset("debug-tiny", initializer_range=0.2, max_position_embeddings=1024)
    longctx.save_pretrained(build_model(cfg, seed=0).eval(), d)
    config = json.loads((d / "config.json").read_text())
    config["longctx_tokenizer"] = "byte"
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_write_data_then_ruler_data_gives_the_generated_scores(model_dir, tmp_path, capsys):
    common = ["--tasks", TASKS, "--lengths", "1024", "--samples", "2", "--max-new-tokens", "4", "--no-progress"]
    assert main(["eval", "--tokenizer", "byte", "--write-data", str(tmp_path / "data"), *common]) == 0
    assert "wrote 3 RULER data files" in capsys.readouterr().out
    assert main(["eval", "--model", str(model_dir), "--out", str(tmp_path / "ours"), *common]) == 0
    err = capsys.readouterr().err
    warning = [x for x in err.splitlines() if x.startswith("warning: not comparable")]
    assert len(warning) == 1 and "built-in essay haystack for niah_single_2" in warning[0]
    assert main(["eval", "--model", str(model_dir), "--ruler-data", str(tmp_path / "data"),
                 "--out", str(tmp_path / "theirs"), *common]) == 0
    ours = json.loads((tmp_path / "ours" / "results.json").read_text())
    theirs = json.loads((tmp_path / "theirs" / "results.json").read_text())
    assert ours["summary"]["tasks"] == theirs["summary"]["tasks"]
    assert [r["generated_ids"] for r in ours["samples"]] == [r["generated_ids"] for r in theirs["samples"]]
    assert ours["ruler_comparable"] is False and ("qa_1 and qa_2 not evaluated (pass squad=FILE / hotpotqa=FILE)"
                                                  in ours["departures"])
    assert not any("essay" in d for d in theirs["departures"])  # RULER's data brings its own haystack
    for task in TASKS.split(","):
        a = (tmp_path / "ours" / "ruler" / "1024" / "pred" / f"{task}.jsonl").read_text()
        assert a == (tmp_path / "theirs" / "ruler" / "1024" / "pred" / f"{task}.jsonl").read_text()
    assert (tmp_path / "ours" / "ruler" / "1024" / "pred" / "summary.csv").read_text().startswith("0,1,2,3\nTasks,")
    report = (tmp_path / "ours" / "report.md").read_text()
    assert f"Average over 3 tasks: {TASKS.replace(',', ', ')}" in report
    # write_data never overwrites, and needs a tokenizer without a model
    assert main(["eval", "--tokenizer", "byte", "--write-data", str(tmp_path / "data"), *common]) == 2
    assert "exists; write into an empty directory" in capsys.readouterr().err
    assert main(["eval", "--write-data", str(tmp_path / "d2"), *common]) == 2
    assert "error: eval.tokenizer: write_data without a model" in capsys.readouterr().err


def test_rulers_13_tasks_with_500_samples_are_comparable(tmp_path):
    """RULER's data layout with 500 samples for each of its 13 tasks, a subword tokenizer."""
    samples = [Sample(task=t, index=i, input=f"Question {i} of {t}.", answer_prefix=" Answer:",
                      outputs=[f"answer{i}"], metric="string_match_all", target_length=4096, max_new_tokens=8)
               for t in RULER_TASKS for i in range(500)]
    for path in write_ruler_data(tmp_path / "data", samples):  # as prepare.py writes them: no generator key
        lines = [json.loads(x) for x in Path(path).read_text().splitlines()]
        Path(path).write_text("".join(json.dumps({k: v for k, v in x.items() if k != "generator"}) + "\n"
                                      for x in lines))

    class Words:  # a stand-in subword tokenizer: one token per word
        bos_id = eos_id = pad_id = None
        encode = staticmethod(lambda text, add_bos=False: text.split())

    cfg = EvalConfig(ruler_data=str(tmp_path / "data"), out=str(tmp_path / "out"), no_progress=True)
    res = evaluate(None, Words(), cfg, predictor=lambda s: " " + s.outputs[0])
    assert res["comparability"] == {"ruler_comparable": True, "departures": []}
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["ruler_comparable"] is True and doc["departures"] == []
    csv_text = (tmp_path / "out" / "ruler" / "4096" / "pred" / "summary.csv").read_text().splitlines()
    assert csv_text[1] == "Tasks," + ",".join(RULER_TASKS)
    assert csv_text[2] == "Score," + ",".join(["100.0"] * 13) and csv_text[3] == "Nulls," + ",".join(["0/500"] * 13)
    # the same run on one byte-tokenizer length is not
    res = evaluate(None, load_tokenizer("byte"), cfg, predictor=lambda s: " " + s.outputs[0])
    assert res["comparability"]["departures"] == [
        "byte tokenizer: lengths count bytes, so a prompt holds ~4x less text than RULER's at the same length"]
