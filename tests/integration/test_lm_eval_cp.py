"""`longctx eval --lm-eval` under torchrun with --cp 2 (gloo): every loglikelihood, rolling
log-likelihood and generated text of the local lm-eval tasks equals one process's."""
import json
import os
import subprocess
import sys

import pytest

from helpers.lm_eval_tasks import TASKS, write_model, write_tasks
from helpers.train import free_port
from longctx.commands.cli import main

pytest.importorskip("lm_eval")


def _samples(out):
    return {t: [json.loads(x) for x in (out / "lm_eval" / f"samples_{t}.jsonl").read_text().splitlines()]
            for t in TASKS}


def test_cp2_lm_eval_equals_one_process(tmp_path, monkeypatch):
    model, include = write_model(tmp_path / "model"), write_tasks(tmp_path / "tasks")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", HF_DATASETS_OFFLINE="1")

    def args(out):
        return ["-m", "longctx", "eval", "--model", str(model), "--suite", "none", "--lm-eval", ",".join(TASKS),
                "--lm-eval-args", f"include_path={include}", "--batch-size", "3", "--out", str(tmp_path / out),
                "--no-progress"]

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert main(args("one")[2:]) == 0  # one process: in this one
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(free_port()), *args("two")[1:], "--cp", "2"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = _samples(tmp_path / "one"), _samples(tmp_path / "two")
    for task in TASKS:
        assert [s["doc_id"] for s in a[task]] == [s["doc_id"] for s in b[task]] and a[task]
        for x, y in zip(a[task], b[task]):
            if task == "lc_gen":
                assert x["resps"] == y["resps"]
            else:
                for rx, ry in zip(x["resps"], y["resps"]):
                    ll_x, ll_y = (rx[0][0], ry[0][0]) if task == "lc_choice" else (rx[0], ry[0])
                    assert ll_y == pytest.approx(ll_x, rel=1e-5, abs=1e-4)
                    if task == "lc_choice":
                        assert rx[0][1] == ry[0][1]
    results = [json.loads((tmp_path / r / "results.json").read_text()) for r in ("one", "two")]
    assert results[1]["meta"]["cp"] == 2
    scores = [r["lm_eval"]["tasks"]["lc_choice"]["scores"] for r in results]
    assert scores[0] == scores[1]
    assert "## lm-evaluation-harness" in (tmp_path / "two" / "report.md").read_text()
