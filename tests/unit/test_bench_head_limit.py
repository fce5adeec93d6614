"""benchmarks/bench_head_limit.py: the head's limit operation on unit-variance, model-scale and
pretrained weights (pythonpath in pyproject.toml puts benchmarks/ on the import path)."""
from __future__ import annotations

import json

import bench_head_limit
import pytest
import torch
from safetensors.torch import save_file


def test_rows_say_which_inputs_leave_float32s_exp_range(tmp_path, capsys):
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    save_file({"model.embed_tokens.weight": 0.02 * torch.randn(256, 512)}, str(tmp_path / "model.safetensors"))
    out = tmp_path / "head.json"
    assert bench_head_limit.main(["--shapes", "16x512x256", "--threads", "1", "--repeats", "1",
                                  "--init-from", str(tmp_path), "--out", str(out)]) == 0
    rows = {r["inputs"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"unit-variance weights", "model scale (the limit's)", "pretrained head"}
    assert rows["model scale (the limit's)"]["below_normal_share"] == 0.0
    assert rows["pretrained head"]["below_normal_share"] == 0.0
    assert rows["unit-variance weights"]["below_normal_share"] > 0.0  # logits of std sqrt(512)
    assert all(r["best_s"] > 0 for r in rows.values())
    assert "| 16x512x256 | 1 | pretrained head |" in capsys.readouterr().out
    assert torch.get_num_threads() == threads  # the caller's thread count is restored


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "2048x512"], "error: --shapes: cannot read 2048x512; use e.g. 2048x512x32000"),
    (["--threads", "0"], "error: --threads: '0'; use counts >= 1, e.g. 1,2"),
    (["--repeats", "0"], "error: --repeats: must be >= 1, got 0"),
    (["--init-from", "/nonexistent"], "error: --init-from: /nonexistent/model.safetensors does not exist"),
])
def test_bad_input_is_one_error_line(argv, message, capsys):
    assert bench_head_limit.main(argv) == 2
    assert capsys.readouterr().err.strip() == message
