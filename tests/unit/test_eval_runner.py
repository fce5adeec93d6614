"""Runner, outputs and CLI: oracle/constant through the whole pipeline, greedy parity with
transformers, batch invariance, results.json/report.md/PNGs, and one-line user errors."""
import json

import pytest
import torch

import longctx
from longctx.base.errors import UserError
from longctx.commands.cli import main
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.api import evaluate
from longctx.eval.config import EvalConfig
from longctx.eval.runner import Engine
from longctx.eval.tasks import RULER_TASKS, TaskOptions, build_samples
from longctx.model import build_model, get_preset

BYTE = load_tokenizer("byte")


def tiny_model(seed=0, **over):
    cfg = get_preset("debug-tiny", initializer_range=0.2, max_position_embeddings=1024, **over)
    return build_model(cfg, seed=seed).eval()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    longctx.save_pretrained(tiny_model(), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["longctx_tokenizer"] = "byte"  # how an export records the built-in tokenizer
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def qa_opts(tmp_path_factory):
    d = tmp_path_factory.mktemp("qa")
    squad = {"data": [{"title": f"T{j}", "paragraphs": [
        {"context": f"Lake {j}-{i} lies at {j * 10 + i} meters of altitude near the old mill.",
         "qas": [{"question": f"At what altitude is Lake {j}-{i}?", "is_impossible": False,
                  "answers": [{"text": f"{j * 10 + i} meters"}]}]} for i in range(3)]} for j in range(40)]}
    hotpot = [{"question": f"Who built bridge {k}?", "answer": f"Builder{k}",
               "context": [[f"Bridge {k}", [f"Bridge {k} was built by Builder{k}."]],
                           [f"River {k}", [f"River {k} runs under bridge {k}."]]]} for k in range(120)]
    (d / "squad.json").write_text(json.dumps(squad))
    (d / "hotpot.json").write_text(json.dumps(hotpot))
    return {"squad": str(d / "squad.json"), "hotpotqa": str(d / "hotpot.json")}


def test_oracle_100_and_constant_0_through_the_pipeline(tmp_path, qa_opts):
    cfg = EvalConfig(tasks=RULER_TASKS + ["passkey"], lengths=["2048"], samples=2, **qa_opts,
                     out=str(tmp_path / "oracle"), no_progress=True)
    res = evaluate(None, BYTE, cfg, predictor=lambda s: " and ".join(s.outputs))
    assert set(res["summary"]["tasks"]) == set(RULER_TASKS + ["passkey"])
    assert all(t["scores"]["2048"] == 100.0 for t in res["summary"]["tasks"].values())
    assert res["summary"]["effective_length"] == 2048
    cfg = EvalConfig(tasks=RULER_TASKS, lengths=["2048"], samples=2, **qa_opts, out=None, no_progress=True)
    res = evaluate(None, BYTE, cfg, predictor=lambda s: "no idea")
    assert all(t["scores"]["2048"] == 0.0 for t in res["summary"]["tasks"].values())
    assert res["summary"]["effective_length"] == 0


def test_qa_tasks_skip_with_a_message_when_data_is_absent():
    cfg = EvalConfig(tasks=["qa_1", "qa_2", "passkey"], lengths=["1024"], samples=1, out=None, no_progress=True)
    res = evaluate(None, BYTE, cfg, predictor=lambda s: "x")
    assert set(res["summary"]["tasks"]) == {"passkey"}
    assert any("qa_1 skipped" in m for m in res["skipped"]) and any("qa_2 skipped" in m for m in res["skipped"])
    with pytest.raises(UserError, match="nothing to run"):
        evaluate(None, BYTE, EvalConfig(tasks=["qa_1"], lengths=["1024"], samples=1, out=None, no_progress=True),
                 predictor=lambda s: "x")


def test_greedy_matches_transformers_and_is_batch_invariant(model_dir):
    from transformers import LlamaForCausalLM

    model = longctx.load_pretrained(model_dir).eval()
    samples = build_samples("niah_single_1", BYTE, 512, 3, seed=0, options=TaskOptions(style="compact"))
    samples += build_samples("niah_single_1", BYTE, 480, 1, seed=0, options=TaskOptions(style="compact"))
    for s in samples:
        s.max_new_tokens = 10
        s.stop = []
    batched = Engine(model, BYTE, batch_size=4)
    ids = [batched.encode(s.prompt) for s in samples]
    ours = batched.generate_ids(ids, 10)
    single = Engine(model, BYTE, batch_size=1)
    assert ours == [single.generate_ids([i], 10)[0] for i in ids]  # left padding does not leak
    hf = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    for i, o in zip(ids, ours):
        ref = hf.generate(torch.tensor([i]), max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert ref[0, len(i):].tolist() == o
    assert batched.stats["new_tokens"] == 40 and batched.stats["prompt_tokens"] == sum(map(len, ids))


def test_cli_writes_results_report_and_figures(model_dir, tmp_path):
    out = tmp_path / "out"
    rc = main(["eval", "--model", str(model_dir), "--suite", "niah,passkey,ppl", "--lengths", "512,1k",
                    "--samples", "1", "--depths", "0,0.5,1", "--style", "compact", "--out", str(out),
                    "--ppl-windows", "1", "--no-progress"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["summary"]["tasks"]) == {"niah_single_2", "passkey"}
    assert len(res["samples"]) == 2 * 2 * 3  # tasks x lengths x depths
    s = res["samples"][0]
    assert {"task", "target_length", "depth", "prediction", "outputs", "score", "prompt_tokens"} <= set(s)
    grid = res["summary"]["grids"]["niah_single_2"]
    assert grid["depths"] == [0.0, 0.5, 1.0] and grid["lengths"] == [512, 1024]
    assert [r["length"] for r in res["ppl"]["rows"]] == [512, 1024]
    assert all(r["ppl"] > 1 for r in res["ppl"]["rows"])
    report = (out / "report.md").read_text()
    assert "| niah_single_2 | string_match_all |" in report and "## Perplexity vs context length" in report
    for png in ["heatmap_niah_single_2.png", "heatmap_passkey.png", "ppl_vs_length.png", "scores_vs_length.png"]:
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_cli_config_file_form(model_dir, tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"model: {model_dir}\ntasks: passkey\nlengths: [256, 512]\nsamples: 1\nstyle: compact\n"
                   f"out: {tmp_path / 'o'}\nno_progress: true\n")
    assert main(["eval", "--config", str(cfg), "--samples", "2"]) == 0
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert res["summary"]["tasks"]["passkey"]["samples"] == {"256": 2, "512": 2}  # the flag won


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "niah_single_9"], "error: eval.tasks: unknown task 'niah_single_9'"),
    (["--tasks", "niah_multivalue", "--lengths", "300"], "error: eval.lengths: no selected task fits 300 tokens"),
    (["--tasks", "passkey", "--lengths", "2048", "--strict-lengths"],
     "error: eval.lengths: 2048 exceed the model's max_position_embeddings=1024"),
    (["--tasks", "passkey", "--cp", "2"], "error: eval.cp=2 needs 2 processes"),
    (["--tasks", "passkey", "--lengths", "4x"], "error: eval.lengths: '4x' is not a length"),
    (["--suite", "longbench"], "error: eval.suite: unknown suite 'longbench'"),
])
def test_cli_bad_input_is_one_clear_error(model_dir, tmp_path, capsys, argv, message):
    rc = main(["eval", "--model", str(model_dir), "--out", str(tmp_path / "x"), "--no-progress", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith(message), err


def test_cli_missing_model_and_vocab_mismatch(tmp_path, capsys):
    assert main(["eval", "--model", str(tmp_path / "nope"), "--tasks", "passkey"]) == 2
    assert "model path does not exist" in capsys.readouterr().err
    small = tmp_path / "small"
    longctx.save_pretrained(tiny_model(vocab_size=200), small)
    assert main(["eval", "--model", str(small), "--tokenizer", "byte", "--tasks", "passkey"]) == 2
    err = capsys.readouterr().err
    assert "vocab_size 259" in err and "vocab_size is 200" in err
    assert main(["eval", "--model", str(small), "--tasks", "passkey"]) == 2  # no tokenizer recorded
    assert "has no tokenizer files; pass --tokenizer" in capsys.readouterr().err


def test_lengths_above_max_warn_and_still_run(model_dir, tmp_path, capsys):
    rc = main(["eval", "--model", str(model_dir), "--tasks", "passkey", "--lengths", "2k", "--samples", "1",
                    "--style", "compact", "--out", str(tmp_path / "w"), "--no-progress"])
    assert rc == 0
    assert "warning: eval.lengths: 2048 exceed the model's max_position_embeddings=1024" in capsys.readouterr().err
    res = json.loads((tmp_path / "w" / "results.json").read_text())
    assert res["warnings"] and res["summary"]["tasks"]["passkey"]["samples"] == {"2048": 1}


def test_run_directory_with_hf_export_is_accepted(model_dir, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(model_dir, run / "hf")
    assert main(["eval", "--model", str(run), "--tasks", "passkey", "--lengths", "256", "--samples", "1",
                      "--style", "compact", "--out", str(tmp_path / "r"), "--no-progress"]) == 0
