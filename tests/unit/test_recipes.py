"""Published recipes in configs/: each cites its source and matches the published numbers, and
is inspected (--print-config, --dry-run) without its weights, which training itself requires
(the dry runs as processes and the CPU training runs are in tests/integration/test_recipes_launch.py)."""
import math
import re

import huggingface_hub
import pytest

from helpers.recipes import CPU_RECIPES, PRESET_OF, RECIPES, ROOT, cluster
from longctx.commands.cli import main
from longctx.config import load_config, resolve_stages, stage_model_config
from longctx.model import build_model, count_parameters, get_preset
from longctx.plan.layout import parameter_counts


def test_every_recipe_has_a_cpu_version_a_source_and_a_cluster_shape():
    assert set(RECIPES) == set(PRESET_OF) and set(CPU_RECIPES) == set(RECIPES)
    for name in RECIPES:
        text = (ROOT / "configs" / name).read_text()
        assert "Source:" in text and re.search(r"arXiv:\d{4}\.\d{5}", text), name
        shape = cluster(ROOT / "configs" / name)
        assert int(shape["nodes"]) * int(shape["gpus_per_node"]) >= 2 and shape["gpu_mem"].endswith("GB")
        assert "Source of the full recipe" in (ROOT / "configs" / "cpu" / name).read_text()


def _load(name: str) -> object:
    return load_config(str(ROOT / "configs" / name))


def _gpus(name: str) -> int:
    """The GPUs of the cluster the recipe states it was written for (its `# cluster:` line)."""
    shape = cluster(ROOT / "configs" / name)
    return int(shape["nodes"]) * int(shape["gpus_per_node"])


def test_yarn_recipe_matches_the_paper():
    cfg = _load("yarn-llama2-7b-128k.yaml")
    world = _gpus("yarn-llama2-7b-128k.yaml")
    s16, s32 = resolve_stages(cfg)
    assert (s16.steps, s32.steps) == (400, 200) and s16.seq_len == s32.seq_len == 65536
    assert s16.model.rope_parameters["factor"] == 16 and s32.model.rope_parameters["factor"] == 32
    assert (s16.model.rope_parameters["rope_type"] == "yarn"
            and s16.model.rope_parameters["original_max_position_embeddings"] == 4096)
    assert (s16.model.max_position_embeddings, s32.model.max_position_embeddings) == (65536, 131072)
    assert cfg.optim.lr == 2e-5 and cfg.optim.weight_decay == 0 and cfg.optim.warmup_steps == 20
    # the paper's global batch of 64 sequences, on the recipe's own cluster
    assert (world // cfg.parallel.cp_size) * cfg.data.micro_batch_size * cfg.train.grad_accum == 64
    m = stage_model_config(s32)
    assert m.rope_type == "yarn" and m.max_position_embeddings == 131072


def test_llama3_recipe_stages_and_scaling():
    cfg = _load("llama3-8b-128k.yaml")
    world = _gpus("llama3-8b-128k.yaml")
    stages = resolve_stages(cfg)
    assert [s.seq_len for s in stages] == [16384, 32768, 65536, 131072]
    m = stage_model_config(stages[-1])
    assert m.rope_parameters == {**m.rope_parameters, "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192}
    # cp grows with the length: the same 8k tokens per GPU and 4M tokens per step in every stage
    for s in stages:
        assert s.seq_len // s.parallel.cp_size == 8192
        assert (world // s.parallel.cp_size) * cfg.train.grad_accum * s.seq_len == 4 * 2**20


def test_prolong_recipe_mixture():
    cfg = _load("prolong-llama3-8b-64k.yaml")
    weights = {s.name: s.weight for s in cfg.data.sources}
    assert math.isclose(sum(weights.values()), 1.0)
    assert (weights["code-repos"], weights["books"], weights["textbooks"]) == (0.30, 0.30, 0.03)
    assert math.isclose(sum(w for n, w in weights.items() if n not in ("code-repos", "books", "textbooks")), 0.37)
    assert cfg.data.document_masking and cfg.data.seq_len == 65536
    assert stage_model_config(resolve_stages(cfg)[0]).rope_parameters["rope_theta"] == 8e6
    assert cfg.optim.lr == 1e-5 and cfg.optim.min_lr_ratio == 0.1 and cfg.optim.schedule == "cosine"
    world = _gpus("prolong-llama3-8b-64k.yaml")
    assert (world // cfg.parallel.cp_size) * cfg.train.grad_accum * cfg.data.seq_len == 4 * 2**20  # 4M tokens/step


def test_smollm2_recipe_is_yarn_s4_over_8k_on_a_long_short_mixture():
    cfg = _load("smollm2-135m-32k.yaml")
    model = stage_model_config(resolve_stages(cfg)[0])
    assert (model.num_attention_heads, model.num_key_value_heads, model.tie_word_embeddings) == (9, 3, True)
    rope = model.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("yarn", 4.0, 8192)
    assert rope["rope_theta"] == 1e5 and model.max_position_embeddings == cfg.data.seq_len == 32768
    assert [(s.name, s.weight) for s in cfg.data.sources] == [("code-repos", 0.63), ("short-files", 0.37)]
    assert cfg.data.document_masking and not cfg.data.add_bos
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.schedule) == (2e-5, 20, "constant")
    assert 8 * cfg.train.grad_accum * cfg.data.seq_len == 2**20  # dp 8: 1M tokens per step


@pytest.mark.parametrize("name, family, heads", [("qwen2.5-7b-128k.yaml", "qwen2", (28, 4)),
                                                  ("qwen3-8b-128k.yaml", "qwen3", (32, 8))])
def test_qwen_recipes_are_yarn_x4_from_32k_to_128k(name, family, heads):
    """As the cards give it: YaRN factor 4 over 32,768 positions; Qwen3-8B's config says 40,960,
    so the recipe pins the original length instead of taking it from there."""
    cfg = _load(name)
    stages = resolve_stages(cfg)
    assert [s.seq_len for s in stages] == [65536, 131072]
    model = stage_model_config(stages[-1])
    assert model.model_type == family and (model.num_attention_heads, model.num_key_value_heads) == heads
    rope = model.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("yarn", 4.0, 32768)
    assert rope["rope_theta"] == 1e6 and model.max_position_embeddings == 131072 and model.window_limit is None
    assert cfg.data.add_bos is None  # Qwen's tokenizer has no BOS token: none is prepended
    for s in stages:  # 16k tokens per GPU, 1M tokens per step, on the recipe's 8 GPUs
        assert s.seq_len // s.parallel.cp_size == 16384
        assert (_gpus(name) // s.parallel.cp_size) * cfg.train.grad_accum * s.seq_len == 2**20


def test_a_dry_run_names_data_that_does_not_exist_yet_and_training_stops_on_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = ["train", "--config", str(ROOT / "configs" / "smollm2-135m-32k.yaml"), f"out_dir={tmp_path / 'run'}"]
    assert main([*argv, "--dry-run", "--world-size", "8"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "data.sources" in line]
    assert notes == ["note: data.sources[0].path data/longtext/train.jsonl, data.sources[1].path "
                     "data/longtext/short.jsonl: do not exist yet (training checks the data when it starts)"]
    assert main([*argv, "model.init_from=null"]) == 2  # no weights to check: the data is the first missing input
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: data.sources[0].path: data/longtext/train.jsonl does not exist")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipe_is_inspected_without_its_weights_and_training_asks_for_them(tmp_path, monkeypatch, capsys, name):
    """No checkpoints/ here: --print-config and --dry-run take the architecture from model.preset
    and say so in one note; training stops with one error line naming model.init_from before
    out_dir exists."""
    monkeypatch.chdir(tmp_path)  # a recipe's local models/<model> path is relative
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    # the recipes' Hub ids against an empty Hugging Face cache, offline (huggingface_hub's own settings)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    path, out = str(ROOT / "configs" / name), tmp_path / "run"
    cfg = load_config(path)
    assert cfg.model.preset == PRESET_OF[name]
    for flag in ("--print-config", "--dry-run"):
        assert main(["train", "--config", path, flag, "--world-size", "64", f"out_dir={out}"]) == 0
        captured = capsys.readouterr()
        notes = [line for line in captured.err.splitlines() if "model.init_from" in line]
        assert notes == [f"note: model.init_from {cfg.model.init_from} does not exist yet (nor in the Hugging Face "
                         f"cache): architecture from model.preset={PRESET_OF[name]} (training checks the weights, "
                         "or downloads them, when it starts)"]
    preset = get_preset(PRESET_OF[name])
    preset_params = (parameter_counts(preset)["total"] if hasattr(preset, "hf")  # a transformers-path preset
                     else count_parameters(build_model(preset, device="meta")))
    assert f"params {preset_params:,}" in captured.out and "memory per GPU" in captured.out
    assert main(["train", "--config", path, f"out_dir={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: model.init_from: {cfg.model.init_from} is not in the Hugging Face cache")
    assert not out.exists()
