"""A run on synthetic data never imports 🤗 datasets: the lent GPU machines have none, and the
GPU scripts' trainer calls carry no datasets wheel for synthetic data. A `datasets` package that
refuses to import stands first on the path; the run must not notice it."""
import os
import subprocess

from helpers.train import TINY, env, metrics, train_cmd


def test_a_synthetic_zero2_run_does_not_import_datasets(tmp_path):
    shadow = tmp_path / "shadow" / "datasets"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('datasets was imported by a synthetic-data run')\n")
    e = env()
    e["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "shadow"), e.get("PYTHONPATH", "")])
    out = tmp_path / "run"
    res = subprocess.run(train_cmd(1, [*TINY, f"out_dir={out}", "model.preset=debug-tiny", "train.steps=2",
                                       "data.seq_len=256", "parallel.zero_stage=2"]),
                         capture_output=True, text=True, timeout=600, env=e)
    assert res.returncode == 0, res.stderr[-3000:]
    assert [r["step"] for r in metrics(out)] == [1, 2]
    assert "datasets was imported" not in res.stderr
