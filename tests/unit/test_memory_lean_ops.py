"""The memory-lean RMSNorm and the sequence-tiled SwiGLU MLP: the reference's numbers, less kept
for the backward."""
import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks

import longctx.model.norm as norm_module
from helpers.model import loss_and_grads, tiny_model
from longctx.base.errors import UserError
from longctx.config.sections import ParallelSection
from longctx.model.norm import RMSNorm
from longctx.model.swiglu import swiglu, tiled_swiglu
from longctx.parallel.checkpointing import apply_activation_checkpointing


def _reference_norm(x, weight, eps):  # transformers' LlamaRMSNorm, differentiated by autograd
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _saved_bytes(fn, *args) -> tuple:
    """(fn(*args), bytes of the distinct tensors autograd keeps for its backward)."""
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, sum(kept.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_is_bit_identical_to_the_reference(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 37, 64, generator=g).to(dtype).requires_grad_()
    weight = (1 + 0.1 * torch.randn(64, generator=g)).to(dtype)
    grad = torch.randn(3, 37, 64, generator=g).to(dtype)
    norm = RMSNorm(64, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    ref_w = weight.clone().requires_grad_()
    ref = _reference_norm(x, ref_w, 1e-5)
    out = norm(x)
    assert torch.equal(out, ref)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(out, (x, norm.weight), grad),
                                                 torch.autograd.grad(ref, (x, ref_w), grad)))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_rmsnorm_in_token_blocks(dtype, tol, monkeypatch):
    """Several blocks of 5 tokens: outputs and input gradients stay bit-identical; the weight
    gradient sums the blocks in fp32 (another summation order)."""
    monkeypatch.setattr(norm_module, "BLOCK_ELEMENTS", 5 * 64)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 37, 64, generator=g).to(dtype).requires_grad_()
    grad = torch.randn(3, 37, 64, generator=g).to(dtype)
    norm = RMSNorm(64, 1e-5).to(dtype)
    ref_w = norm.weight.detach().clone().requires_grad_()
    ref, out = _reference_norm(x, ref_w, 1e-5), norm(x)
    assert torch.equal(out, ref)
    (dx, dw), (ref_dx, ref_dw) = (torch.autograd.grad(out, (x, norm.weight), grad),
                                  torch.autograd.grad(ref, (x, ref_w), grad))
    assert torch.equal(dx, ref_dx)
    assert (dw.float() - ref_dw.float()).abs().max() <= tol * ref_dw.float().abs().max()


def test_rmsnorm_keeps_its_input_and_one_fp32_value_per_token():
    x = torch.randn(4, 256, 64, dtype=torch.bfloat16, requires_grad=True)
    norm = RMSNorm(64, 1e-5).to(torch.bfloat16)
    _, lean = _saved_bytes(norm, x)
    _, reference = _saved_bytes(_reference_norm, x, norm.weight, 1e-5)
    tokens = 4 * 256
    assert lean == x.numel() * 2 + tokens * 4 + 64 * 2  # input, 1/rms, weight
    assert reference >= 2.5 * lean  # an fp32 copy of the input and the rounded normalized value


def _reblocked_gemm_tolerance(ref, d, f):
    """How far swiglu's output may move when the rows are split into tiles: the BLAS may block
    (and thread) a GEMM of another row count differently, i.e. sum in another order. A dot
    product of length n summed in another order moves by at most n * u (u: unit roundoff of the
    fp32 accumulator) of its magnitude; the gate/up (length d) and down (length f) reductions
    chain, and each of the three rounded results (gate, up, output) may round one unit of the
    output dtype the other way. Relative to the output's largest magnitude."""
    u_acc, u_out = torch.finfo(torch.float32).eps / 2, torch.finfo(ref.dtype).eps / 2
    return ((d + f) * u_acc + 3 * u_out) * ref.float().abs().max().item()


def _mlp_params(d, f, dtype, bias, g):
    def p(*shape):
        return (0.2 * torch.randn(*shape, generator=g)).to(dtype).requires_grad_()
    return [p(f, d), p(f) if bias else None, p(f, d), p(f) if bias else None, p(d, f), p(d) if bias else None]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("bias", [False, True])
def test_tiled_swiglu_matches_the_whole_sequence(dtype, tol, bias):
    g = torch.Generator().manual_seed(0)
    params = _mlp_params(32, 48, dtype, bias, g)
    x = torch.randn(2, 50, 32, generator=g).to(dtype).requires_grad_()  # 100 tokens: tiles of 16, last of 4
    grad = torch.randn(2, 50, 32, generator=g).to(dtype)
    leaves = [x] + [p for p in params if p is not None]
    whole = swiglu(x, *params)
    tiled = tiled_swiglu(x, 16, *params)
    assert (tiled.float() - whole.float()).abs().max() <= _reblocked_gemm_tolerance(whole, 32, 48)
    for ref, got in zip(torch.autograd.grad(whole, leaves, grad), torch.autograd.grad(tiled, leaves, grad)):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert (got.float() - ref.float()).abs().max() <= tol * ref.float().abs().max()


def test_tiled_swiglu_keeps_only_its_input_and_weights():
    g = torch.Generator().manual_seed(0)
    params = _mlp_params(32, 256, torch.float32, False, g)
    x = torch.randn(1, 4096, 32, generator=g, requires_grad=True)
    weights = sum(p.numel() * 4 for p in params if p is not None)
    _, tiled = _saved_bytes(tiled_swiglu, x, 512, *params)
    _, whole = _saved_bytes(swiglu, x, *params)
    assert tiled == x.numel() * 4 + weights
    assert whole >= x.numel() * 4 + 4 * 4096 * 256 * 4  # gate, its silu, up, their product


def test_tiled_swiglu_without_grad_and_for_frozen_weights():
    g = torch.Generator().manual_seed(0)
    params = [p.detach() if p is not None else None for p in _mlp_params(16, 24, torch.float32, True, g)]
    x = torch.randn(70, 16, generator=g)
    with torch.no_grad():
        tiled, whole = tiled_swiglu(x, 32, *params), swiglu(x, *params)
    assert (tiled - whole).abs().max() <= _reblocked_gemm_tolerance(whole, 16, 24)
    x.requires_grad_()
    grad = torch.randn(70, 16, generator=g)
    (dx,) = torch.autograd.grad(tiled_swiglu(x, 32, *params), x, grad)
    (ref,) = torch.autograd.grad(swiglu(x, *params), x, grad)
    assert (dx - ref).abs().max() <= _reblocked_gemm_tolerance(ref, 16, 24)  # the same chain of reductions, backwards



@pytest.mark.parametrize("checkpointing,recompute_attention", [("none", False), ("full", False), ("full", True)])
def test_model_with_tiled_mlps_matches_untiled(checkpointing, recompute_attention):
    ids = torch.randint(0, 128, (2, 64))
    labels = torch.roll(ids, -1, 1)
    segs = (torch.arange(64) >= 20).long().expand(2, 64).contiguous()  # two packed documents
    ref_loss, ref = loss_and_grads(tiny_model("yarn", "gqa"), ids, labels, segs)
    model = tiny_model("yarn", "gqa")
    apply_activation_checkpointing(model, checkpointing, recompute_attention=recompute_attention)
    model.set_mlp_tiling(48)  # 128 tokens per call: tiles of 48, 48 and 32
    loss, grads = loss_and_grads(model, ids, labels, segs)
    assert abs(loss - ref_loss) <= 1e-6 * abs(ref_loss)
    for k, g in ref.items():
        assert torch.allclose(grads[k], g, rtol=1e-5, atol=1e-7), k


def test_mlp_tiling_config_is_checked():
    with pytest.raises(UserError, match="parallel.mlp_tile_tokens"):
        ParallelSection(mlp_tile_tokens=-1).validate()
    with pytest.raises(UserError, match="parallel.mlp_tile_tokens.*zero_stage=3"):
        ParallelSection(mlp_tile_tokens=1024, zero_stage=3).validate()
    ParallelSection(mlp_tile_tokens=1024, zero_stage=2).validate()
    with pytest.raises(ValueError, match="tile_tokens"):
        tiny_model("default", "gqa").set_mlp_tiling(-1)


def test_untiled_mlp_calls_its_linear_modules():  # hooks on the projections (ZeRO-3's gathers) still run
    model = tiny_model("default", "gqa")
    calls = []
    model.layers[0].mlp.gate_proj.register_forward_pre_hook(lambda *_: calls.append(1))
    model(torch.randint(0, 128, (1, 16)))
    assert calls == [1]
    model.set_mlp_tiling(8)
    assert model(torch.randint(0, 128, (1, 8))).shape == (1, 8, 128)  # 8 tokens fit one tile: untiled
    assert calls == [1, 1]
