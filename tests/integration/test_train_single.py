"""Trainer features in one process: preemption, bad input, init_from with new RoPE, stages."""
import json
import signal
import subprocess
import sys
import time

import pytest
import torch

import longctx
from helpers.train import TINY, env, metrics, run_train, start_train
from longctx.train.signals import PREEMPTED_EXIT_CODE


def _ok(res):
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def test_sigusr1_checkpoints_and_exits_with_requeue_code_then_resumes(tmp_path):
    out = tmp_path / "run"
    common = [*TINY, "train.steps=400", "data.seq_len=256"]
    proc = start_train(1, [f"out_dir={out}", *common], tmp_path / "log")
    deadline = time.time() + 120
    while not ((out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)  # a second signal during the save must not corrupt it
    assert proc.wait(timeout=120) == PREEMPTED_EXIT_CODE
    step = int((out / "PREEMPTED").read_text())
    assert 3 <= step < 400
    ckpt = out / "checkpoints" / f"step_{step:07d}"
    assert (ckpt / "COMPLETE").exists()
    # the rerun (as the requeued job would) continues from there and finishes
    _ok(run_train(1, [f"out_dir={out}", *common, "train.steps=400", "checkpoint.resume=auto"]))
    recs = metrics(out)
    assert recs[-1]["step"] == 400 and not (out / "PREEMPTED").exists()


def _cli(args, extra_env=None):
    e = env()
    e.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "longctx", "train", *args], capture_output=True, text=True, env=e,
                          timeout=120)


BAD = {
    "unknown key": (["train.stpes=3"], "did you mean 'train.steps'"),
    "wrong type": (["train.steps=many"], "train.steps"),
    "world size": (["parallel.cp_size=3"], "parallel.cp_size"),
    "seq_len divisibility": (["parallel.cp_size=2", "data.seq_len=258"], "data.seq_len"),
    "missing data path": (["data.sources=[{path: /no/such.jsonl}]"], "data.sources[0].path"),
    "missing init_from": (["model.init_from=/no/such/model"], "model.init_from"),
    "rope factor < 1": (["model.rope_parameters={rope_type: yarn, factor: 0.5}"], "factor"),
    "negative lr": (["optim.lr=-0.1"], "optim.lr"),
    "zero steps": (["train.steps=0"], "train.steps"),
    "unwritable out dir": (["out_dir=/proc/longctx-run"], "out_dir"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, case):
    args, needle = BAD[case]
    out = tmp_path / "run"
    overrides = [f"out_dir={out}", *args] if not any(a.startswith("out_dir=") for a in args) else args
    res = _cli(overrides, {"RANK": "0", "WORLD_SIZE": "2"} if case in ("world size", "seq_len divisibility") else None)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr
    assert not out.exists()


def test_print_config_and_dry_run():
    res = _cli(["--print-config", "train.steps=7"])
    assert res.returncode == 0 and "steps: 7" in res.stdout
    res = _cli(["--dry-run", "--world-size", "8", "model.preset=llama2-7b", "parallel.cp_size=8", "data.seq_len=65536",
                "model.rope_parameters={rope_type: yarn, factor: 16.0, original_max_position_embeddings: 4096}",
                "model.max_position_embeddings=65536", "data.sources=[{kind: synthetic}]", "data.micro_batch_size=1"])
    assert res.returncode == 0, res.stderr
    assert "6,738,415,616" in res.stdout and "yarn" in res.stdout


def test_init_from_hf_with_new_rope_and_staged_extension(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_dir = tmp_path / "base"
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(hf_dir)
    out = tmp_path / "run"
    stages = ("stages=[{name: short, seq_len: 256, steps: 3}, "
              "{name: long, seq_len: 512, steps: 3, lr: 1e-4, "
              "rope_parameters: {rope_type: yarn, rope_theta: 10000.0, factor: 4.0, "
              "original_max_position_embeddings: 256}, "
              "max_position_embeddings: 1024}]")
    res = run_train(1, [f"out_dir={out}", f"model.init_from={hf_dir}", stages, "data.micro_batch_size=1",
                        "log.progress=false", "log.tensorboard=false"])
    _ok(res)
    recs = metrics(out)
    assert [r["seq_len"] for r in recs] == [256] * 3 + [512] * 3
    assert [r["stage"] for r in recs] == [0, 0, 0, 1, 1, 1]
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step_0000003", "step_0000006"]  # a checkpoint between stages
    stage0 = json.loads((out / "checkpoints" / "step_0000003" / "model" / "config.json").read_text())
    assert stage0["rope_parameters"]["rope_type"] == "default"
    final = json.loads((out / "hf" / "config.json").read_text())
    assert final["rope_parameters"]["rope_type"] == "yarn" and final["max_position_embeddings"] == 1024
    # the exported model is what transformers loads, with the new RoPE
    hf = LlamaForCausalLM.from_pretrained(out / "hf")
    ours = longctx.load_pretrained(out / "hf")
    ids = torch.randint(0, 512, (1, 300))
    with torch.no_grad():
        assert (hf(input_ids=ids).logits - ours(ids)).abs().max() <= 1e-4
