"""Published recipes in configs/: each cites its source and matches the published numbers (the
dry runs and the CPU training runs are in tests/integration/test_recipes_launch.py)."""
import math
import re
from pathlib import Path

from helpers.recipes import CPU_RECIPES, PRESET_OF, RECIPES, ROOT, cluster, fake_checkpoint
from longctx.config import load_config, resolve_stages, stage_model_config


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
    s16, s32 = resolve_stages(cfg)
    assert (s16.steps, s32.steps) == (400, 200) and s16.seq_len == s32.seq_len == 65536
    assert s16.model.rope_parameters["factor"] == 16 and s32.model.rope_parameters["factor"] == 32
    assert s16.model.rope_parameters["rope_type"] == "yarn" and s16.model.rope_parameters["original_max_position_embeddings"] == 4096
    assert (s16.model.max_position_embeddings, s32.model.max_position_embeddings) == (65536, 131072)
    assert cfg.optim.lr == 2e-5 and cfg.optim.weight_decay == 0 and cfg.optim.warmup_steps == 20
    assert (world // cfg.parallel.cp_size) * cfg.data.micro_batch_size * cfg.train.grad_accum == 64  # global batch
    m = stage_model_config(s32)
    assert m.rope_type == "yarn" and m.max_position_embeddings == 131072


def test_llama3_recipe_stages_and_scaling(tmp_path):
    cfg = _load("llama3-8b-128k.yaml", fake_checkpoint(tmp_path, "llama3-8b"))
    stages = resolve_stages(cfg)
    assert [s.seq_len for s in stages] == [16384, 32768, 65536, 131072]
    m = stage_model_config(stages[-1])
    assert m.rope_parameters == {**m.rope_parameters, "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192}
    # cp grows with the length: the same 8k tokens per GPU and 4M tokens per step in every stage
    for s in stages:
        assert s.seq_len // s.parallel.cp_size == 8192
        assert (64 // s.parallel.cp_size) * cfg.train.grad_accum * s.seq_len == 4 * 2**20


def test_prolong_recipe_mixture(tmp_path):
    cfg = _load("prolong-llama3-8b-64k.yaml", fake_checkpoint(tmp_path, "llama3-8b"))
    weights = {s.name: s.weight for s in cfg.data.sources}
    assert math.isclose(sum(weights.values()), 1.0)
    assert (weights["code-repos"], weights["books"], weights["textbooks"]) == (0.30, 0.30, 0.03)
    assert math.isclose(sum(w for n, w in weights.items() if n not in ("code-repos", "books", "textbooks")), 0.37)
    assert cfg.data.document_masking and cfg.data.seq_len == 65536
    assert stage_model_config(resolve_stages(cfg)[0]).rope_parameters["rope_theta"] == 8e6
    assert cfg.optim.lr == 1e-5 and cfg.optim.min_lr_ratio == 0.1 and cfg.optim.schedule == "cosine"
    assert (64 // cfg.parallel.cp_size) * cfg.train.grad_accum * cfg.data.seq_len == 4 * 2**20  # 4M tokens/step
