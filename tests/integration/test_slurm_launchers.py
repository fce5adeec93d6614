"""launch/: the torchrun wrapper's argument errors, accelerate configs and DeepSpeed JSONs that
load with the real libraries, the DeepSpeed hostfile, and preflight's stage consistency check."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "launch"))


def _wrapper(*args, env_extra=None):
    env = dict(os.environ, LONGCTX_PYTHON=sys.executable, **(env_extra or {}))
    return subprocess.run([str(ROOT / "launch" / "torchrun.sh"), *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=env)


@pytest.mark.parametrize("args,needle", [
    ([], "no longctx command after --"),
    (["--nnodes", "2", "--", "train"], "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
    (["--nproc-per-node", "zero", "--", "train"], "--nproc-per-node: expected a positive integer, got 'zero'"),
    (["--frobnicate", "--", "train"], "unknown option --frobnicate"),
])
def test_torchrun_wrapper_argument_errors(args, needle):
    res = _wrapper(*args)
    assert res.returncode == 2 and needle in res.stderr and res.stderr.startswith("error: ")


def test_torchrun_wrapper_help():
    res = _wrapper("--help")
    assert res.returncode == 0 and "many nodes" in res.stdout


@pytest.mark.parametrize("name", ["zero2.yaml", "zero3.yaml", "multinode-zero3.yaml"])
def test_accelerate_configs_load(name):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(ROOT / "launch" / "accelerate" / name))
    assert cfg.distributed_type == "DEEPSPEED"
    ds_file = ROOT / cfg.deepspeed_config["deepspeed_config_file"]
    assert ds_file.is_file()
    stage = 2 if "zero2" in name else 3
    import json

    assert json.loads(ds_file.read_text())["zero_optimization"]["stage"] == stage
    if name.startswith("multinode"):
        assert cfg.num_machines > 1 and cfg.num_processes % cfg.num_machines == 0 and cfg.main_process_ip


def test_deepspeed_jsons_merge_into_the_engine_config():
    from longctx.config import load_deepspeed_json
    from longctx.parallel.zero import deepspeed_config

    for stage in (2, 3):
        user = load_deepspeed_json(str(ROOT / "launch" / "deepspeed" / f"zero{stage}.json"))
        cfg = deepspeed_config(zero_stage=stage, micro_batch_size=1, grad_accum=1, world_size=8, dtype="bfloat16",
                               grad_clip=1.0, user=user)
        assert cfg["zero_optimization"]["stage"] == stage
        assert cfg["zero_optimization"]["reduce_bucket_size"] == 200000000


def test_deepspeed_hostfile_parses():
    from deepspeed.launcher.runner import _parse_hostfile

    pool = _parse_hostfile((ROOT / "launch" / "hostfile.example").read_text().splitlines())
    assert len(pool) == 8 and set(pool.values()) == {8}


def test_preflight_deepspeed_stage_must_match(tmp_path):
    import preflight

    out = tmp_path / "run"
    ok = preflight.main(["--world-size", "2", "--", f"out_dir={out}", "parallel.zero_stage=3",
                         f"parallel.deepspeed_config={ROOT / 'launch/deepspeed/zero3.json'}"])
    assert ok == 0
    rc = preflight.main(["--world-size", "2", "--", f"out_dir={out}", "parallel.zero_stage=0",
                         f"parallel.deepspeed_config={ROOT / 'launch/deepspeed/zero3.json'}"])
    assert rc == 2


def test_preflight_messages(tmp_path, capsys):
    import preflight

    rc = preflight.main(["--world-size", "2", "--", f"out_dir={tmp_path}/run", "parallel.zero_stage=0",
                         f"parallel.deepspeed_config={ROOT / 'launch/deepspeed/zero3.json'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "sets ZeRO stage 3 but parallel.zero_stage is 0; set parallel.zero_stage=3" in err
    rc = preflight.main(["--world-size", "4", "--", "--config", str(ROOT / "configs/cpu/llama3-8b-128k.yaml"),
                         "out_dir=/proc/nope/run"])
    assert rc == 2 and "out_dir: /proc/nope/run is not writable" in capsys.readouterr().err
    rc = preflight.main(["--world-size", "2", "--gpu-mem", "8GB", "--", "--config",
                         str(ROOT / "configs/cpu/llama3-8b-128k.yaml"), f"out_dir={tmp_path}/run"])
    captured = capsys.readouterr()
    assert rc == 0 and captured.out.strip() == str(tmp_path / "run")
    # the tiny model fits in 8 GB (1.5 runtime + a 5e8-element ZeRO-3 bucket)
    assert "warning: stage" not in captured.err
    rc = preflight.main(["--world-size", "8", "--gpu-mem", "24GB", "--", "model.preset=llama3-8b",
                         "data.seq_len=131072", "parallel.cp_size=8", f"out_dir={tmp_path}/run"])
    assert rc == 0 and "more than 24 GiB; see `longctx plan`" in capsys.readouterr().err


@pytest.mark.heavy
def test_accelerate_launch_zero2_trains(tmp_path):
    """`accelerate launch` with launch/accelerate/zero2.yaml starts 2 CPU processes that train."""
    import json

    from helpers.train import env

    out = tmp_path / "run"
    res = subprocess.run([str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file",
                          "launch/accelerate/zero2.yaml", "--num_processes", "2", "-m", "longctx", "train",
                          f"out_dir={out}", "train.steps=3", "data.seq_len=256", "data.micro_batch_size=2",
                          "parallel.zero_stage=2", "parallel.deepspeed_config=launch/deepspeed/zero2.json",
                          "log.progress=false", "log.tensorboard=false", "checkpoint.save_hf=false",
                          "checkpoint.export_hf=false"], cwd=ROOT, env=env(), capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 3 and last["dp_size"] == 2


def test_torchrun_wrapper_runs_a_job_and_prints_its_environment(tmp_path):
    from helpers.train import TINY

    res = _wrapper("--nproc-per-node", "1", "--", "train", *TINY, "train.steps=1", f"out_dir={tmp_path / 'run'}",
                   env_extra={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "environment:" in res.stderr and "  OMP_NUM_THREADS=1" in res.stderr
    assert "  NCCL_DEBUG=WARN" in res.stderr and (tmp_path / "run" / "metrics.jsonl").is_file()


def test_preflight_takes_the_command_word_the_docs_write(tmp_path, capsys):
    import preflight

    assert preflight.main(["--world-size", "2", "--", "train", "train.steps=2", f"out_dir={tmp_path / 'r'}"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "r")
    assert preflight.main(["--world-size", "2", "--", "train", "parallel.cp_size=3"]) == 2
    assert "error: parallel.cp_size: 3 needs at least 3 GPUs" in capsys.readouterr().err


def test_preflight_eval_write_data_needs_no_model(tmp_path, capsys):
    """`--write-data` writes prompts without weights: preflight checks its tokenizer, not a model."""
    import preflight

    argv = ["--world-size", "1", "--command", "eval", "--", "--write-data", str(tmp_path / "w"), "--lengths", "1024"]
    assert preflight.main([*argv, "--tokenizer", "byte", "--out", str(tmp_path / "e")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "e")
    assert preflight.main([*argv, "--tokenizer", "byte", "out=null"]) == 0
    assert capsys.readouterr().out.strip() == ""
    assert preflight.main(argv) == 2
    assert "error: eval.tokenizer: write_data without a model needs the tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
