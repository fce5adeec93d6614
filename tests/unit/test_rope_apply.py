"""apply_rotary's hand-written autograd function against the textbook formula: the same
bits forward and backward (it only avoids copies), for the strided q/k views the model feeds it."""
import pytest
import torch

from longctx.model.rope import RotaryEmbedding, apply_rotary


def textbook(x, cos, sin):
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


def run(fn, base, cos, sin, grad, heads, head_dim):
    x = base.clone().requires_grad_()
    B, T, _ = base.shape
    q = x.view(B, T, heads, head_dim).transpose(1, 2)  # (B, H, T, D), not contiguous: as in Attention
    y = fn(q, cos, sin)
    y.backward(grad)
    return y, x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 10000.0},
                                  {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 64}])
def test_matches_textbook_formula_bit_for_bit(dtype, rope):
    B, T, H, D = 3, 50, 4, 16
    gen = torch.Generator().manual_seed(0)
    cos, sin = RotaryEmbedding(rope, D, 256)(torch.arange(7, 7 + T).expand(B, T))  # (B, T, D) fp32
    base = torch.randn(B, T, H * D, generator=gen).to(dtype)
    grad = torch.randn(B, H, T, D, generator=gen).to(dtype)
    y_ref, g_ref = run(textbook, base, cos, sin, grad, H, D)
    y, g = run(apply_rotary, base, cos, sin, grad, H, D)
    assert y.dtype == dtype and g.dtype == dtype
    assert torch.equal(y, y_ref)
    assert torch.equal(g, g_ref)
    assert not torch.equal(y.float(), base.view(B, T, H, D).transpose(1, 2).float())  # it did rotate


def test_differentiable_frequencies_still_get_gradients():
    B, T, H, D = 2, 8, 2, 8
    x = torch.randn(B, H, T, D, requires_grad=True)
    angles = torch.randn(B, T, D, requires_grad=True)
    y = apply_rotary(x, angles.cos(), angles.sin())
    y.sum().backward()
    assert angles.grad is not None and angles.grad.abs().sum() > 0
    assert torch.allclose(y, textbook(x, angles.cos(), angles.sin()))
