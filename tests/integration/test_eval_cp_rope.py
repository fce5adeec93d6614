"""Dynamic NTK applied at eval time (model_overrides) under cp=2 (gloo, torchrun): each rank's shard
uses its whole sequence's length, so the greedy outputs and perplexities are one process's."""

import pytest

import longctx
from helpers.eval_cp import assert_same_outputs, eval_one_and_cp2
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
    a, b = eval_one_and_cp2(lambda out: _args(model_dir, out), tmp_path)
    assert a["meta"]["rope_parameters"]["rope_type"] == b["meta"]["rope_parameters"]["rope_type"] == "dynamic"
    assert_same_outputs(a, b, n_samples=2 * 2 * 2, new_tokens=8)
