"""Perplexity windows scored through the training loss, and the model's attention scope."""
import pytest
import torch
import torch.nn.functional as F

from helpers.model import tiny_model
from longctx.attention import eager_attention
from longctx.eval.ppl import window_nll


def test_window_nll_is_the_plain_next_token_cross_entropy():
    model = tiny_model("default").eval()
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(0))
    total, count = window_nll(model, ids, chunk=7)  # chunks that do not divide the window
    with torch.no_grad():
        logits = model(ids)  # (2, 48, V): the full logits, as a reference
    plain = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum")
    assert count == 2 * 47  # every position but each window's last predicts a token
    assert total == pytest.approx(plain.item(), rel=1e-5)


def test_attention_scope_installs_and_restores_each_blocks_function():
    model = tiny_model("default")
    before = [m.attn_fn for m in model.attention_modules()]
    with model.attention_scope(eager_attention):
        assert all(m.attn_fn is eager_attention for m in model.attention_modules())
    assert [m.attn_fn for m in model.attention_modules()] == before
    with pytest.raises(RuntimeError, match="inside"):
        with model.attention_scope(eager_attention):
            model.set_attention(eager_attention)  # a swap inside the scope ends with it too
            raise RuntimeError("inside")
    assert [m.attn_fn for m in model.attention_modules()] == before
