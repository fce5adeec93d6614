"""train.adapter on a plain model: what it trains and freezes, what the optimizer holds, the
tiled MLP's gradients of LoRA-wrapped projections, and the names it refuses."""
import dataclasses

import pytest
import torch

from helpers.auto_models import tiny_auto_model
from longctx.base.errors import UserError
from longctx.checkpoint.adapter_base import with_base
from longctx.checkpoint.adapter_record import adapter_config_record, base_hash, check_adapter_config, check_base
from longctx.config.adapter import AdapterSection
from longctx.model.adapter import apply_adapter, check_adapter, linear_names, trainable_count
from longctx.model.config import PRESETS, get_preset
from longctx.model.llama import build_model, count_parameters
from longctx.parallel.zero import build_optimizer, optimizer_param_names
from longctx.plan.adapter import adapter_counts, adapter_spec
from longctx.plan.layout import Layout, parameter_counts
from longctx.plan.memory import estimate_layout

pytest.importorskip("peft")
MLP_AND_ATTENTION = AdapterSection(r=4, alpha=8.0, target_modules=["q_proj", "v_proj", "gate_proj", "up_proj",
                                                                   "down_proj"], trainable=["embed_tokens", "norm"])


def _model(preset="debug-tiny", adapter=MLP_AND_ATTENTION):
    model = apply_adapter(build_model(PRESETS[preset](), seed=0), adapter, seed=0)
    with torch.no_grad():  # B starts at zero: give every factor a gradient
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.05)
    return model


def test_only_the_adapter_and_the_named_modules_train_and_hold_optimizer_state():
    model = _model()
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "layers.0.self_attn.q_proj.lora_A.default.weight" in trained
    assert {"embed_tokens.weight", "norm.weight", "layers.1.input_layernorm.weight",
            "layers.1.post_attention_layernorm.weight"} <= trained
    assert not any("base_layer" in n or "k_proj" in n or "lm_head" in n for n in trained)
    assert trainable_count(model) == sum(p.numel() for n, p in model.named_parameters() if n in trained)
    opt = build_optimizer(model, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, offload=False)
    held = {id(p) for group in opt.param_groups for p in group["params"]}
    assert held == {id(p) for p in model.parameters() if p.requires_grad}
    assert set(optimizer_param_names(model)) == trained


def test_the_same_adapter_on_every_rank_from_the_seed():
    a, b = _model(), apply_adapter(build_model(PRESETS["debug-tiny"](), seed=0), MLP_AND_ATTENTION, seed=0)
    torch.manual_seed(123)  # the global generator's state does not matter
    c = apply_adapter(build_model(PRESETS["debug-tiny"](), seed=0), MLP_AND_ATTENTION, seed=0)
    key = "layers.1.mlp.up_proj.lora_A.default.weight"
    assert torch.equal(b.state_dict()[key], c.state_dict()[key]) and a.state_dict()[key].abs().sum() > 0


def test_the_tiled_mlp_trains_the_adapters_on_its_projections():
    """Tiles of 16 tokens against the whole sequence: the same loss and gradients, the MLP's LoRA
    factors included (a tiling that saw only the base weights would give them none)."""
    model = _model()
    ids = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(0))
    labels = torch.roll(ids, -1, dims=1)

    def grads(tile):
        model.zero_grad()
        model.set_mlp_tiling(tile)
        loss_sum, weight = model(ids, labels=labels)
        (loss_sum / weight).backward()
        return loss_sum.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    (whole_loss, whole), (tiled_loss, tiled) = grads(0), grads(16)
    assert torch.allclose(whole_loss, tiled_loss, rtol=0, atol=1e-5)
    mlp_factors = [n for n in whole if ".mlp." in n and ".lora_" in n]
    assert len(mlp_factors) == 2 * 3 * 2  # A and B, three projections, two layers
    for name, g in whole.items():
        assert tiled[name] is not None and g.abs().max() > 0, name
        assert (tiled[name] - g).abs().max().item() <= 1e-6, name
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)


def test_the_transformers_path_takes_the_same_adapter():
    model = tiny_auto_model("olmo2")
    assert linear_names(model) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    apply_adapter(model, MLP_AND_ATTENTION, seed=0)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "model.layers.0.mlp.gate_proj.lora_A.default.weight" in trained
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.post_feedforward_layernorm.weight",
            "model.layers.0.self_attn.q_norm.weight"} <= trained
    assert not any("base_layer" in n or "lm_head" in n for n in trained)


@pytest.mark.parametrize("field, value, needle", [
    ("r", 0, "train.adapter.r: the rank must be an integer >= 1, got 0"),
    ("r", -4, "train.adapter.r: the rank must be an integer >= 1, got -4"),
    ("alpha", 0.0, "train.adapter.alpha: must be a finite number > 0"),
    ("dropout", 1.0, "train.adapter.dropout: must be in [0, 1)"),
    ("type", "ia3", "train.adapter.type: unknown 'ia3'; valid: lora"),
    ("target_modules", [], "train.adapter.target_modules: name at least one linear module"),
    ("target_modules", ["self_attn.q_proj"], "train.adapter.target_modules: module names without dots"),
])
def test_bad_fields_are_refused(field, value, needle):
    section = AdapterSection(**{field: value})
    with pytest.raises(UserError, match=needle.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        section.validate()


def test_a_tied_embedding_is_not_trained_apart_from_its_head():
    model = build_model(PRESETS["debug-tiny"]().replace(tie_word_embeddings=True), device="meta")
    with pytest.raises(UserError, match="embed_tokens is tied to the vocabulary head"):
        check_adapter(AdapterSection(trainable=["embed_tokens"]), model)
    check_adapter(AdapterSection(trainable=["norm"]), model)  # the norms alone are fine


def test_a_resume_keeps_the_adapter_and_its_base(tmp_path):
    adapter = AdapterSection(r=4, target_modules=["q_proj"], trainable=["norm"])
    saved = {"adapter": dict(adapter_config_record(adapter), base_sha256="ab" * 32)}
    check_adapter_config(tmp_path, saved, adapter)
    with pytest.raises(UserError, match="train.adapter.r: .* was trained with r=4; this run has r=8"):
        check_adapter_config(tmp_path, saved, AdapterSection(r=8, target_modules=["q_proj"], trainable=["norm"]))
    with pytest.raises(UserError, match=r"train.adapter.trainable: .*; this run has trainable=\[\]"):
        check_adapter_config(tmp_path, saved, AdapterSection(r=4, target_modules=["q_proj"]))
    with pytest.raises(UserError, match="trained an adapter .*; set the same train.adapter"):
        check_adapter_config(tmp_path, saved, None)
    with pytest.raises(UserError, match="is a full-training checkpoint"):
        check_adapter_config(tmp_path, {}, adapter)
    check_base(tmp_path, saved, "ab" * 32)
    with pytest.raises(UserError, match=r"model.init_from: the base weights \(sha256 cdcdcdcdcdcd\) are not the ones"):
        check_base(tmp_path, saved, "cd" * 32)


def test_the_base_hash_names_the_frozen_weights_only():
    model = _model()
    before = base_hash(model)
    with torch.no_grad():
        model.layers[0].self_attn.q_proj.lora_A.default.weight.add_(1.0)  # trained: not the base
        model.norm.weight.add_(1.0)
    assert base_hash(model) == before
    with torch.no_grad():
        model.layers[0].self_attn.k_proj.weight[0, 0] += 1e-3  # frozen: another base
    assert base_hash(model) != before


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_the_planner_counts_what_an_adapter_run_trains(zero):
    """The planner's trained count is the live model's; gradients and optimizer states shrink to
    it, the parameters stay the whole model's (plus the factors)."""
    adapter = AdapterSection(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                             trainable=["embed_tokens", "norm"])
    tiny = get_preset("debug-tiny")
    counts = adapter_counts(tiny, adapter_spec(adapter))
    live = apply_adapter(build_model(tiny, seed=0), adapter, seed=0)
    assert counts.trained == trainable_count(live) and not counts.head_trained
    assert parameter_counts(tiny)["total"] + counts.added == count_parameters(live)

    big = get_preset("llama3-8b")
    lay = Layout(seq_len=131072, world_size=8, cp_size=8, cp_impl="ring", ulysses_size=1, zero_stage=zero,
                 offload_optimizer=False, offload_params=False, activation_checkpointing="full", checkpoint_every=1,
                 recompute_attention=False, micro_batch_size=1, grad_accum=1, dtype="bfloat16", loss_chunk_size=1024,
                 attention_backend="flash")
    full = estimate_layout(big, lay, device="gpu")
    lora = estimate_layout(big, dataclasses.replace(lay, adapter=adapter_spec(adapter)), device="gpu")
    trained, total = lora.info["parameters_trained"], lora.info["parameters_total"]
    assert trained < 0.1 * total and lora.optimizer <= full.optimizer * trained / full.info["parameters_total"] * 1.01
    assert lora.parameters >= full.parameters and lora.peak < full.peak


def test_a_checkpoint_without_the_base_gets_it_back_only_when_its_hash_matches(tmp_path):
    """An adapter checkpoint's DeepSpeed files hold the trained tensors only: the base comes
    back from the recorded preset and seed (or init_from), checked against the recorded sha256."""
    tiny = get_preset("debug-tiny")
    model = _model()
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    record = dict(adapter_config_record(MLP_AND_ATTENTION), base_sha256=base_hash(model), base=None, seed=0)
    whole = with_base(tmp_path, trained, record, tiny, torch.float32)
    assert whole.keys() == model.state_dict().keys()
    assert all(torch.equal(whole[k], v) for k, v in model.state_dict().items())
    with pytest.raises(UserError, match="now hash to sha256 .* not the recorded"):
        with_base(tmp_path, trained, dict(record, seed=1), tiny, torch.float32)
