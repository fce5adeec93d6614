"""Weights & Biases logging in offline mode, checked in the files W&B writes: a run logged, then
resumed (the same run id, steps that continue), the resolved config, an evaluation's table; and
the one error line when wandb is not installed."""
import json
import subprocess
import sys

import longctx
from helpers.train import TINY, env
from helpers.wandb_file import history_steps, read_records
from longctx.commands.cli import main
from longctx.data.hf_tokenizer import TokenizerFiles
from longctx.model.config import get_preset
from longctx.model.llama import build_model

WANDB = ["log.wandb.project=longctx-test", "log.wandb.mode=offline"]


def _env(tmp_path) -> dict:
    """W&B's own settings and caches kept inside the test's directory (test-only switches)."""
    e = env()
    e.update(WANDB_SILENT="true", WANDB_CONFIG_DIR=str(tmp_path / "wb_config"), WANDB_CACHE_DIR=str(tmp_path / "wb"),
             WANDB_DATA_DIR=str(tmp_path / "wb"), WANDB_DISABLE_GIT="true")
    e.pop("WANDB_API_KEY", None)
    e.pop("WANDB_MODE", None)
    return e


def _train(tmp_path, args):
    res = subprocess.run([sys.executable, "-m", "longctx", "train", *args], capture_output=True, text=True,
                         env=_env(tmp_path), cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def _offline_runs(out):
    """W&B's offline run directories under out/wandb, oldest first, with their records."""
    dirs = sorted((out / "wandb").glob("offline-run-*"))
    return [(d, read_records(next(d.glob("run-*.wandb")))) for d in dirs]


def _run_record(records):
    return next(r.run for r in records if r.WhichOneof("record_type") == "run")


def test_a_run_logged_offline_then_resumed_keeps_its_id_and_continues_its_steps(tmp_path):
    out = tmp_path / "run"
    common = [f"out_dir={out}", *TINY, "data.seq_len=128", "checkpoint.every=3", *WANDB]
    _train(tmp_path, [*common, "train.steps=3"])
    run_id = json.loads((out / "wandb_run.json").read_text())["id"]
    _train(tmp_path, [*common, "train.steps=5", "checkpoint.resume=auto"])
    assert json.loads((out / "wandb_run.json").read_text())["id"] == run_id
    (first_dir, first), (second_dir, second) = _offline_runs(out)
    assert first_dir.name.endswith(f"-{run_id}") and second_dir.name.endswith(f"-{run_id}")
    assert _run_record(first).run_id == _run_record(second).run_id == run_id
    assert _run_record(first).project == "longctx-test" and _run_record(first).display_name == "run"
    steps1, steps2 = history_steps(first), history_steps(second)
    assert sorted(steps1) == [1, 2, 3] and sorted(steps2) == [4, 5]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for rec in metrics:  # the scalars TensorBoard gets, at the same steps
        logged = {**steps1, **steps2}[rec["step"]]
        assert logged["train/loss"] == rec["loss"] and logged["train/lr"] == rec["lr"]
    config = {i.key: json.loads(i.value_json) for i in _run_record(first).config.update}
    assert config["train"]["steps"] == 3 and config["log"]["wandb"]["mode"] == "offline"


def test_eval_results_are_a_wandb_table(tmp_path):
    model = tmp_path / "model"
    longctx.save_pretrained(build_model(get_preset("debug-tiny", max_position_embeddings=1024), seed=0), model,
                            tokenizer=TokenizerFiles("byte"))
    out = tmp_path / "eval"
    res = subprocess.run([sys.executable, "-m", "longctx", "eval", "--model", str(model), "--suite", "passkey",
                          "--lengths", "256", "--samples", "2", "--style", "compact", "--max-new-tokens", "4",
                          "--out", str(out), "--no-progress", "--wandb-project", "longctx-test",
                          "--wandb-mode", "offline"], capture_output=True, text=True, env=_env(tmp_path),
                         cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ((run_dir, records),) = _offline_runs(out)
    (logged,) = history_steps(records).values()
    assert logged["eval/results/_type"] == "table-file" and logged["eval/results/nrows"] >= 2
    (table,) = run_dir.glob("files/media/table/eval/results_*.table.json")
    rows = json.loads(table.read_text())
    assert rows["columns"] == ["task", "length", "metric", "value"] and ["passkey", 256, "score"] in [
        r[:3] for r in rows["data"]]


def test_log_wandb_without_the_package_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python marks a module as not importable
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", *WANDB]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: log.wandb: W&B logging is set but the wandb package is not installed; "
                   "pip install 'longctx[wandb]' (or wandb), or leave it unset"]
    assert not out.exists()
    assert main(["eval", "--model", str(tmp_path), "--wandb-project", "p", "--out", str(tmp_path / "e")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: eval.wandb_project: W&B logging is set")
