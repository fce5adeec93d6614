"""`longctx eval --endpoint` against a real OpenAI-compatible server: `transformers serve` on CPU
(fp32) serving a tiny model saved with its tokenizer as `longctx export` writes one.

The server batches requests (--continuous-batching), as a serving stack does.

1. The served model's greedy predictions for RULER tasks equal, text for text, the in-process
   eval of the same weights with the same prompts; the results files have the same form (the
   endpoint's meta adds endpoint, served_model, endpoint_mode and server); RULER's prediction
   files are byte-identical and RULER's scorer (tests/helpers/ruler_scorer.py, a re-implementation
   of its evaluate.py) writes the same summary.csv from both.
2. Chat mode: the server's own template around our prompt gives what the in-process runner
   generates from that rendering, and the template's tokens measured from the server's usage
   are those our renderer of the same template adds.
3. The server killed mid-run: the eval stops by itself (exit 1, one error line) with its finished
   cells kept; with the server back, the same command sends only the rest.
"""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from benchlib.procs import free_port
from benchlib.served import ServedModel, write_tiny_model

import longctx
from helpers.ruler_scorer import ruler_evaluate
from longctx.commands.cli import main
from longctx.data.tokenizer import load_tokenizer, prepends_bos
from longctx.eval.chat import render
from longctx.eval.runner import Engine
from longctx.eval.tasks import Sample

pytestmark = pytest.mark.slow
TASKS = "niah_single_1,niah_multikey_1,vt,fwe"
COMMON = ["--tasks", TASKS, "--lengths", "1024", "--samples", "2", "--max-new-tokens", "24"]
ENDPOINT_META = {"endpoint", "served_model", "endpoint_mode", "server"}
BATCHING = ("--continuous-batching",)  # ~10x the requests/s of one at a time (docs/results/2026-12-06-served-eval.md)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    server = ServedModel(write_tiny_model(root / "hf"), free_port(), log=root / "serve.log", extra=BATCHING).start()
    yield server
    server.stop()


def _records(results: dict) -> dict:
    return {(r["task"], r["target_length"], r["index"]): r for r in results["samples"]}


def test_served_predictions_equal_the_in_process_eval_and_files_have_the_same_form(served, tmp_path, capsys):
    model = str(served.model_dir)
    inproc, endpoint = tmp_path / "inproc", tmp_path / "endpoint"
    assert main(["eval", "--model", model, "--tokenizer", model, "--dtype", "fp32", *COMMON, "--no-progress",
                 "--out", str(inproc)]) == 0
    capsys.readouterr()
    assert main(["eval", "--endpoint", served.url, "--tokenizer", model, *COMMON, "--concurrency", "4",
                 "--out", str(endpoint)]) == 0
    err = capsys.readouterr().err
    progress = [line for line in err.splitlines() if line.startswith("eval: sample")]
    assert progress and "req/s" in progress[-1] and "tok/s" in progress[-1]  # the plain line (no terminal)

    a, b = (json.loads((d / "results.json").read_text()) for d in (inproc, endpoint))
    ra, rb = _records(a), _records(b)
    assert len(ra) == 8 and ra.keys() == rb.keys()
    assert {k: r["prediction"] for k, r in rb.items()} == {k: r["prediction"] for k, r in ra.items()}
    assert any(r["prediction"].strip() for r in ra.values())  # text, not empty answers on both sides
    for key in ra:  # the same record form; the server gives text, not token ids
        assert ra[key].keys() == rb[key].keys() and rb[key]["generated_ids"] is None
    assert a.keys() == b.keys() and a["summary"] == b["summary"] and a["departures"] == b["departures"]
    assert set(b["meta"]) - set(a["meta"]) == ENDPOINT_META and set(a["meta"]) <= set(b["meta"])
    assert b["meta"]["endpoint"] == served.url and b["meta"]["served_model"] == served.model
    assert b["meta"]["endpoint_mode"] == "completions" and b["meta"]["server"]["context_limit"] is None
    assert sorted(p.name for p in inproc.iterdir()) == sorted(p.name for p in endpoint.iterdir())
    for cell in sorted((inproc / "cells" / "1024").glob("*.json")):
        ca, cb = json.loads(cell.read_text()), json.loads((endpoint / "cells" / "1024" / cell.name).read_text())
        assert ca.keys() == cb.keys() and ca["stats"].keys() == cb["stats"].keys() and cb["complete"]
        assert cb["identity"]["model"] == {"endpoint": served.url, "served_model": served.model}
        assert cb["identity"]["endpoint_mode"] == "completions" and cb["key"] != ca["key"]
    pred_a, pred_b = inproc / "ruler" / "1024" / "pred", endpoint / "ruler" / "1024" / "pred"
    assert sorted(p.name for p in pred_a.iterdir()) == sorted(p.name for p in pred_b.iterdir())
    for f in pred_a.iterdir():
        assert (pred_b / f.name).read_bytes() == f.read_bytes(), f.name
    (scores_a, csv_a), (scores_b, csv_b) = ruler_evaluate(pred_a), ruler_evaluate(pred_b)
    assert scores_a == scores_b and csv_a == csv_b == (pred_b / "summary.csv").read_text()


def test_chat_mode_generates_from_the_servers_rendering_of_the_prompt(served, tmp_path, capsys):
    """The user message is the prompt without a template of ours; the server wraps it in the model's
    template (no BOS: apply_chat_template adds no special tokens): the in-process runner on that
    rendering, with our renderer of the same template, gives the same text."""
    model = str(served.model_dir)
    out = tmp_path / "chat"
    assert main(["eval", "--endpoint", served.url, "--tokenizer", model, "--endpoint-mode", "chat", "--tasks",
                 "niah_single_1,vt", "--lengths", "1024", "--samples", "1", "--max-new-tokens", "24",
                 "--save-inputs", "--no-progress", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["endpoint_mode"] == "chat" and results["meta"]["chat_template"]["choice"] == "server"
    assert "a chat request is answered" in results["meta"]["server"]["checks"]
    tokenizer = load_tokenizer(model)
    engine = Engine(longctx.load_pretrained(model).eval(), tokenizer, add_bos=False)
    template = render((served.model_dir / "chat_template.jinja").read_text(), {}, "chat_template.jinja",
                      runner_adds_bos=False)
    bos = prepends_bos(tokenizer)  # as our prompts are counted
    # the template's tokens, measured from the server's usage, are what our renderer of it adds
    added = len(tokenizer.encode(template.replace("{input}", "Hello"), add_bos=False))
    assert results["meta"]["server"]["chat_template_tokens"] == added - len(tokenizer.encode("Hello", add_bos=bos))
    for r in results["samples"]:
        assert "<|user|>" not in r["prompt"]  # no template of ours
        sample = Sample(task=r["task"], index=r["index"], input=r["prompt"], answer_prefix="", outputs=r["outputs"],
                        metric=r["metric"], target_length=r["target_length"], max_new_tokens=r["max_new_tokens"],
                        chat_template=template)
        assert engine.complete([sample]) == [r["prediction"]]


def _longctx(args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "longctx", "eval", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def _requests_in(log: Path) -> int:
    return log.read_text().count("POST /v1/completions")


def test_a_killed_server_stops_the_eval_and_the_rerun_sends_only_the_rest(served, tmp_path):
    out = tmp_path / "out"
    args = ["--endpoint", served.url, "--tokenizer", str(served.model_dir), "--tasks", "niah_single_1,vt,fwe",
            "--lengths", "1024", "--samples", "2", "--max-new-tokens", "24", "--concurrency", "2",
            "--retries", "1", "--request-timeout-s", "60", "--no-progress", "--out", str(out)]
    first_cell = out / "cells" / "1024" / "niah_single_1.json"
    proc = _longctx(args)
    deadline = time.monotonic() + 300
    while not first_cell.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first_cell.exists(), proc.communicate()
    served.kill()  # mid-run: the eval's other cells are left
    try:
        _, err = proc.communicate(timeout=120)  # one retry after 1 s, then it stops by itself
    finally:
        proc.kill()
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: the endpoint failed: "), err
    assert "run the same command again once the server answers" in lines[0]
    kept = {p: p.read_bytes() for p in sorted((out / "cells").glob("*/*.json"))}
    complete = [p for p in kept if json.loads(kept[p])["complete"]]
    assert first_cell in complete and len(complete) < 3
    assert not (out / "results.json").exists() and not (out / "PREEMPTED").exists()
    done = sum(len(json.loads(b)["records"]) for b in kept.values())

    restarted = ServedModel(served.model_dir, served.port, log=tmp_path / "serve2.log", extra=BATCHING).start()
    served.proc = restarted.proc  # the module fixture stops it
    proc = _longctx(args)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert f"resuming: {len(complete)} of 3 cells already done in {out}" in err
    assert _requests_in(tmp_path / "serve2.log") == 6 - done  # only the samples not kept
    for p in complete:
        assert p.read_bytes() == kept[p]
    results = json.loads((out / "results.json").read_text())
    assert len(results["samples"]) == 6 and results["meta"]["tasks"] == ["niah_single_1", "vt", "fwe"]
