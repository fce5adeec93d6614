"""Llama, Mistral, Qwen2 and Qwen3 against transformers' own class for each: logits (with and
without position ids, the RoPE types), greedy generation with the KV cache, both directions of
the HF round trip, eval's RoPE overrides, the loader's refusals and the sliding-window rules."""
import json

import pytest
import torch

from helpers.model import FAMILY_CASES, ORIGINAL, hf_config, hf_twin, tiny_model
from longctx import load_pretrained, save_pretrained
from longctx.base.errors import UserError
from longctx.eval.model_io import load_model
from longctx.eval.model_overrides import apply_overrides
from longctx.model import ModelConfig, build_model, count_parameters, get_preset
from longctx.model.generate import generate
from longctx.model.hf_config import config_from_hf, config_to_hf, read_hf_config
from longctx.plan.layout import parameter_counts

TOL = 1e-4
FAMILIES = list(FAMILY_CASES)
ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM"}
ROPES = ["default", "yarn", "dynamic", "llama3"]


def _diff(a, b):
    return (a - b).abs().max().item()


def _model(family, rope="default", seed=0):
    return tiny_model(rope, "gqa", seed=seed, **FAMILY_CASES[family])


@pytest.mark.parametrize("rope", ROPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(family, rope):
    ours, hf = _model(family, rope), hf_twin(_model(family, rope))
    g = torch.Generator().manual_seed(1)
    T = 3 * ORIGINAL  # past the original length of the scaled types
    ids = torch.randint(0, 128, (2, T), generator=g)
    pos = torch.sort(torch.randperm(4 * ORIGINAL, generator=g)[:T]).values.expand(2, T).clone()
    with torch.no_grad():
        assert _diff(ours(ids), hf(input_ids=ids).logits) <= TOL
        if rope != "dynamic":  # dynamic NTK's frequencies follow the largest position (a fresh twin per call)
            assert _diff(ours(ids, position_ids=pos), hf(input_ids=ids, position_ids=pos).logits) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_with_the_cache_matches_transformers(family):
    ours, hf = _model(family, "yarn", seed=5), hf_twin(_model(family, "yarn", seed=5))
    prompt = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)[0, 20:].tolist()
    assert generate(ours, [prompt[0].tolist()], max_new_tokens=24)[0] == ref


@pytest.mark.parametrize("family", FAMILIES)
def test_our_export_loads_in_transformers_auto_classes_as_the_family(family, tmp_path):
    from transformers import AutoModelForCausalLM

    ours = _model(family, "yarn")
    save_pretrained(ours, tmp_path / "m")
    written = json.loads((tmp_path / "m" / "config.json").read_text())
    assert written["architectures"] == [ARCH[family]] and written["model_type"] == family
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32).eval()
    assert type(hf).__name__ == ARCH[family]
    ids = torch.randint(0, 128, (2, 50), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert _diff(ours(ids), hf(input_ids=ids).logits) <= TOL
    back = load_pretrained(tmp_path / "m").eval()
    assert back.config == ours.config
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), ours.state_dict().values()))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_transformers_directory_with_yarn_as_qwen_gives_it_loads_exactly(family, tmp_path):
    """Qwen's cards add rope_scaling {type: yarn, factor: 4, original_max_position_embeddings}
    beside a top-level rope_theta; transformers saves its own config fields (layer_types,
    use_sliding_window false with a window number, max_window_layers)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = config_to_hf(_model(family).config, torch.float32)
    for key in ("architectures", "torch_dtype", "rope_parameters"):
        hf_cfg.pop(key)
    hf_cfg.update(rope_theta=1e6, rope_scaling={"type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": ORIGINAL},
                  use_sliding_window=False, sliding_window=8, max_window_layers=1, tie_word_embeddings=True)
    hf_cfg.pop("layer_types", None)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(hf_cfg.pop("model_type"), **hf_cfg)).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_pretrained(tmp_path / "hf").eval()
    assert ours.config.model_type == family and ours.config.sliding_window is None  # the window is off
    assert ours.config.rope_parameters["rope_type"] == "yarn" and ours.config.rope_parameters["rope_theta"] == 1e6
    assert ours.lm_head is None
    ids = torch.randint(0, 128, (1, 100), generator=torch.Generator().manual_seed(3))  # longer than the unused window
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        assert _diff(ours(ids), hf(input_ids=ids).logits) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_eval_rope_overrides_apply_to_every_family(family, tmp_path):
    save_pretrained(_model(family), tmp_path / "m")
    base = read_hf_config(tmp_path / "m")
    config, effective = apply_overrides(base, {"rope_parameters": {"rope_type": "yarn", "factor": 4.0},
                                               "max_position_embeddings": 4 * base.max_position_embeddings})
    assert config.model_type == family and effective["rope_parameters"]["original_max_position_embeddings"] == 128
    ours = load_model(tmp_path / "m", config=config).eval()
    ids = torch.randint(0, 128, (1, 300), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert _diff(ours(ids), hf_twin(ours)(input_ids=ids).logits) <= TOL


@pytest.mark.parametrize("family, drop, expect", [
    ("qwen2", "model.layers.0.self_attn.k_proj.bias", "missing tensor 'model.layers.0.self_attn.k_proj.bias'"),
    ("qwen3", "model.layers.1.self_attn.q_norm.weight", "missing tensor 'model.layers.1.self_attn.q_norm.weight'"),
])
def test_weights_without_a_tensor_the_config_implies_are_refused(family, drop, expect, tmp_path):
    from safetensors.torch import load_file, save_file

    save_pretrained(_model(family), tmp_path / "m")
    weights = load_file(tmp_path / "m" / "model.safetensors")
    del weights[drop]
    save_file(weights, tmp_path / "m" / "model.safetensors")
    with pytest.raises(UserError, match=expect):
        load_pretrained(tmp_path / "m")


@pytest.mark.parametrize("saved, claimed", [("qwen3", "llama"), ("qwen2", "mistral")])
def test_weights_with_tensors_the_config_lacks_are_refused(saved, claimed, tmp_path):
    """q/k norm weights (or q/k/v biases) under a config without them: not silently dropped."""
    save_pretrained(_model(saved), tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg.update(architectures=[ARCH[claimed]], model_type=claimed)
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=f"unexpected tensor .* for a {claimed} model"):
        load_pretrained(tmp_path / "m")


@pytest.mark.parametrize("arch", ["GemmaForCausalLM", "Phi3ForCausalLM", "OlmoForCausalLM", "Qwen2MoeForCausalLM"])
def test_other_architectures_are_one_error_listing_the_supported(arch):
    with pytest.raises(UserError) as e:
        config_from_hf({"architectures": [arch], "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1,
                        "num_attention_heads": 2})
    message = str(e.value)
    assert arch in message and "\n" not in message
    assert all(name in message for name in ARCH.values())


@pytest.mark.parametrize("changes, field", [
    ({"model_type": "qwen2", "attention_bias": True}, "attention_bias"),  # Qwen2's o_proj has no bias
    ({"model_type": "qwen3", "qk_norm": False}, "qk_norm"),
    ({"model_type": "llama", "sliding_window": 64}, "sliding_window"),
    ({"model_type": "mistral", "mlp_bias": True}, "mlp_bias"),
    ({"model_type": "gemma"}, "model_type"),
    ({"model_type": "qwen2", "sliding_window": 0}, "sliding_window"),
    ({"model_type": "qwen2", "sliding_window": 8, "layer_types": ["full_attention"]}, "layer_types"),
])
def test_fields_a_family_cannot_hold_are_refused(changes, field):
    with pytest.raises(UserError, match=f"^model.{field}: "):
        get_preset("debug-tiny").replace(**changes)


def test_a_window_of_at_least_the_length_is_full_attention_and_a_shorter_one_is_refused():
    model = _model("mistral")
    window = 40
    ours = build_model(model.config.replace(sliding_window=window), seed=0)
    ours.load_state_dict(model.state_dict())
    ids = torch.randint(0, 128, (1, window), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():  # transformers keeps W keys including the token itself: W tokens see no window
        assert _diff(ours(ids), hf_twin(ours)(input_ids=ids).logits) <= TOL
        with pytest.raises(UserError, match="window of 40 tokens"):
            ours(torch.cat([ids, ids[:, :1]], 1))
    # packed documents: positions restart per document, so only a document longer than the window counts
    two_docs = torch.cat([torch.arange(window), torch.arange(window)])[None]
    with torch.no_grad():
        ours(torch.cat([ids, ids], 1), position_ids=two_docs, segment_ids=(two_docs == 0).cumsum(1))


def test_qwen_layers_slide_from_max_window_layers_and_a_window_off_exports_off():
    hf = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
          "num_attention_heads": 2, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}
    cfg = config_from_hf(hf)
    assert cfg.sliding_layers == [2, 3] and cfg.window_limit == 16
    assert config_from_hf({**hf, "max_window_layers": 4}).window_limit is None  # no layer slides
    assert config_from_hf({**hf, "use_sliding_window": False}).sliding_window is None
    off = config_to_hf(cfg.replace(sliding_window=None), torch.float32)
    assert off["use_sliding_window"] is False and off["sliding_window"] is None
    assert set(off["layer_types"]) == {"full_attention"}
    mistral = config_to_hf(get_preset("debug-tiny-mistral").replace(sliding_window=None), torch.float32)
    assert mistral["sliding_window"] is None and "use_sliding_window" not in mistral


@pytest.mark.parametrize("preset", ["qwen2.5-0.5b", "qwen2.5-7b", "qwen3-0.6b", "qwen3-8b", "mistral-7b-v0.3",
                                    "llama3.1-8b", "debug-tiny-qwen2", "debug-tiny-qwen3"])
def test_parameter_counts_equal_transformers_own_count(preset):
    from transformers import AutoModelForCausalLM

    cfg = get_preset(preset)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(hf_config(cfg, torch.bfloat16))
    assert type(hf).__name__ == ARCH[cfg.model_type]
    expected = sum(p.numel() for p in hf.parameters())
    assert parameter_counts(cfg)["total"] == count_parameters(build_model(cfg, device="meta")) == expected


def test_a_checkpoint_record_keeps_the_family():
    for preset in ("debug-tiny-qwen2", "debug-tiny-qwen3", "debug-tiny-mistral"):
        cfg = get_preset(preset)
        assert config_from_hf(json.loads(json.dumps(config_to_hf(cfg, torch.float32)))) == cfg
    assert ModelConfig(model_type="qwen2").qkv_bias and ModelConfig(model_type="qwen3").qk_norm
