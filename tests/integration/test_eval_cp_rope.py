"""Dynamic NTK applied at eval time (model_overrides) under cp=2 (gloo, torchrun): each rank's shard
uses its whole sequence's length, so the greedy outputs and perplexities are one process's."""
import json
import os
import subprocess
import sys

import pytest

import longctx
from helpers.train import free_port
from longctx.model import build_model, get_preset

DYNAMIC = "model_overrides.rope_parameters={rope_type: dynamic, factor: 4.0}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpmodel")
    longctx.save_pretrained(build_model(get_preset("debug-tiny", initializer_range=0.2), seed=1), d)  # 256 positions
    return d


def _args(model_dir, out):
    return ["--model", str(model_dir), "--tokenizer", "byte", "--suite", "ppl", "--tasks", "niah_single_1,passkey",
            "--lengths", "512,1024", "--samples", "2", "--style", "compact", "--max-new-tokens", "8",
            "--ppl-windows", "1", "--batch-size", "2", "--out", str(out), "--no-progress", DYNAMIC]


def test_dynamic_ntk_under_cp2_matches_one_process(model_dir, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    one = subprocess.run([sys.executable, "-m", "longctx", "eval", *_args(model_dir, tmp_path / "one")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(free_port()), "-m", "longctx", "eval", "--cp", "2",
                          *_args(model_dir, tmp_path / "two")], env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    a = json.loads((tmp_path / "one" / "results.json").read_text())
    b = json.loads((tmp_path / "two" / "results.json").read_text())
    assert a["meta"]["rope_parameters"]["rope_type"] == b["meta"]["rope_parameters"]["rope_type"] == "dynamic"
    assert len(a["samples"]) == len(b["samples"]) == 2 * 2 * 2
    for x, y in zip(a["samples"], b["samples"]):
        assert (x["task"], x["target_length"], x["index"]) == (y["task"], y["target_length"], y["index"])
        assert x["generated_ids"] == y["generated_ids"]
    for x, y in zip(a["ppl"]["rows"], b["ppl"]["rows"]):
        assert y["nll"] == pytest.approx(x["nll"], rel=1e-5)
