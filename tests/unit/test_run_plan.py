"""The run plan (config/run_plan.py): validate_config derives the stages, their model configs,
init_from's architecture (config.json read once) and the parsed DeepSpeed JSON once; a stage's
errors name the stage's own fields, raised where each field is checked."""
from __future__ import annotations

import json

import pytest

from longctx.base.errors import UserError
from longctx.config import load_config, trim_multiple, validate_config
from longctx.config import stages as stages_module
from longctx.model import get_preset
from longctx.model.hf import save_pretrained
from longctx.model.llama import build_model
from longctx.parallel.zero import deepspeed_config
from longctx.train.build import deepspeed_config_for

STAGED = ["model.preset=debug-tiny", "stages=[{seq_len: 128, steps: 1}, {seq_len: 256, steps: 1, cp_size: 2}]"]


def _error(overrides, world=2) -> str:
    with pytest.raises(UserError) as e:
        validate_config(load_config(None, overrides), world)
    return str(e.value)


def test_the_plan_holds_each_stage_with_its_model_config_and_trim_multiple(tmp_path):
    plan = validate_config(load_config(None, STAGED + [f"out_dir={tmp_path}/run"]), 2)
    assert [s.seq_len for s in plan.stages] == [128, 256]
    assert [m.max_position_embeddings for m in plan.model_configs] == [256, 256]
    assert plan.origin == get_preset("debug-tiny") and plan.deepspeed is None
    assert (plan.world_size, plan.files) == (2, True)
    assert [plan.trim_multiple(i) for i in (0, 1)] == [64, 64] and trim_multiple(48) == 192


def test_init_from_config_json_is_read_once_per_validation(tmp_path, monkeypatch):
    save_pretrained(build_model(get_preset("debug-tiny"), seed=0), tmp_path / "hf")
    reads = []
    real = stages_module.read_model_config
    monkeypatch.setattr(stages_module, "read_model_config", lambda path, *a: reads.append(path) or real(path, *a))
    plan = validate_config(load_config(None, STAGED + [f"model.init_from={tmp_path}/hf", f"out_dir={tmp_path}/r"]), 2)
    assert len(reads) == 1 and len(plan.model_configs) == 2


def test_the_deepspeed_json_is_parsed_once_and_merged_from_the_plan(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 1, "reduce_bucket_size": 1234}}))
    cfg = load_config(None, ["model.preset=debug-tiny", "parallel.zero_stage=1", f"parallel.deepspeed_config={ds}",
                             f"out_dir={tmp_path}/run"])
    plan = validate_config(cfg, 1)
    ds.unlink()  # the engine config comes from the plan, not the file
    merged = deepspeed_config_for(cfg, 1, plan.deepspeed)
    assert merged["zero_optimization"]["reduce_bucket_size"] == 1234
    assert merged == deepspeed_config(zero_stage=1, micro_batch_size=cfg.data.micro_batch_size, grad_accum=1,
                                      world_size=1, dtype="float32", grad_clip=1.0, user=plan.deepspeed)


@pytest.mark.parametrize("overrides, message", [
    (["stages=[{seq_len: 254, steps: 1, cp_size: 2}]"],
     "stages[0].seq_len=254 must be divisible by 2*stages[0].cp_size=4 for the zigzag CP layout"),
    (["data.seq_len=254", "parallel.cp_size=2"],
     "data.seq_len=254 must be divisible by 2*parallel.cp_size=4 for the zigzag CP layout"),
    (["stages=[{seq_len: 128, steps: 1, cp_size: 2}]", "parallel.cp_impl=hybrid", "parallel.ulysses_size=4"],
     "parallel.ulysses_size=4 must divide stages[0].cp_size=2 for cp_impl hybrid"),
    (["stages=[{seq_len: 128, steps: 1}, {seq_len: 256, steps: 1, rope_parameters: {rope_type: nope}}]"],
     "stages[1].rope_parameters.rope_type: unknown 'nope'"),
    (["model.rope_parameters={rope_type: nope}"], "model.rope_parameters.rope_type: unknown 'nope'"),
    (["stages=[{seq_len: 128, steps: 1, sources: []}]"], "stages[0].sources: empty; give at least one source"),
    (["stages=[{seq_len: 128, steps: 1, sources: [{kind: synthetic, weight: 0}]}]"],
     "stages[0].sources[*].weight: mixture weights must sum to a positive number"),
    (["stages=[{seq_len: 128, steps: 1, sources: [{path: /nonexistent/x.jsonl}]}]"],
     "stages[0].sources[0].path: /nonexistent/x.jsonl does not exist"),
])
def test_a_stage_error_names_the_field_the_user_sets(overrides, message, tmp_path):
    assert _error(["model.preset=debug-tiny", f"out_dir={tmp_path}/run"] + overrides).startswith(message)
