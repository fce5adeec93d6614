"""Published recipes in configs/: each cites its source, matches the published numbers, passes
`--dry-run` on the meta device for its stated cluster shape and fits it per the planner; each
CPU-sized version trains for real through launch/torchrun.sh."""
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from longctx.config import load_config, resolved_stages, stage_model_config
from longctx.model import get_preset
from longctx.model.hf import config_to_hf
from longctx.plan import estimate_memory, parse_size

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
CPU_RECIPES = sorted(p.name for p in (ROOT / "configs" / "cpu").glob("*.yaml"))
PRESET_OF = {"yarn-llama2-7b-128k.yaml": "llama2-7b", "llama3-8b-128k.yaml": "llama3-8b",
             "prolong-llama3-8b-64k.yaml": "llama3-8b"}


def cluster(path: Path) -> dict:
    line = re.search(r"^#\s*cluster:\s*(.*)$", path.read_text(), re.MULTILINE).group(1)
    return dict(item.split("=", 1) for item in line.split())


def fake_checkpoint(tmp_path: Path, preset: str) -> Path:
    """An HF model directory holding only what --dry-run reads: config.json (the real
    architecture) and a tokenizer file name (the tokenizer is not loaded)."""
    d = tmp_path / preset
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config_to_hf(get_preset(preset), "bfloat16")))
    (d / "tokenizer_config.json").write_text("{}")
    return d


def test_every_recipe_has_a_cpu_version_a_source_and_a_cluster_shape():
    assert set(RECIPES) == set(PRESET_OF) and set(CPU_RECIPES) == set(RECIPES)
    for name in RECIPES:
        text = (ROOT / "configs" / name).read_text()
        assert "Source:" in text and re.search(r"arXiv:\d{4}\.\d{5}", text), name
        shape = cluster(ROOT / "configs" / name)
        assert int(shape["nodes"]) * int(shape["gpus_per_node"]) >= 8 and shape["gpu_mem"].endswith("GB")
        assert "Source of the full recipe" in (ROOT / "configs" / "cpu" / name).read_text()


def _load(name: str, ckpt: Path) -> object:
    return load_config(str(ROOT / "configs" / name), [f"model.init_from={ckpt}", f"data.tokenizer={ckpt}"])


def test_yarn_recipe_matches_the_paper(tmp_path):
    cfg = _load("yarn-llama2-7b-128k.yaml", fake_checkpoint(tmp_path, "llama2-7b"))
    world = 64
    s16, s32 = resolved_stages(cfg)
    assert (s16.steps, s32.steps) == (400, 200) and s16.seq_len == s32.seq_len == 65536
    assert s16.rope_parameters["factor"] == 16 and s32.rope_parameters["factor"] == 32
    assert s16.rope_parameters["rope_type"] == "yarn" and s16.rope_parameters["original_max_position_embeddings"] == 4096
    assert (s16.max_position_embeddings, s32.max_position_embeddings) == (65536, 131072)
    assert cfg.optim.lr == 2e-5 and cfg.optim.weight_decay == 0 and cfg.optim.warmup_steps == 20
    assert (world // cfg.parallel.cp_size) * cfg.data.micro_batch_size * cfg.train.grad_accum == 64  # global batch
    m = stage_model_config(cfg, s32)
    assert m.rope_type == "yarn" and m.max_position_embeddings == 131072


def test_llama3_recipe_stages_and_scaling(tmp_path):
    cfg = _load("llama3-8b-128k.yaml", fake_checkpoint(tmp_path, "llama3-8b"))
    stages = resolved_stages(cfg)
    assert [s.seq_len for s in stages] == [16384, 32768, 65536, 131072]
    m = stage_model_config(cfg, stages[-1])
    assert m.rope_parameters == {**m.rope_parameters, "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192}
    # cp grows with the length: the same 8k tokens per GPU and 4M tokens per step in every stage
    for s in stages:
        assert s.seq_len // s.cp_size == 8192
        assert (64 // s.cp_size) * cfg.train.grad_accum * s.seq_len == 4 * 2**20


def test_prolong_recipe_mixture(tmp_path):
    cfg = _load("prolong-llama3-8b-64k.yaml", fake_checkpoint(tmp_path, "llama3-8b"))
    weights = {s.name: s.weight for s in cfg.data.sources}
    assert math.isclose(sum(weights.values()), 1.0)
    assert (weights["code-repos"], weights["books"], weights["textbooks"]) == (0.30, 0.30, 0.03)
    assert math.isclose(sum(w for n, w in weights.items() if n not in ("code-repos", "books", "textbooks")), 0.37)
    assert cfg.data.document_masking and cfg.data.seq_len == 65536
    assert stage_model_config(cfg, resolved_stages(cfg)[0]).rope_parameters["rope_theta"] == 8e6
    assert cfg.optim.lr == 1e-5 and cfg.optim.min_lr_ratio == 0.1 and cfg.optim.schedule == "cosine"
    assert (64 // cfg.parallel.cp_size) * cfg.train.grad_accum * cfg.data.seq_len == 4 * 2**20  # 4M tokens/step


@pytest.mark.parametrize("name", RECIPES)
def test_full_recipe_dry_run_on_its_cluster_and_fits(tmp_path, name):
    path = ROOT / "configs" / name
    shape = cluster(path)
    world = int(shape["nodes"]) * int(shape["gpus_per_node"])
    ckpt = fake_checkpoint(tmp_path, PRESET_OF[name])
    overrides = [f"model.init_from={ckpt}", f"data.tokenizer={ckpt}", f"out_dir={tmp_path / 'run'}"]
    res = subprocess.run([sys.executable, "-m", "longctx", "train", "--config", str(path), "--dry-run",
                          "--world-size", str(world), *overrides], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    cfg = load_config(str(path), overrides)
    stages = resolved_stages(cfg)
    assert res.stdout.count("memory per GPU") == len(stages)
    for i, stage in enumerate(stages):
        cp = stage.cp_size or cfg.parallel.cp_size
        assert f"stage {i} ({stage.name}): seq_len {stage.seq_len}" in res.stdout
        assert f"cp {cp} x dp {world // cp}" in res.stdout
        est = estimate_memory(cfg, stage, stage_model_config(cfg, stage), world)
        assert est.fits(parse_size(shape["gpu_mem"])), (name, i, est.peak_gb)
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def _launch(args, cwd=ROOT, timeout=600):
    from helpers.train import env

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
    path = ROOT / "configs" / "cpu" / name
    shape = cluster(path)
    out = tmp_path / "run"
    res = _launch(["--nproc-per-node", shape["gpus_per_node"], "--", "train", "--config", str(path),
                   f"out_dir={out}", "log.progress=false"])
    assert res.returncode == 0, _failure(res)
    cfg = load_config(str(path), [f"out_dir={out}"])
    stages = resolved_stages(cfg)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, sum(s.steps for s in stages) + 1))
    assert all(math.isfinite(r["loss"]) for r in records)
    # every stage ran at its length and cp
    seen = {(r["stage"], r["seq_len"], r["cp_size"]) for r in records}
    assert seen == {(i, s.seq_len, s.cp_size or cfg.parallel.cp_size) for i, s in enumerate(stages)}
    assert (out / "checkpoints" / f"step_{len(records):07d}" / "COMPLETE").exists()


def test_launcher_preflight_rejects_a_recipe_for_a_bigger_cluster():
    res = _launch(["--nproc-per-node", "2", "--", "train", "--config", "configs/prolong-llama3-8b-64k.yaml"],
                  timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(
        "error: configs/prolong-llama3-8b-64k.yaml is written for 64 GPUs")
    assert "torch.distributed.run" not in res.stderr  # nothing was started
