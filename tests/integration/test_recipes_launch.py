"""Published recipes as processes: each passes `--dry-run` on the meta device for its stated
cluster shape, without its weights, and fits it per the planner; each CPU-sized version trains
for real through launch/torchrun.sh (one step per stage: every stage starts at its length and cp,
which is what the launcher and the stages must get right), and the launcher refuses a recipe
written for a bigger cluster."""
import json
import math
import subprocess
import sys

import pytest

from helpers.recipes import CPU_RECIPES, RECIPES, ROOT, cluster, one_step_per_stage
from helpers.train import env
from longctx.config import load_config, resolve_stages, stage_model_config
from longctx.plan import estimate_memory, parse_size


@pytest.mark.parametrize("name", RECIPES)
def test_full_recipe_dry_run_on_its_cluster_and_fits(tmp_path, name):
    path = ROOT / "configs" / name
    shape = cluster(path)
    world = int(shape["nodes"]) * int(shape["gpus_per_node"])
    overrides = [f"out_dir={tmp_path / 'run'}"]
    # cwd without checkpoints/: the architecture comes from the recipe's model.preset
    res = subprocess.run([sys.executable, "-m", "longctx", "train", "--config", str(path), "--dry-run",
                          "--world-size", str(world), *overrides], capture_output=True, text=True, timeout=180,
                         cwd=tmp_path, env=env())
    assert res.returncode == 0, res.stderr[-2000:]
    assert "architecture from model.preset=" in res.stderr
    cfg = load_config(str(path), overrides)
    stages = resolve_stages(cfg)
    assert res.stdout.count("memory per GPU") == len(stages)
    for i, stage in enumerate(stages):
        cp = stage.parallel.cp_size
        assert f"stage {i} ({stage.name}): seq_len {stage.seq_len}" in res.stdout
        assert f"cp {cp} x dp {world // cp}" in res.stdout
        est = estimate_memory(cfg, stage, stage_model_config(stage), world)
        assert est.fits(parse_size(shape["gpu_mem"])), (name, i, est.peak_gb)
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def _launch(args, cwd=ROOT, timeout=600):
    e = env()
    e["LONGCTX_PYTHON"] = sys.executable
    return subprocess.run([str(ROOT / "launch" / "torchrun.sh"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=e)


def _failure(res) -> str:
    """The first traceback of a failed torchrun (its summary at the end names no cause)."""
    err = res.stderr
    start = err.find("Traceback")
    return (err[start:start + 4000] if start >= 0 else err[-4000:]) + "\n--- stdout ---\n" + res.stdout[-1000:]


@pytest.mark.parametrize("name", CPU_RECIPES)
def test_cpu_recipe_trains_through_the_launcher(tmp_path, name):
    shape = cluster(ROOT / "configs" / "cpu" / name)
    path = one_step_per_stage(ROOT / "configs" / "cpu" / name, tmp_path)
    out = tmp_path / "run"
    res = _launch(["--nproc-per-node", shape["gpus_per_node"], "--", "train", "--config", str(path),
                   f"out_dir={out}", "log.progress=false"])
    assert res.returncode == 0, _failure(res)
    cfg = load_config(str(path), [f"out_dir={out}"])
    stages = resolve_stages(cfg)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, sum(s.steps for s in stages) + 1))
    assert all(math.isfinite(r["loss"]) for r in records)
    # every stage ran at its length and cp
    seen = {(r["stage"], r["seq_len"], r["cp_size"]) for r in records}
    assert seen == {(i, s.seq_len, s.parallel.cp_size) for i, s in enumerate(stages)}
    assert (out / "checkpoints" / f"step_{len(records):07d}" / "COMPLETE").exists()


def test_launcher_preflight_rejects_a_recipe_for_a_bigger_cluster():
    res = _launch(["--nproc-per-node", "2", "--", "train", "--config", "configs/prolong-llama3-8b-64k.yaml"],
                  timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(
        "error: configs/prolong-llama3-8b-64k.yaml is written for 64 GPUs")
    assert "torch.distributed.run" not in res.stderr  # nothing was started
