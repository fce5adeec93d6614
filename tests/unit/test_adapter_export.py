"""An adapter run's exports as the ecosystem loads them: the PEFT adapter directory through
PeftModel.from_pretrained gives longctx's logits, the merged export equals merge_and_unload()
(both model paths; the run's RoPE is not the base's)."""
import pytest
import torch

from helpers.auto_models import tiny_auto_model
from longctx.checkpoint.peft_export import merged_state_dict, write_adapter_dir
from longctx.config.adapter import AdapterSection
from longctx.model.adapter import apply_adapter
from longctx.model.config import PRESETS
from longctx.model.hf import save_hf_weights
from longctx.model.llama import build_model

pytest.importorskip("peft")
ADAPTER = AdapterSection(r=4, alpha=8.0, target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"],
                         trainable=["embed_tokens", "norm"])
RUN_ROPE = {"rope_type": "linear", "factor": 2.0}


def _trained(model, seed=7):
    """Random values where training would have moved the adapter and the trainable modules."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def _native(base_dir):
    model = build_model(PRESETS["debug-tiny"](), seed=0)
    save_hf_weights(model.state_dict(), model.config, base_dir)  # the base, with the base's RoPE
    rope = {**model.config.rope_parameters, **RUN_ROPE}
    model.set_context(model.config.replace(rope_parameters=rope, max_position_embeddings=512))
    return model, 512


def _auto(base_dir):
    model = tiny_auto_model("olmo2")
    model.hf.save_pretrained(base_dir)
    spec = model.config.replace(rope_parameters={**model.config.rope_parameters, **RUN_ROPE},
                                max_position_embeddings=512)
    model.set_context(spec)
    return model, 96


@pytest.mark.parametrize("path", [_native, _auto], ids=["native", "transformers"])
def test_peft_loads_the_adapter_and_merged_export_equals_merge_and_unload(tmp_path, path):
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    model, vocab = path(tmp_path / "base")
    _trained(apply_adapter(model, ADAPTER, seed=0))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    adapter_dir = write_adapter_dir(state, ADAPTER, model.config, tmp_path / "adapter", base=str(tmp_path / "base"))
    save_hf_weights(merged_state_dict(state, ADAPTER), model.config, tmp_path / "merged")

    ids = torch.randint(0, vocab, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(ids)  # (B, T, V)
        base = AutoModelForCausalLM.from_pretrained(tmp_path / "base", config=AutoConfig.from_pretrained(adapter_dir),
                                                    dtype=torch.float32)
        peft = PeftModel.from_pretrained(base, adapter_dir).eval()
        theirs = peft(ids).logits
        assert (theirs - ours).abs().max().item() <= 1e-4
        # the base's own config (its RoPE) does not give the run's model: the adapter's config.json does
        plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32),
                                          adapter_dir).eval()
        assert (plain(ids).logits - ours).abs().max().item() > 1e-3
        unloaded = peft.merge_and_unload()
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
        assert type(merged) is type(unloaded)
        want = unloaded.state_dict()
        for key, value in merged.state_dict().items():
            assert torch.equal(value, want[key]), key
        assert (merged(ids).logits - ours).abs().max().item() <= 1e-4


def test_the_adapter_file_holds_only_the_adapter_and_the_trainable_modules(tmp_path):
    from safetensors.torch import load_file

    model = _trained(apply_adapter(build_model(PRESETS["debug-tiny"](), seed=0), ADAPTER, seed=0))
    write_adapter_dir(model.state_dict(), ADAPTER, model.config, tmp_path / "a")
    keys = set(load_file(tmp_path / "a" / "adapter_model.safetensors"))
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert len(keys) == len(trained)
    assert "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight" in keys
    assert "base_model.model.model.norm.weight" in keys and "base_model.model.model.embed_tokens.weight" in keys
    assert not any("k_proj" in k or "up_proj" in k or "lm_head" in k for k in keys)
    assert "base_model.model.model.layers.0.input_layernorm.weight" in keys
