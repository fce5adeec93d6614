"""Activation checkpointing (full, selective, keeping attention outputs) changes no number and
holds less memory after the forward than the plain model."""
import pytest
import torch

from helpers.memory import held_bytes
from helpers.model import loss_and_grads, tiny_model
from longctx.parallel.checkpointing import apply_activation_checkpointing


@pytest.mark.parametrize("policy,recompute_attention", [("full", False), ("full", True), ("selective", False)])
def test_checkpointing_is_exact(policy, recompute_attention):
    ids = torch.randint(0, 128, (2, 64))
    labels = torch.roll(ids, -1, 1)
    segs = (torch.arange(64) >= 20).long().expand(2, 64).contiguous()  # two packed documents
    ref_loss, ref = loss_and_grads(tiny_model("yarn", "gqa"), ids, labels, segs)
    model = tiny_model("yarn", "gqa")
    wrapped = apply_activation_checkpointing(model, policy, every=2, recompute_attention=recompute_attention)
    assert wrapped == (2 if policy == "full" else 1)
    loss, grads = loss_and_grads(model, ids, labels, segs)
    assert abs(loss - ref_loss) <= 1e-6 * abs(ref_loss)
    for k, g in ref.items():
        assert torch.allclose(grads[k], g, rtol=1e-5, atol=1e-7), k


def test_checkpointing_holds_fewer_activations():
    """The bytes the forward leaves held for the backward, measured: every policy holds less than
    the plain model, full less than selective (which keeps some of the block), and recomputing
    attention less than keeping its outputs."""
    ids = torch.randint(0, 128, (2, 64))
    labels = torch.roll(ids, -1, 1)

    def held(policy=None, recompute_attention=False):
        model = tiny_model("yarn", "gqa")
        if policy:
            apply_activation_checkpointing(model, policy, every=2, recompute_attention=recompute_attention)
        return held_bytes(model, ids, labels=labels)

    plain, full, full_attention, selective = held(), held("full"), held("full", True), held("selective")
    assert full < selective < plain
    assert full_attention < full
