"""The invariants every model type keeps on generated row layouts (tests/helpers/layouts.py:
packed documents with and without document masks, trailing padding, rows of one token), for
the transformers path's 11 types and the native families, in one process:

- causality: changing any later token (padding included) never changes an earlier logit,
  exactly (0 in fp32); for the MoE types whose experts run the tokens routed to each as one
  matmul (transformers' grouped experts), within GROUPED_TOL: a later token changes the row
  count of those matmuls and with it their rounding, not what an earlier token sees (the leaks
  this test exists for were 1e-3 to 0.4);
- trailing padding: adding padding changes neither the loss (cross-entropy sum and the MoE
  load-balancing loss) nor any gradient.

The layouts property (every CP impl equals one process) is test_invariants_cp.py's."""
from functools import lru_cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.auto_models import MOE_TYPES, TYPES, tiny_auto_model
from helpers.layouts import MODEL_TYPES_NATIVE, layouts, make_batch, with_padding
from helpers.model import FAMILY_CASES, tiny_model

ALL_TYPES = TYPES + MODEL_TYPES_NATIVE
PAD_TOL = 1e-5  # relative: padding adds zero terms to sums whose order the longer shapes may change
GROUPED = MOE_TYPES
GROUPED_TOL = 1e-6
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True, database=None)


@lru_cache(maxsize=None)
def _model(model_type: str):
    if model_type in MODEL_TYPES_NATIVE:
        return tiny_model(seed=3, **FAMILY_CASES[model_type])
    return tiny_auto_model(model_type)


def _vocab(model) -> int:
    return model.embed_tokens.num_embeddings


def _forward(model, batch, **kw):
    return model(batch["input_ids"], position_ids=batch["position_ids"], segment_ids=batch["segment_ids"],
                 token_mask=batch["token_mask"], **kw)


@pytest.mark.parametrize("model_type", ALL_TYPES)
@SETTINGS
@given(layout=layouts(max_len=14), cut=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_no_logit_depends_on_a_later_token(model_type, layout, cut, seed):
    model = _model(model_type)
    batch = make_batch(layout, vocab=_vocab(model), rows=2)
    T = layout.length
    j = min(T - 1, int(cut * T))  # tokens j.. change, padding included
    changed = dict(batch)
    g = torch.Generator().manual_seed(seed)
    changed["input_ids"] = batch["input_ids"].clone()
    changed["input_ids"][:, j:] = torch.randint(3, _vocab(model), (2, T - j), generator=g)
    with torch.no_grad():
        before, after = _forward(model, batch)[:, :j], _forward(model, changed)[:, :j]
    moved = (before - after).abs().max().item() if j else 0.0
    tol = GROUPED_TOL if model_type in GROUPED else 0.0
    assert moved <= tol, f"{model_type} {layout}: logits before token {j} moved by {moved:.3e}"


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss_sum, _ = _forward(model, batch, labels=batch["labels"], loss_chunk_size=5)
    aux = model.auxiliary_loss()
    objective = loss_sum + (aux if aux is not None else 0.0)
    objective.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return objective.item(), grads


@pytest.mark.parametrize("model_type", ALL_TYPES)
@SETTINGS
@given(layout=layouts(max_len=12), extra=st.integers(1, 6))
def test_trailing_padding_changes_no_loss_and_no_gradient(model_type, layout, extra):
    model = _model(model_type)
    batch = make_batch(layout, vocab=_vocab(model))
    want, want_grads = _loss_and_grads(model, batch)
    got, grads = _loss_and_grads(model, with_padding(batch, extra))
    assert abs(got - want) <= PAD_TOL * max(1.0, abs(want)), f"{model_type} {layout} +{extra}: {got} vs {want}"
    assert grads.keys() == want_grads.keys()
    # the largest gradient entry; at least 0.1: a row whose loss is only the MoE loss of one token
    # can have gradients that are zero but for rounding
    scale = max(0.1, *(g.abs().max().item() for g in want_grads.values()))
    for name, g in grads.items():
        err = (g - want_grads[name]).abs().max().item()
        assert err <= PAD_TOL * scale, f"{model_type} {layout} +{extra}: {name} {err:.2e} (largest {scale:.2e})"
