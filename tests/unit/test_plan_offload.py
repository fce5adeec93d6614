"""The planner's offloads: the checkpointed block inputs leave the device for host memory or a
drive (two stay in flight), parameters go to host memory or NVMe, the copies are timed at the
stated link rates, host memory per node bounds them, the advice reaches for them only when
nothing else fits, and the lengths docs/plan.md states for Llama-3-8B are what the code gives."""
import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from longctx.base.errors import UserError
from longctx.config import load_config, resolve_stages, stage_model_config
from longctx.plan import GiB, estimate_layout, layout_of
from longctx.plan.advice import advise, longest_with_offload, recommend
from longctx.plan.layout import offload_transfer

ROOT = Path(__file__).resolve().parents[2]
H100 = 80 * GiB


def _llama3(seq_len=131072, gpus=8, **par):
    overrides = ["model.preset=llama3-8b", "train.dtype=bfloat16", "data.micro_batch_size=1",
                 f"data.seq_len={seq_len}", "parallel.activation_checkpointing=full",
                 *[f"parallel.{k}={v}" for k, v in par.items()]]
    cfg = load_config(None, overrides)
    stage = resolve_stages(cfg)[0]
    return stage_model_config(stage), layout_of(cfg, stage, gpus)


def test_activation_offload_moves_the_block_inputs():
    m, lay = _llama3(cp_size=8, zero_stage=3)
    t, d, L = lay.seq_len // 8, m.hidden_size, m.num_hidden_layers
    block_input = t * d * 2  # (t, d) bf16
    base = estimate_layout(m, lay)
    host = estimate_layout(m, dataclasses.replace(lay, offload_activations="host"))
    disk = estimate_layout(m, dataclasses.replace(lay, offload_activations="disk"))
    assert host.host - base.host == L * block_input and host.disk == 0
    assert disk.disk == L * block_input and disk.host == base.host
    # the forward's end holds L - 2 fewer inputs (two are in flight: one copied, one prefetched);
    # the last block's backward L - 3 (its own input is back, among its recomputed activations)
    assert base.phases["loss"] - host.phases["loss"] == (L - 2) * block_input
    for phase in ("backward_mlp", "backward_attention"):
        assert base.phases[phase] - host.phases[phase] == (L - 3) * block_input, phase
    assert host.peak == disk.peak < base.peak


def test_parameter_offload_goes_to_host_or_nvme_and_z3_gradients_follow_the_optimizer():
    m, lay = _llama3(gpus=1, zero_stage=3, offload_optimizer="true")
    P = 8_030_261_248
    states = estimate_layout(m, lay)
    assert states.gradients == 0  # DeepSpeed's ZeRO-3 keeps gradient partitions in host memory with it
    cpu = estimate_layout(m, dataclasses.replace(lay, offload_params=True))
    nvme = estimate_layout(m, dataclasses.replace(lay, offload_params=True, offload_params_device="nvme"))
    assert cpu.host - states.host == 2 * P and nvme.disk == 2 * P and nvme.host == states.host
    assert states.parameters - cpu.parameters == states.parameters - nvme.parameters == 2 * P  # ZeRO-3 gathers stay


def test_copies_hide_behind_compute_until_the_link_is_too_slow():
    m, lay = _llama3(seq_len=1048576, cp_size=8, zero_stage=2, offload_activations="host")
    fast = offload_transfer(m, lay)
    t = lay.seq_len // 8
    assert fast["activations_s"] == pytest.approx(32 * 2 * t * 4096 * 2 / 25e9)
    assert fast["factor"] == 1.0  # 2.75 s of copies under minutes of compute per micro-batch
    slow = offload_transfer(m, dataclasses.replace(lay, offload_activations="disk", nvme_bytes_per_s=1e6))
    assert slow["factor"] > 10
    params = offload_transfer(m, dataclasses.replace(lay, zero_stage=3, offload_params=True,
                                                     offload_params_device="nvme", seq_len=8192))
    assert params["params_s"] == pytest.approx(2 * 2 * 8_030_261_248 / 8 / 3e9) and params["factor"] > 1


def test_advice_offloads_activations_only_when_nothing_else_fits():
    m, lay = _llama3(seq_len=131072, gpus=2)
    rows = {r["cp_size"]: r for r in advise(m, lay, H100, device="gpu", runtime_gb=None, host_bytes=900 * GiB)}
    assert rows[2]["offload_activations"] == "none" and rows[2]["offload_tier"] == 1  # optimizer offload is enough
    assert rows[1]["offload_activations"] == "host" and rows[1]["fits"]  # cp 1 needs the block inputs moved
    assert recommend(list(rows.values()))["cp_size"] == 2  # the fewest offloads win
    starved = advise(m, lay, H100, device="gpu", runtime_gb=None, host_bytes=10 * GiB)
    assert not any(r["fits"] for r in starved)
    assert all("host memory" in r["stopped_by"] or "over the device" in r["stopped_by"] for r in starved)
    assert any(r["stopped_by"].startswith("host memory") for r in starved)


def test_cpu_advice_offloads_to_a_file_never_to_host():
    m, lay = _llama3(seq_len=131072, gpus=8)
    rows = advise(m, lay, 100 * GiB, device="cpu", runtime_gb=None)
    assert all(r["offload_activations"] in ("none", "disk") for r in rows)
    assert all(r["offload_params"] in ("none", "nvme") for r in rows)


@pytest.mark.parametrize("gpus, longest, beyond", [(1, 251_008, "gradients"), (8, 3_958_784, "activations")])
def test_longest_lengths_for_llama3_8b_are_those_docs_state(gpus, longest, beyond):
    m, lay = _llama3(seq_len=131072, gpus=gpus)
    host = 2 * 2**40 * 0.9 / min(gpus, 8)
    got = longest_with_offload(m, lay, H100, device="gpu", runtime_gb=None, host_bytes=host)
    assert got["seq_len"] == longest and got["row"]["fits"] and got["row"]["offload_activations"] == "host"
    assert not got["next"]["fits"] and beyond in got["next"]["stopped_by"]
    docs = (ROOT / "docs" / "plan.md").read_text()
    assert f"{longest:,}" in docs


def test_plan_command_reports_the_longest_length_and_its_limit(capsys):
    from longctx.commands import plan

    p = argparse.ArgumentParser()
    plan.add_parser(p)
    argv = ["--gpus", "8", "--seq-len", "4m", "model.preset=llama3-8b", "train.dtype=bfloat16",
            "parallel.activation_checkpointing=full", "data.micro_batch_size=1", "--json"]
    assert plan.run(p.parse_args(argv)) == 0
    report = json.loads(capsys.readouterr().out)
    advice = report["advice"]
    assert advice["recommended"] is None and report["host_mem_gib_per_node"] == 2048
    assert advice["longest_with_offload"]["seq_len"] == 3_958_784
    assert advice["options"][-1]["stopped_by"].startswith("3.2 GiB over the device")
    with pytest.raises(UserError, match="^--nvme-gbps: must be a finite number > 0"):
        plan.run(p.parse_args(argv + ["--nvme-gbps", "0"]))
