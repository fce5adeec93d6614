"""Shared helpers of the local-attention tests: random q/k/v, packed document ids, the fp32
eager reference (outputs, lse and gradients), and the cases every backend is checked on."""
import torch

from longctx.attention import eager_attention

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def make_qkv(B=2, Hq=4, Hkv=1, T=24, S=24, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, T, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, S, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, S, D, generator=g).to(dtype)
    return q, k, v


def packed_ids(B, T, boundaries):
    """(B, T) document ids changing at the given positions (row b shifted by b)."""
    ids = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        for p in boundaries:
            ids[b, min(T, p + b):] += 1
    return ids


def reference(q, k, v, **kw):
    """fp32 eager reference on the same (possibly bf16-rounded) inputs: out, lse, grads."""
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    out, lse = eager_attention(qf, kf, vf, return_lse=True, **kw)
    # O(1) gradients so that an absolute bf16 tolerance is meaningful (bf16 spacing at 4.0 is 0.016)
    dout = 0.5 * torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    out.backward(dout)
    return out.detach(), lse, dout, qf.grad, kf.grad, vf.grad


def run_fn(fn, q, k, v, dout, **kw):
    qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
    res = fn(qq, kk, vv, **kw)
    out = res[0] if isinstance(res, tuple) else res
    out.backward(dout.to(out.dtype))
    return res, qq.grad, kk.grad, vv.grad


def assert_close(name, got, want, tol):
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol, f"{name}: max abs err {err:.3e} > {tol:.1e}"


CASES = [
    # (Hq, Hkv, T, S, causal, boundaries)
    (4, 1, 24, 24, True, None),       # MQA causal
    (8, 2, 24, 24, True, None),       # GQA 4:1 causal
    (4, 4, 24, 24, False, None),      # MHA non-causal
    (8, 2, 8, 24, True, None),        # bottom-right causal, T < S (prefix + diagonal split)
    (8, 2, 1, 24, True, None),        # decode step
    (8, 2, 24, 24, True, [5, 17]),    # packed documents, causal
    (4, 1, 24, 24, False, [9]),       # packed documents, non-causal
    (8, 2, 24, 24, True, [0]),        # single document (mask dropped by the planner)
]
