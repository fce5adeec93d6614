"""`longctx train` on the transformers path, end to end: a mixture-of-experts model (Qwen3-MoE)
and a windowed, softcapped one (Gemma 2) at cp 2 under ZeRO-3 give one process's losses (and
MoE load-balancing loss), resume on the same and on another layout with every step logged once,
and export as their own transformers class with the trained weights."""
import json

import pytest
import torch

from helpers.auto_models import save_tiny_hf
from helpers.train import TINY, metrics, run_train

pytestmark = pytest.mark.slow
REL = 2e-4  # fp32; ZeRO-3's reductions and the cp split change the summation order


def _base(model_dir, out, steps):
    return [f"model.init_from={model_dir}", f"out_dir={out}", "data.seq_len=128", f"train.steps={steps}",
            "optim.schedule=constant", "optim.warmup_steps=0", "optim.lr=3e-3", "checkpoint.every=2",
            "data.sources=[{name: s, kind: synthetic, synthetic: {length_min: 24, length_max: 90, style: short, "
            "tasks: {passkey: 1.0}, seed: 1}}]", *TINY]


def _ok(res):
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _close(a, b, what):
    assert len(a) == len(b), (what, a, b)
    for x, y in zip(a, b):
        assert abs(x - y) <= REL * abs(y), (what, a, b)


@pytest.mark.parametrize("model_type, impl, other_layout", [("qwen3_moe", "ulysses", True), ("gemma2", "ring", False)])
def test_train_cp2_zero3_resume_and_export(tmp_path, model_type, impl, other_layout):
    model_dir = save_tiny_hf(model_type, tmp_path / "base")
    one = tmp_path / "one"
    res = _ok(run_train(1, _base(model_dir, one, 4)))
    assert "model path: transformers" in res.stderr and model_type in res.stderr
    ref = metrics(one)
    cp = ["parallel.cp_size=2", f"parallel.cp_impl={impl}", "parallel.zero_stage=3"]
    two = tmp_path / "two"
    _ok(run_train(2, [*_base(model_dir, two, 2), *cp]))
    # resumed at step 2, with the HF export at the end
    _ok(run_train(2, [*_base(model_dir, two, 4), *cp, "checkpoint.resume=auto", "checkpoint.export_hf=true"]))
    got = metrics(two)
    steps = [json.loads(line)["step"] for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # each step logged once across the resume
    _close([r["loss"] for r in got], [r["loss"] for r in ref], "loss")
    if model_type == "qwen3_moe":  # the load-balancing loss of the whole sequence: the layout must not change it
        _close([r["moe_aux_loss"] for r in got], [r["moe_aux_loss"] for r in ref], "moe_aux_loss")
    else:
        assert "moe_aux_loss" not in got[0]

    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(str(two / "hf"), dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    assert type(exported) is type(base)
    moved = [n for n, p in exported.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert moved, "the export holds the trained weights"
    if other_layout:  # resume on another layout: the step-4 checkpoint continues in one process
        _ok(run_train(1, [*_base(model_dir, two, 5), "checkpoint.resume=auto"]))
        assert [r["step"] for r in metrics(two)] == [1, 2, 3, 4, 5]
