"""The transformers path (longctx/model/auto/) against transformers' own models: logits, the
loss with the MoE load-balancing term, and gradients equal for every tested model type, packed
documents equal to each document alone, and a one-line refusal for what cannot be exact."""
import pytest
import torch

from helpers.auto_models import MOE_TYPES, TYPES, reference_twin, save_tiny_hf, tiny_auto_model, tiny_hf_config
from longctx.base.errors import UserError
from longctx.model.auto import check_supported

TOL = 1e-4  # fp32


def _ids(B=2, T=24, seed=0):
    return torch.randint(3, 96, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model_type", TYPES)
def test_logits_loss_and_grads_equal_transformers(model_type):
    model = tiny_auto_model(model_type)
    twin = reference_twin(model)
    ids = _ids()
    with torch.no_grad():
        assert (model(ids) - twin(ids).logits).abs().max().item() <= TOL
    # the loss as transformers trains it: mean token CE (+ coef * aux for MoE with output_router_logits)
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)
    loss_sum, n = model(ids, labels=labels, loss_chunk_size=7)
    aux = model.auxiliary_loss()
    assert (aux is not None) == (model_type in MOE_TYPES)
    ours = loss_sum / n + (aux if aux is not None else 0.0)
    ours.backward()
    ref = twin(ids, labels=ids)
    ref.loss.backward()
    assert abs(ours.item() - ref.loss.item()) <= TOL * abs(ref.loss.item())
    if aux is not None:
        assert abs(model.aux_loss_value().item() - ref.aux_loss.item()) <= TOL
    twin_grads = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        want = twin_grads[name].grad
        assert want is not None and p.grad is not None, name
        rel = (p.grad - want).abs().max().item() / max(want.abs().max().item(), 1e-12)
        assert rel <= TOL, f"{model_type} grad {name}: rel err {rel:.2e}"


@pytest.mark.parametrize("model_type", ["gemma2", "gpt_oss", "qwen2_moe", "cohere2"])
def test_packed_documents_equal_each_alone(model_type):
    """Windows, softcaps and sinks stay inside each document; positions restart per document."""
    model = tiny_auto_model(model_type)
    twin = reference_twin(model)
    ids = _ids(1, 24, seed=1)
    seg = torch.tensor([[0] * 10 + [1] * 14])
    pos = torch.cat([torch.arange(10), torch.arange(14)])[None]
    with torch.no_grad():
        packed = model(ids, position_ids=pos, segment_ids=seg)
        alone = torch.cat([twin(ids[:, :10]).logits, twin(ids[:, 10:]).logits], 1)
    assert (packed - alone).abs().max().item() <= TOL


def test_parameter_names_are_the_models_own():
    model = tiny_auto_model("mixtral")
    names = set(model.state_dict())
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names
    assert not any(n.startswith("hf.") for n in names)


@pytest.mark.parametrize("change, says", [
    ({"layer_types": ["linear_attention", "full_attention"]}, "linear-attention layers"),
    ({"attention_chunk_size": 8}, "chunked attention"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "rope_type 'dynamic'"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0], "long_factor": [2.0]}},
     "rope_type 'longrope'"),
    ({"is_causal": False}, "non-causal attention"),
    ({"attention_dropout": 0.1}, "attention_dropout=0.1"),
])
def test_refuses_what_sharding_cannot_compute_exactly(change, says):
    hf = {**tiny_hf_config("mixtral"), **change}
    with pytest.raises(UserError, match="cannot run under longctx's exact context parallelism") as err:
        check_supported(hf, "m/config.json")
    assert says in str(err.value) and "\n" not in str(err.value)


def test_refuses_untested_types_naming_the_tested_ones_and_the_switch():
    hf = {**tiny_hf_config("olmo2"), "model_type": "olmo3"}
    with pytest.raises(UserError) as err:
        check_supported(hf, "m/config.json")
    msg = str(err.value)
    assert "'olmo3' (no architectures) has not been tested" in msg
    assert "gemma2" in msg and "model.allow_untested=true" in msg
    assert check_supported(hf, "m/config.json", allow_untested=True).model_type == "olmo3"


@pytest.mark.parametrize("model_type", ["gemma2", "gpt_oss", "qwen2_moe", "glm4"])
def test_greedy_decoding_with_the_kv_cache_equals_transformers_generate(model_type):
    """`longctx eval`'s decoding (model/generate.py: left padding, longctx's KV cache) gives
    transformers' own greedy tokens, windows and sinks included."""
    from longctx.model.generate import generate

    model = tiny_auto_model(model_type).eval()
    twin = reference_twin(model)
    prompts = [[5, 7, 9, 11, 13, 15, 17, 19, 21], [8, 6, 4, 30, 31]]  # the second row is left-padded
    ours = generate(model, prompts, 8)
    for prompt, got in zip(prompts, ours):
        want = twin.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(prompt):].tolist()
        assert got == want


def test_eval_refuses_context_parallel_decoding_of_a_transformers_path_model(tmp_path):
    from longctx.eval.command import _checks_before_writing
    from longctx.eval.config import EvalConfig

    spec = tiny_auto_model("mixtral").config
    with pytest.raises(UserError, match=r"eval.cp: 2 .* evaluates at eval.cp=1"):
        _checks_before_writing(EvalConfig(model=str(tmp_path), cp=2), tmp_path, spec)


def test_an_untested_type_runs_only_after_its_self_check():
    """phi3 (with its default RoPE) is not in the tested table: refused, then built on request and
    checked against transformers' eager attention before any training; a broken path fails it."""
    from transformers import AutoConfig

    from longctx.model.auto import build_auto_model
    from longctx.model.auto.selfcheck import self_check

    hf = AutoConfig.for_model("phi3", vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                              sliding_window=None).to_dict()
    with pytest.raises(UserError, match="has not been tested"):
        check_supported(hf, "phi3/config.json")
    model = build_auto_model(check_supported(hf, "phi3/config.json", allow_untested=True), seed=1,
                             dtype=torch.float32)
    assert "max |d log p|" in self_check(model)
    model.state.set_inputs = lambda *a, **k: None  # documents no longer reach the attention: not exact
    model.state.segment_ids = None
    with pytest.raises(UserError, match="not exact"):
        self_check(model)


@pytest.mark.parametrize("model_type", ["gemma2", "qwen2_moe"])
def test_activation_checkpointing_keeps_the_gradients(model_type):
    """Checkpointed blocks recompute their attention in the backward with the same documents and
    positions (and the routers record once): the gradients of packed rows are unchanged."""
    from longctx.parallel.checkpointing import apply_activation_checkpointing, model_key

    ids = _ids(2, 24, seed=2)
    seg = torch.tensor([[0] * 7 + [1] * 17, [0] * 15 + [1] * 9])
    pos = torch.cat([torch.cat([torch.arange(7), torch.arange(17)])[None],
                     torch.cat([torch.arange(15), torch.arange(9)])[None]])
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)
    grads = []
    for policy in ("none", "full"):
        model = tiny_auto_model(model_type)
        apply_activation_checkpointing(model, policy)
        loss_sum, n = model(ids, position_ids=pos, segment_ids=seg, labels=labels)
        aux = model.auxiliary_loss()
        (loss_sum / n + (aux if aux is not None else 0.0)).backward()
        grads.append({model_key(k): p.grad for k, p in model.named_parameters()})
    for name, want in grads[0].items():
        assert (grads[1][name] - want).abs().max().item() <= 1e-6 * max(want.abs().max().item(), 1.0), name


@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_the_moe_loss_counts_real_tokens_as_transformers_does_with_its_attention_mask(model_type):
    """20 real tokens then 12 of padding: the load-balancing loss of the real tokens alone, which
    is transformers' given attention_mask (its routers still see the padding)."""
    model = tiny_auto_model(model_type)
    twin = reference_twin(model)
    ids = _ids(1, 32, seed=4)
    ids[:, 20:] = 0
    mask = torch.arange(32)[None] < 20
    labels = torch.full_like(ids, -100)
    with torch.no_grad():
        model(ids, labels=labels, token_mask=mask)
        ours = model.aux_loss_value().item()
        want = twin(ids, attention_mask=mask.long(), labels=labels).aux_loss.item()
        alone = twin(ids[:, :20]).aux_loss.item()
        model(ids, labels=labels)
        unmasked = model.aux_loss_value().item()
    assert abs(ours - want) <= TOL and abs(ours - alone) <= TOL
    assert abs(unmasked - want) > 10 * TOL  # the padding would have counted


@pytest.mark.parametrize("model_type", ["gemma2", "gpt_oss", "qwen2_moe", "cohere2"])
def test_packed_documents_without_document_masks_are_one_causal_sequence(model_type):
    """document_masking: false: no segment ids; positions restart at the second document and at
    the padding, yet the row is one causal sequence (windows counted in tokens), as transformers
    computes the same ids and positions given a 2D attention mask (without one, transformers
    reads restarting positions as packed documents)."""
    model = tiny_auto_model(model_type)
    twin = reference_twin(model)
    ids = _ids(1, 24, seed=1)
    pos = torch.cat([torch.arange(10), torch.arange(9), torch.arange(5)])[None]  # the last 5: padding
    with torch.no_grad():
        ours = model(ids, position_ids=pos)
        want = twin(ids, position_ids=pos, attention_mask=torch.ones_like(ids)).logits
    assert (ours - want).abs().max().item() <= TOL


@pytest.mark.parametrize("field, value, fix", [("parallel.mlp_tile_tokens", "64", "parallel.mlp_tile_tokens=0"),
                                               ("parallel.compile", "norms_mlp", "parallel.compile=none")])
def test_config_validation_refuses_what_the_transformers_path_does_not_run(tmp_path, field, value, fix):
    """MLP tiling and compile are the native model's: one line naming the field and the fix,
    before any work; following the fix validates."""
    from longctx.config import load_config, validate_config

    save_tiny_hf("gemma2", tmp_path / "hf", vocab_size=512)
    base = [f"model.init_from={tmp_path / 'hf'}", "data.seq_len=256", f"out_dir={tmp_path / 'run'}"]
    with pytest.raises(UserError) as e:
        validate_config(load_config(None, base + [f"{field}={value}"]), 1)
    msg = str(e.value)
    assert msg.startswith(f"{field}:") and "\n" not in msg and f"set {fix}" in msg and "gemma2" in msg
    validate_config(load_config(None, base + [fix]), 1)
