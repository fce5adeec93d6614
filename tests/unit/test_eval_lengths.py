"""`longctx eval` at lengths below some tasks' minimum: the defaults run (the cells that cannot fit
are skipped with one notice naming them and a length that fits), nothing left to run is one
error naming the lengths that would work, and every length / style hint works when followed."""
import json
import re

import pytest

import longctx
from longctx.base.errors import UserError
from longctx.commands.cli import main
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.api import evaluate
from longctx.eval.config import EvalConfig
from longctx.eval.tasks import RULER_TASKS, BelowMinimum, TaskOptions, build_samples
from longctx.model import build_model, get_preset

BYTE = load_tokenizer("byte")
COMPACT = TaskOptions(style="compact")
NOTICE = "skipped, below the task's minimum length with this tokenizer: "


def oracle(sample):
    return " ".join(sample.outputs)


def _fits(message: str) -> int:
    return int(re.search(r"lengths=(\d+)", message).group(1))


def test_the_defaults_run_every_task_that_fits_and_skip_cwe_with_one_notice():
    res = evaluate(None, BYTE, EvalConfig(model="unused", out=None, no_progress=True), predictor=oracle)
    notices = [s for s in res["skipped"] if s.startswith(NOTICE)]
    assert len(notices) == 1
    need = int(re.fullmatch(NOTICE + r"cwe at 4096 \(needs (\d+)\)", notices[0]).group(1))
    assert set(res["summary"]["tasks"]) == set(RULER_TASKS) - {"cwe", "qa_1", "qa_2"}
    assert all(t["scores"]["4096"] == 100.0 for t in res["summary"]["tasks"].values())
    # the length the notice names fits cwe
    res = evaluate(None, BYTE, EvalConfig(tasks=["cwe"], lengths=[str(need)], samples=10, out=None, no_progress=True),
                   predictor=oracle)
    assert res["summary"]["tasks"]["cwe"]["scores"][str(need)] == 100.0 and not res["skipped"]


def test_a_cell_below_its_minimum_names_a_length_that_fits_and_compact_when_it_fits():
    with pytest.raises(BelowMinimum) as e:
        build_samples("niah_single_1", BYTE, 300, 3)
    msg = str(e.value)
    assert msg.startswith("eval.lengths: 300 is below the minimum of task niah_single_1") and "or style=compact" in msg
    assert len(build_samples("niah_single_1", BYTE, _fits(msg), 3)) == 3  # lengths=N
    assert len(build_samples("niah_single_1", BYTE, 300, 3, options=COMPACT)) == 3  # or style=compact
    # compact style does not shorten cwe: its error does not suggest it
    with pytest.raises(BelowMinimum) as e:
        build_samples("cwe", BYTE, 4096, 2)
    assert "style=compact" not in str(e.value) and e.value.fits > 4096
    assert len(build_samples("cwe", BYTE, _fits(str(e.value)), 2)) == 2
    with pytest.raises(BelowMinimum):
        build_samples("cwe", BYTE, 4096, 2, options=COMPACT)


def test_nothing_left_to_run_names_the_lengths_that_work_and_each_hint_runs():
    cfg = dict(lengths=["256"], samples=2, out=None, no_progress=True)
    with pytest.raises(UserError) as e:
        evaluate(None, BYTE, EvalConfig(**cfg), predictor=oracle)
    msg = str(e.value)
    assert msg.startswith("eval.lengths: no selected task fits 256 tokens with this tokenizer (lengths that fit: ")
    first, task = re.search(r"use longer lengths \(lengths=(\d+) runs (\w+)\)", msg).groups()
    res = evaluate(None, BYTE, EvalConfig(**dict(cfg, lengths=[first])), predictor=oracle)
    assert task in res["summary"]["tasks"]
    compact = re.search(r"or style=compact \(fits ([\w, ]+)\)", msg).group(1).split(", ")
    res = evaluate(None, BYTE, EvalConfig(**cfg, style="compact"), predictor=oracle)
    assert sorted(res["summary"]["tasks"]) == sorted(compact)
    # every task's own length in the list fits it
    for name, length in re.findall(r"(\w+) (\d+)", msg.split("lengths that fit: ")[1].split(")")[0]):
        assert build_samples(name, BYTE, int(length), 2)


def test_perplexity_alone_still_runs_when_every_task_is_skipped():
    cfg = EvalConfig(tasks=["cwe"], suite=["ruler", "ppl"], lengths=["512"], samples=1, out=None, no_progress=True)
    res = evaluate(build_model(get_preset("debug-tiny", max_position_embeddings=512), seed=0).eval(), BYTE, cfg,
                   predictor=oracle)
    assert res["records"] == [] and [r["length"] for r in res["ppl"]["rows"]] == [512]
    assert any(s.startswith(NOTICE + "cwe at 512") for s in res["skipped"])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    longctx.save_pretrained(build_model(get_preset("debug-tiny", max_position_embeddings=1024), seed=0).eval(), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["longctx_tokenizer"] = "byte"
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_the_cli_with_default_tasks_and_lengths_runs_and_prints_one_notice(model_dir, tmp_path, capsys):
    """`longctx eval --model DIR`: the suite and lengths as shipped (one sample, two new tokens
    to keep the test short)."""
    out = tmp_path / "out"
    assert main(["eval", "--model", str(model_dir), "--samples", "1", "--max-new-tokens", "2", "--out", str(out),
                 "--no-progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len([line for line in err if line.startswith(NOTICE)]) == 1
    res = json.loads((out / "results.json").read_text())
    assert set(res["summary"]["tasks"]) == set(RULER_TASKS) - {"cwe", "qa_1", "qa_2"}


def test_the_cli_error_when_nothing_fits_and_following_its_hint(model_dir, tmp_path, capsys):
    argv = ["eval", "--model", str(model_dir), "--tasks", "niah_single_1", "--samples", "1", "--max-new-tokens", "2",
            "--no-progress", "--out", str(tmp_path / "o")]
    assert main([*argv, "--lengths", "300"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: eval.lengths: no selected task fits 300 tokens")
    assert "or style=compact (fits niah_single_1)" in err[0]
    assert main([*argv, "--lengths", "300", "style=compact"]) == 0
    assert main([*argv, f"lengths={_fits(err[0])}"]) == 0
