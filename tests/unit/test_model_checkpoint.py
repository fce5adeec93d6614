"""Hugging Face checkpoint interop: round trips and presets on meta (bad input and the export
command are in tests/integration/test_model_checkpoint_cli.py)."""
import json

import pytest
import torch

import longctx
from helpers.model import tiny_model
from longctx.base.errors import UserError
from longctx.model import build_model, count_parameters, get_preset
from longctx.model.hf import load_pretrained, save_pretrained


@pytest.mark.parametrize("rope", ["default", "yarn", "llama3", "longrope"])
def test_ours_to_transformers_round_trip(tmp_path, rope):
    from transformers import LlamaForCausalLM

    model = tiny_model(rope, "gqa")
    longctx.save_pretrained(model, tmp_path / "m")
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert hf.config.rope_parameters["rope_type"] == model.config.rope_type
    ids = torch.randint(0, 128, (2, 100))
    with torch.no_grad():
        assert (model(ids) - hf(input_ids=ids).logits).abs().max() <= 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transformers_to_ours_round_trip(tmp_path, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                          "original_max_position_embeddings": 64})
    torch.manual_seed(0)
    hf = LlamaForCausalLM(config).eval().to(dtype)
    hf.save_pretrained(tmp_path / "hf", max_shard_size="100KB")  # sharded with an index
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    ours = longctx.load_pretrained(tmp_path / "hf")
    assert ours.embed_tokens.weight.dtype == dtype
    ids = torch.randint(0, 128, (2, 64))
    with torch.no_grad():
        diff = (ours(ids).float() - hf(input_ids=ids).logits.float()).abs().max().item()
    assert diff <= (1e-4 if dtype == torch.float32 else 5e-2)


def test_legacy_rope_scaling_config(tmp_path):
    model = tiny_model("linear", "gqa")
    save_pretrained(model, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg.pop("rope_parameters")  # an old config.json: rope_theta + rope_scaling with "type"
    cfg["rope_scaling"] = {"type": "linear", "factor": 4.0}
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    loaded = load_pretrained(tmp_path / "m")
    assert loaded.config.rope_parameters == {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
    ids = torch.randint(0, 128, (1, 50))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


def test_tied_embeddings_and_sharded_save(tmp_path):
    model = tiny_model("default", "mha", tie_word_embeddings=True)
    save_pretrained(model, tmp_path / "m", max_shard_bytes=20_000)
    assert (tmp_path / "m" / "model.safetensors.index.json").exists()
    loaded = load_pretrained(tmp_path / "m")
    assert loaded.lm_head is None
    ids = torch.randint(0, 128, (1, 20))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


def test_presets_on_meta_have_published_counts_and_allocate_nothing():
    expected = {"llama2-7b": 6_738_415_616, "llama3-8b": 8_030_261_248, "llama3.1-8b": 8_030_261_248}
    for name, count in expected.items():
        model = build_model(get_preset(name), device="meta")
        assert all(p.is_meta for p in model.parameters())
        assert count_parameters(model) == count
    assert get_preset("llama3.1-8b").rope_parameters["rope_type"] == "llama3"
    bench = get_preset("bench-44m")
    assert (bench.num_hidden_layers, bench.hidden_size, bench.num_attention_heads, bench.num_key_value_heads,
            bench.intermediate_size, bench.vocab_size) == (4, 512, 8, 4, 1376, 32000)


def _fake_checkpoint(run, step):
    """A complete checkpoint holding no model/ (only what the manifest needs to verify)."""
    from longctx.checkpoint.manifest import COMPLETE, write_manifest

    ckpt = run / "checkpoints" / f"step_{step:07d}"
    (ckpt / "ds").mkdir(parents=True)
    (ckpt / "ds" / "mp_rank_00_model_states.pt").write_bytes(b"weights")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step}))
    assert write_manifest(ckpt, step) is None
    (ckpt / COMPLETE).write_text(f"{step}\n")
    return ckpt


def test_run_directory_means_its_newest_checkpoint_or_a_newer_hf_export(tmp_path):
    import os

    from longctx.checkpoint.find import resolve_model_dir

    run = tmp_path / "run"
    _fake_checkpoint(run, 1)
    newest = _fake_checkpoint(run, 2)
    assert resolve_model_dir(run) == newest  # no model/, no hf/ (a preempted run): the checkpoint itself
    save_pretrained(tiny_model("default", "gqa"), run / "hf")
    hf_time = (run / "hf" / "config.json").stat().st_mtime
    os.utime(newest / "COMPLETE", (hf_time - 10, hf_time - 10))
    assert resolve_model_dir(run) == run / "hf"  # written at the end of the run, after its last checkpoint
    os.utime(newest / "COMPLETE", (hf_time + 10, hf_time + 10))
    assert resolve_model_dir(run) == newest  # a later checkpoint (a resumed run) is newer than hf/


def test_a_bad_config_json_field_is_named_after_its_file():
    from longctx.model.hf_config import config_from_hf

    hf = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 36, "num_hidden_layers": 1,
          "num_attention_heads": 9, "num_key_value_heads": 5}
    with pytest.raises(UserError, match=r"^m/config.json: num_key_value_heads: 5 must divide num_attention_heads=9$"):
        config_from_hf(hf, where="m/config.json")
    with pytest.raises(UserError, match=r"^m/config.json: rope_parameters.factor: must be >= 1"):
        config_from_hf(dict(hf, num_key_value_heads=3, rope_scaling={"type": "linear", "factor": 0.5}),
                       where="m/config.json")
