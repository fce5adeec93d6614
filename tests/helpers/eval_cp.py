"""One `longctx eval` in one process and the same under torchrun with --cp 2 (gloo), and the
check that both gave the same greedy outputs and perplexities."""
import json
import os
import subprocess
import sys

import pytest

from helpers.train import free_port


def eval_one_and_cp2(args_for, tmp_path) -> tuple[dict, dict]:
    """args_for(out_dir) -> the eval arguments; returns both runs' results.json."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    one = subprocess.run([sys.executable, "-m", "longctx", "eval", *args_for(tmp_path / "one")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(free_port()), "-m", "longctx", "eval", "--cp", "2",
                          *args_for(tmp_path / "two")], env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    return tuple(json.loads((tmp_path / run / "results.json").read_text()) for run in ("one", "two"))


def assert_same_outputs(a: dict, b: dict, n_samples: int, new_tokens: int):
    """Sample for sample the same generated ids (each `new_tokens` long, so there is something to
    compare) and prediction; perplexity rows with the same tokens and NLL within 1e-5."""
    assert len(a["samples"]) == len(b["samples"]) == n_samples
    for x, y in zip(a["samples"], b["samples"]):
        assert (x["task"], x["target_length"], x["index"]) == (y["task"], y["target_length"], y["index"])
        assert x["generated_ids"] == y["generated_ids"] and x["prediction"] == y["prediction"]
        assert len(x["generated_ids"]) == new_tokens
    assert len(a["ppl"]["rows"]) == len(b["ppl"]["rows"]) > 0
    for x, y in zip(a["ppl"]["rows"], b["ppl"]["rows"]):
        assert x["tokens"] == y["tokens"]
        assert y["nll"] == pytest.approx(x["nll"], rel=1e-5)
