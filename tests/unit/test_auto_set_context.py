"""A stage switch (`set_context`) leaves the model equal to a fresh build of that stage with the
same weights: the same buffers (the rotary frequencies) and logits within 1e-6, for every
transformers-path type and native family and the stages of a recipe (a longer maximum length
alone, YaRN, linear), switched in order (an uninterrupted run) and straight from the first
stage into the last (a resume into a later stage); rope fields a stage does not set (GLM 4's
partial_rotary_factor) are kept, in the stage's config and in the export's."""
import pytest
import torch

from helpers.auto_models import TYPES, tiny_auto_model
from helpers.layouts import MODEL_TYPES_NATIVE
from helpers.model import FAMILY_CASES, tiny_model
from longctx.model import build_model
from longctx.model.auto import build_auto_model

TOL = 1e-6
STAGES = {
    "longer": (None, 512),
    "yarn": ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256},
             1024),
    "linear": ({"rope_type": "linear", "rope_theta": 20000.0, "factor": 2.0}, 512),
}


def _stage_spec(spec, rope, max_len):
    changes = {"max_position_embeddings": max_len}
    if rope is not None:
        changes["rope_parameters"] = dict(rope)
    return spec.replace(**changes)


def _ids():
    return torch.randint(3, 96, (1, 40), generator=torch.Generator().manual_seed(2))


def _model(model_type):
    if model_type in MODEL_TYPES_NATIVE:
        return tiny_model(seed=3, **FAMILY_CASES[model_type])
    return tiny_auto_model(model_type)


def _fresh(model_type, spec, weights):
    if model_type in MODEL_TYPES_NATIVE:
        fresh = build_model(spec, seed=0)
    else:
        fresh = build_auto_model(spec, seed=0, dtype=torch.float32)
    fresh.load_state_dict(weights)
    return fresh


def _assert_equal(model, fresh, what):
    bufs, want = dict(model.named_buffers()), dict(fresh.named_buffers())
    assert bufs.keys() == want.keys(), what
    for key, b in want.items():
        assert bufs[key].shape == b.shape and (bufs[key] - b).abs().max().item() <= TOL, f"{what}: {key}"
    ids = _ids()
    pos = torch.arange(300, 340)[None]  # past the original length: the scaling shows
    with torch.no_grad():
        err = (model(ids, position_ids=pos) - fresh(ids, position_ids=pos)).abs().max().item()
    assert err <= TOL, f"{what}: logits off by {err:.2e}"


@pytest.mark.parametrize("model_type", TYPES + MODEL_TYPES_NATIVE)
def test_set_context_equals_a_fresh_build_of_every_stage(model_type):
    model = _model(model_type)
    base = model.config
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    for name, (rope, max_len) in STAGES.items():  # an uninterrupted run: each stage after the one before
        spec = _stage_spec(base, rope, max_len)
        model.set_context(spec)
        _assert_equal(model, _fresh(model_type, spec, weights), f"{model_type} stage {name}")
    resumed = _model(model_type)  # a resume into the last stage: built as the first, switched once
    resumed.set_context(spec)
    _assert_equal(resumed, _fresh(model_type, spec, weights), f"{model_type} resumed into stage {name}")


def test_a_stage_keeps_the_partial_rotary_it_does_not_set():
    model = tiny_auto_model("glm4")
    before = model.model.rotary_emb.inv_freq.numel()  # head_dim 8 x 0.5 / 2
    spec = _stage_spec(model.config, STAGES["yarn"][0], 1024)
    assert spec.hf["rope_parameters"]["partial_rotary_factor"] == 0.5  # what the export writes
    model.set_context(spec)
    assert model.hf.config.rope_parameters["partial_rotary_factor"] == 0.5
    assert model.model.rotary_emb.inv_freq.numel() == before == 2
