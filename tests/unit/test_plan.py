"""Memory planner: exact model-state accounting, policies move memory where they should, advice
is minimal, the CLI reports a breakdown (the dry run and the real run are in
tests/integration/test_plan_runs.py)."""
import argparse
import dataclasses
import json
import shlex
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers.memory import held_bytes
from helpers.recipes import CPU_RECIPES, RECIPES, cluster
from longctx.attention import sdpa as sdpa_module
from longctx.base.errors import UserError
from longctx.commands import cli
from longctx.config import load_config, resolve_stages, stage_model_config
from longctx.model import build_model, count_parameters, get_preset
from longctx.plan import (
    GPU_USABLE,
    GiB,
    estimate_layout,
    estimate_memory,
    format_estimate,
    layout_of,
    parameter_counts,
    parse_length,
    parse_size,
    relative_time_per_token,
)
from longctx.plan.activations import DOCUMENT_GROUP_TOKENS, activation_bytes

ROOT = Path(__file__).resolve().parents[2]


def _layout(preset="llama2-7b", **kw):
    overrides = [f"model.preset={preset}", "data.micro_batch_size=1", *[f"{k}={v}" for k, v in kw.items()]]
    cfg = load_config(None, overrides)
    stage = resolve_stages(cfg)[0]
    return cfg, stage, stage_model_config(stage)


@pytest.mark.parametrize("preset", ["debug-tiny", "bench-44m", "llama2-7b", "llama3-8b"])
def test_parameter_counts_match_the_model(preset):
    cfg = get_preset(preset)
    assert parameter_counts(cfg)["total"] == count_parameters(build_model(cfg, device="meta"))


def test_parameter_counts_tied_and_biased():
    cfg = get_preset("debug-tiny").replace(tie_word_embeddings=True, attention_bias=True, mlp_bias=True)
    assert parameter_counts(cfg)["total"] == count_parameters(build_model(cfg, device="meta"))


def test_model_states_follow_zero_accounting():
    """bf16 mixed precision: 2 bytes params, 2 grads, 12 optimizer (fp32 master + Adam m, v),
    sharded by ZeRO stage over all W ranks; the values are exact (not fitted)."""
    P = parameter_counts(get_preset("llama2-7b"))["total"]
    W = 64
    cfg, stage, m = _layout(**{"train.dtype": "bfloat16", "data.seq_len": 4096})

    def states(z, **extra):
        st = dataclasses.replace(stage, parallel=dataclasses.replace(stage.parallel, zero_stage=z, **extra))
        e = estimate_memory(cfg, st, m, W)
        phase = e.phases  # the step phase holds all states
        return e, phase

    e0, _ = states(0)
    # at the step: 12 (fp32 master + Adam m, v) + 4 (AdamW's sqrt(v) temporary); bf16 grads + fp32 ones
    assert e0.parameters == 2 * P and e0.optimizer == 16 * P and e0.gradients == 6 * P
    e3, _ = states(3)
    lay3 = layout_of(cfg, dataclasses.replace(stage, parallel=dataclasses.replace(stage.parallel, zero_stage=3)), W)
    est3 = estimate_layout(m, lay3)
    part = -(-P // W)
    assert est3.optimizer == 12 * part  # master + Adam, partitioned
    # every stage strictly reduces the peak for a large world size
    peaks = [states(z)[0].peak for z in (0, 1, 2, 3)]
    assert peaks[0] > peaks[2] > peaks[3], peaks
    # optimizer offload moves master weights and Adam states to the host
    off, _ = states(3, offload_optimizer=True)
    assert off.optimizer == 0 and off.host >= 12 * part
    offp, _ = states(3, offload_optimizer=True, offload_params=True)
    assert offp.host > off.host and offp.peak < off.peak


def test_activation_policies_and_cp_scale_activations():
    def act(**kw):
        cfg, stage, m = _layout(**{"train.dtype": "bfloat16", "data.seq_len": 32768, **kw})
        lay = layout_of(cfg, stage, 8)
        return estimate_layout(m, lay)

    none, sel, full = (act(**{"parallel.activation_checkpointing": p}) for p in ("none", "selective", "full"))
    assert none.peak > sel.peak > full.peak
    assert none.activations > 3 * full.activations
    cp1, cp2, cp4 = (act(**{"parallel.cp_size": c}) for c in (1, 2, 4))
    assert cp1.info["tokens_per_rank"] == 2 * cp2.info["tokens_per_rank"] == 4 * cp4.info["tokens_per_rank"]
    # activations are linear in the local length: halving it halves them (within the shared terms)
    assert cp2.activations == pytest.approx(cp1.activations / 2, rel=0.02)


def _document_runs_extra_copies() -> float:
    """Measured: what the per-document SDPA calls (sdpa_module.document_runs_attention) leave
    held after the forward beyond one whole causal call over the same packed row (what a
    variable-length kernel holds), in copies of the attention output. Small CPU shapes, two
    documents each long enough for a call of its own."""
    B, H, T, D = 1, 6, 96, 8
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    seg = torch.tensor([[0] * 40 + [1] * 56])
    whole = held_bytes(F.scaled_dot_product_attention, q, k, v, is_causal=True)
    runs = held_bytes(sdpa_module.document_runs_attention, q, k, v, seg, group_tokens=16)
    return (runs - whole) / (B * H * T * D * 4)


def test_sdpa_on_a_gpu_plans_one_call_per_document():
    """sdpa on a GPU (no cp) runs a causal SDPA call per long document and a masked one per group
    of short documents: no T x T mask, the calls' outputs beside the whole one, so it plans
    within a few local-activation copies of a variable-length kernel (what auto plans for)."""
    def act(backend, masking=True, cp=1):
        cfg, stage, m = _layout(preset="smollm2-135m", **{"train.dtype": "bfloat16", "data.seq_len": 32768,
                                                           "parallel.attention_backend": backend,
                                                           "parallel.activation_checkpointing": "full",
                                                           "parallel.cp_size": cp})
        return activation_bytes(m, layout_of(cfg, stage, cp), "gpu", document_masking=masking)

    flash, sdpa, one_doc = act("auto"), act("sdpa"), act("sdpa", masking=False)
    out_bytes = 32768 * 576 * 2  # one bf16 attention output of a layer (T, Hq * D)
    assert DOCUMENT_GROUP_TOKENS == sdpa_module.DOCUMENT_GROUP_TOKENS
    assert sdpa["attn_fwd"] - flash["attn_fwd"] == _document_runs_extra_copies() * out_bytes
    assert sdpa["attn_bwd"] > flash["attn_bwd"]  # the calls' gradients beside the whole ones
    group_mask = sdpa_module.build_mask(DOCUMENT_GROUP_TOKENS, DOCUMENT_GROUP_TOKENS, causal=True,
                                        segment_ids=torch.zeros(1, DOCUMENT_GROUP_TOKENS, dtype=torch.long),
                                        kv_segment_ids=None, device="cpu")
    assert group_mask.nbytes <= sdpa["mask"] < 32768**2 // 100  # a short-document group's, no (T, T) mask
    assert one_doc == flash  # one document per row: one plain call
    assert act("sdpa", cp=2)["mask"] > 0  # with cp: the tiled block kernel and its mask tiles


def test_a_gpu_plan_with_auto_says_what_it_assumes(capsys):
    assert cli.main(["plan", "--gpus", "1", "model.preset=smollm2-135m", "data.seq_len=32768"]) == 0
    assert "note: parallel.attention_backend auto plans for a variable-length kernel" in \
        capsys.readouterr().out
    assert cli.main(["plan", "--gpus", "1", "model.preset=smollm2-135m", "parallel.attention_backend=sdpa"]) == 0
    assert "variable-length" not in capsys.readouterr().out


def test_mlp_tiles_shrink_the_mlp_backward_and_cost_one_mlp_forward():
    def plan(tile):
        cfg, stage, m = _layout(**{"train.dtype": "bfloat16", "data.seq_len": 131072, "parallel.cp_size": 8,
                                   "parallel.activation_checkpointing": "full", "parallel.zero_stage": 2,
                                   "parallel.mlp_tile_tokens": tile})
        lay = layout_of(cfg, stage, 8)
        return m, lay, estimate_layout(m, lay)

    m, whole_lay, whole = plan(0)
    _, tiled_lay, tiled = plan(2048)
    assert whole.phase == "backward_mlp" and tiled.peak < whole.peak
    assert relative_time_per_token(m, tiled_lay) > relative_time_per_token(m, whole_lay)


def test_mlp_tiles_save_what_the_untiled_backward_holds_by_hand():
    """debug-tiny (intermediate size f = 160), 1024 tokens on one rank, bf16, full checkpointing,
    tiles of 256. The untiled MLP backward holds, for every token, the 4 recomputed activations of
    f elements (gate, its silu, up, their product) and 3 gradient temporaries of f elements; the
    tiled one holds those 7 for one tile only: 2 bytes x 7 x 160 x (1024 - 256) = 1,720,320 bytes."""
    cfg, stage, m = _layout("debug-tiny", **{"train.dtype": "bfloat16", "data.seq_len": 256,
                                             "parallel.activation_checkpointing": "full"})
    assert m.intermediate_size == 160
    whole_lay = dataclasses.replace(layout_of(cfg, stage, 1), seq_len=1024)
    whole = estimate_layout(m, whole_lay)
    tiled = estimate_layout(m, dataclasses.replace(whole_lay, mlp_tile_tokens=256))
    assert whole.phases["backward_mlp"] - tiled.phases["backward_mlp"] == 1_720_320
    # under full checkpointing no block keeps MLP activations: the other phases do not change
    assert {k: v for k, v in whole.phases.items() if k != "backward_mlp"} == \
        {k: v for k, v in tiled.phases.items() if k != "backward_mlp"}


def test_peak_is_the_largest_phase_and_names_it():
    cfg, stage, m = _layout(**{"data.seq_len": 8192, "parallel.zero_stage": 2})
    est = estimate_memory(cfg, stage, m, 4, device="cpu", runtime_overhead_gb=0.4)
    assert len(est.phases) >= 4 and len(set(est.phases.values())) > 1  # phases that differ
    assert est.phases[est.phase] == max(est.phases.values())
    assert est.peak == pytest.approx(est.phases[est.phase])  # the components are that phase's
    assert est.runtime == pytest.approx(0.4 * GiB)


def test_format_estimate_lists_every_component_and_the_verdict():
    cfg, stage, m = _layout(**{"data.seq_len": 8192})
    est = estimate_memory(cfg, stage, m, 8)
    text = format_estimate(est, 80 * GiB)
    for label in ("parameters", "gradients", "optimizer states", "activations", "attention workspace",
                  "loss workspace", "communication buffers", "runtime", "total (peak)"):
        assert label in text
    assert ("fits in 80 GiB" in text) == est.fits(80 * GiB)
    assert "does NOT fit in 1 GiB" in format_estimate(est, 1 * GiB)


def test_parse_size_and_length():
    assert parse_size("80GB") == parse_size("80GiB") == parse_size("80") == 80 * GiB
    assert parse_size("512MB") == 512 * 2**20
    assert parse_length("128k") == 131072 and parse_length("4096") == 4096
    for bad in ("eighty", "-3GB", "0"):
        with pytest.raises(UserError):
            parse_size(bad)
    with pytest.raises(UserError):
        parse_length("long")


def _run_plan(argv):
    from longctx.commands import plan

    p = argparse.ArgumentParser()
    plan.add_parser(p)
    return plan.run(p.parse_args(argv))


def test_plan_cli_json_advice_is_the_fastest_layout_that_fits(capsys):
    rc = _run_plan(["--json", "--gpus", "8", "--gpu-mem", "80GB", "model.preset=llama3-8b",
                    "train.dtype=bfloat16", "data.seq_len=131072", "data.micro_batch_size=1"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    options = report["advice"]["options"]
    best = report["advice"]["recommended"]
    assert [o["cp_size"] for o in options] == [1, 2, 4, 8]
    assert best is not None and best["fits"] and best["peak_gib"] <= 80 * GPU_USABLE
    assert not best["offload_optimizer"]  # offload only when nothing else fits
    fitting = [o for o in options if o["fits"] and not o["offload_optimizer"]]
    assert all(best["relative_time_per_token"] <= o["relative_time_per_token"] for o in fitting)
    # within that cp, every option predicted faster does not fit
    cfg = load_config(None, ["model.preset=llama3-8b", "train.dtype=bfloat16", "data.seq_len=131072",
                             "data.micro_batch_size=1"])
    stage = resolve_stages(cfg)[0]
    m = stage_model_config(stage)
    base = dataclasses.replace(layout_of(cfg, stage, 8), cp_size=best["cp_size"])
    for z in range(4):
        for ac in ("none", "selective", "full"):
            lay = dataclasses.replace(base, zero_stage=z, activation_checkpointing=ac)
            if relative_time_per_token(m, lay) < best["relative_time_per_token"] - 1e-3:
                assert not estimate_layout(m, lay).fits(80 * GiB), (z, ac)
    assert report["stages"][0]["components_gib"]["activations"] > 0


def test_plan_cli_text_for_a_recipe_and_nothing_fits(capsys):
    rc = _run_plan(["--config", str(ROOT / "configs/yarn-llama2-7b-128k.yaml")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "--gpus 64 from the config's '# cluster:' line" in out
    assert "architecture from model.preset=llama2-7b" in out
    assert out.count("memory per GPU") == 2 and "recommended: parallel.cp_size=" in out
    rc = _run_plan(["--gpus", "1", "--gpu-mem", "24GB", "--check", "model.preset=llama3-8b", "data.seq_len=131072",
                    "train.dtype=bfloat16"])
    out = capsys.readouterr().out
    assert rc == 3 and "nothing fits 131,072 tokens on 1 GPUs" in out and "does NOT fit" in out


def test_plan_cli_bad_input():
    with pytest.raises(UserError, match="--gpu-mem"):
        _run_plan(["--gpu-mem", "lots"])
    with pytest.raises(UserError, match="--gpus: must be >= 1"):
        _run_plan(["--gpus", "0"])


def test_plan_refuses_a_length_the_zigzag_layout_cannot_split(capsys):
    """The trainer's length rule (a multiple of 2 x cp) holds in the plan too, naming the stage's fields."""
    with pytest.raises(UserError, match=r"^data.seq_len=30004 must be divisible by 2\*parallel.cp_size=8 .*"
                                        r"valid nearby: 30000, 30008"):
        _run_plan(["--gpus", "8", "model.preset=debug-tiny", "data.seq_len=30004", "parallel.cp_size=4"])
    with pytest.raises(UserError, match=r"^stages\[1\].seq_len=1000 must be divisible by 2\*stages\[1\].cp_size=16"):
        _run_plan(["--gpus", "8", "model.preset=debug-tiny",
                   "stages=[{seq_len: 1024, steps: 1}, {seq_len: 1000, steps: 1, cp_size: 8}]"])
    assert capsys.readouterr().out == ""  # refused before any estimate is printed


def test_plan_recipe_on_fewer_gpus_than_a_stage_needs(capsys):
    """The 128k stage of the Llama 3 recipe uses cp 16: on 8 GPUs it is reported, and the advice
    answers the question for 8 GPUs anyway."""
    rc = _run_plan(["--config", str(ROOT / "configs/llama3-8b-128k.yaml"), "--gpus", "8", "--gpu-mem", "80GB",
                    "--check"])
    out = capsys.readouterr().out
    assert rc == 3
    assert "stage 3 (128k): seq_len 131,072: stages[3].cp_size=16 does not divide --gpus 8" in out
    assert out.count("memory per GPU") == 3
    assert "advice for seq_len 131,072 on 8 x 80 GiB" in out and "recommended: parallel.cp_size=" in out


def test_plan_through_the_cli_entry_point(capsys):
    """`longctx plan` as the CLI runs it."""
    assert cli.main(["plan", "--gpus", "8", "model.preset=llama2-7b", "data.seq_len=32768"]) == 0
    assert "recommended: parallel.cp_size=" in capsys.readouterr().out
    assert cli.main(["plan", "--gpu-mem", "lots"]) == 2
    assert capsys.readouterr().err.strip() == "error: --gpu-mem: cannot read 'lots'; use e.g. 80GB, 141GB or 24GiB"


def _doc_commands():
    """The `longctx plan` / `longctx train --dry-run` lines of docs/plan.md's code blocks."""
    text = (ROOT / "docs" / "plan.md").read_text()
    blocks = text.split("```")[1::2]
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith(("longctx plan", "longctx train"))]


@pytest.mark.parametrize("argv", _doc_commands(), ids=lambda a: " ".join(a)[:60])
def test_every_example_in_the_docs_gives_a_plan(argv, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    if argv[0] == "train":
        assert "total (peak)" in out
    elif "--json" in argv:
        assert json.loads(out)["advice"]["recommended"] is not None
    else:
        recommended = [line for line in out.splitlines() if line.startswith("recommended:")]
        assert len(recommended) == 1, out[-2000:]
        print(" ".join(argv), "->", recommended[0])


def test_the_recommendation_prefers_no_offload_and_the_faster_layout():
    from longctx.plan.advice import recommend

    rows = [{"cp_size": 2, "fits": True, "offload_optimizer": True, "relative_time_per_token": 1.38},
            {"cp_size": 4, "fits": True, "offload_optimizer": False, "relative_time_per_token": 1.10},
            {"cp_size": 8, "fits": True, "offload_optimizer": False, "relative_time_per_token": 1.10},
            {"cp_size": 1, "fits": False, "offload_optimizer": False, "relative_time_per_token": 1.0}]
    assert recommend(rows)["cp_size"] == 4
    assert recommend(rows[:1])["cp_size"] == 2  # offload when nothing else fits
    assert recommend(rows[3:]) is None


def _stage_totals(text: str) -> list[str]:
    return [line.split()[-2] for line in text.splitlines() if line.strip().startswith("total (peak)")]


@pytest.mark.parametrize("name", [f"cpu/{n}" for n in CPU_RECIPES] + RECIPES)
def test_the_dry_run_and_plan_give_the_same_estimate_for_the_configs_device(name, capsys, monkeypatch):
    """CPU recipes (device=cpu in their cluster line): host memory per process in both, the
    same totals; the full recipes: per GPU in both (whatever this machine has)."""
    from longctx.train.dry_run import dry_run

    monkeypatch.chdir(ROOT)
    path = str(ROOT / "configs" / name)
    cfg = load_config(path)
    shape = cluster(Path(path))
    world = int(shape["nodes"]) * int(shape["gpus_per_node"])
    assert _run_plan(["--config", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == ("cpu" if name.startswith("cpu/") else "gpu")
    assert _run_plan(["--config", path]) == 0
    plan_text = capsys.readouterr().out
    dry = dry_run(cfg, world, path)
    what = "host memory per process" if name.startswith("cpu/") else "memory per GPU"
    stages = resolve_stages(cfg)
    def heads(text):
        return [line for line in text.splitlines() if line.startswith("  " + what)]
    assert len(heads(dry)) == len(heads(plan_text)) == len(stages)
    assert _stage_totals(dry) == _stage_totals(plan_text) == [f"{s['peak_gib']:.2f}" for s in report["stages"]]
    if name.startswith("cpu/"):  # one process of a tiny model: the runtime constant and little else
        assert all(s["peak_gib"] < 1.0 for s in report["stages"])


def test_a_dry_run_without_a_cluster_line_plans_this_machine(tmp_path):
    from longctx.train.dry_run import dry_run

    cfg = load_config(None, ["model.preset=debug-tiny", "data.seq_len=256"])
    text = dry_run(cfg, 1)
    expected = "memory per GPU" if torch.cuda.is_available() else "host memory per process"
    assert expected in text and " fits in " in text


def _normalized(text: str) -> str:
    return " ".join(text.replace(" / ", "/").split()).lower()


def test_plan_help_docs_and_output_state_one_advice_rule(capsys):
    """The rule `advise` and `recommend` implement (tested above), in the same words in
    `plan --help` and docs/plan.md; the output's header names it too."""
    from longctx.commands import plan

    per_cp = ("the option that fits with the lowest predicted time per token among zero 0-3 x checkpointing "
              "none/selective/full (ties: the lower zero stage, less checkpointing), optimizer offload only when "
              "none of them fits")
    recommendation = ("the recommendation is the fitting row with the lowest predicted time per token (offload only "
                      "when nothing else fits; ties: the smaller cp)")
    docs = _normalized((ROOT / "docs" / "plan.md").read_text())
    help_text = _normalized(plan.__doc__)
    for rule in (per_cp, recommendation):
        assert rule in docs and rule in help_text
    assert _run_plan(["--gpus", "8", "model.preset=llama2-7b", "data.seq_len=32768"]) == 0
    assert "per cp: the fitting option with the lowest predicted time per token" in capsys.readouterr().out
