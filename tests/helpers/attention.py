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

DOC_CASES = CASES + [
    (8, 2, 24, 24, True, [3, 4, 5, 20]),  # one-token documents
    (8, 2, 10, 24, True, [5, 17]),  # T < S with documents: keys carry their own ids
]


def document_ids(B, T, S, bounds):
    """(query ids, key ids) of a DOC_CASES row: None without documents; key ids only when T != S
    (the queries are the last T of the S keys)."""
    if bounds is None:
        return None, None
    if T == S:
        return packed_ids(B, T, bounds), None
    kv = packed_ids(B, S, bounds)
    return kv[:, S - T:], kv


def blocks_vs_whole(kernel, dtype, device, B=2, Hq=8, Hkv=2, L=32, c0=12):
    """Ring attention's use of a block kernel, in one process: queries [c0, L) against the earlier
    keys (fully visible) and their own chunk (causal), packed documents, each block's (out, lse)
    merged in fp32; then each block's backward given the final out/lse, summed. Returns the max
    abs error of out, dq, dk, dv against fp32 eager attention over the whole sequence."""
    from longctx.attention.lse import merge_attention

    q, k, v = (x.to(device) for x in make_qkv(B=B, Hq=Hq, Hkv=Hkv, T=L, S=L, dtype=dtype))
    seg = packed_ids(B, L, [5, 14, 20]).to(device)
    dout = (0.5 * torch.randn(B, Hq, L, q.shape[-1], generator=torch.Generator().manual_seed(3))).to(device)
    dout[:, :, :c0] = 0  # only the chunk's rows contribute
    qr, kr, vr = (x.detach().float().cpu().requires_grad_() for x in (q, k, v))
    ref = eager_attention(qr, kr, vr, causal=True, segment_ids=seg.cpu())
    ref.backward(dout.float().cpu())
    qc, sc, dc = q[:, :, c0:], seg[:, c0:], dout[:, :, c0:].to(dtype)
    blocks = [(slice(0, c0), False), (slice(c0, L), True)]  # (keys, causal)
    out = lse = None
    for keys, causal in blocks:
        o, block_lse = kernel.forward(qc, k[:, :, keys], v[:, :, keys], causal=causal, segment_ids=sc,
                                      kv_segment_ids=seg[:, keys])
        out, lse = merge_attention(out, lse, o, block_lse)
    gq = torch.zeros(qc.shape, dtype=torch.float32, device=device)
    gk, gv = (torch.zeros(x.shape, dtype=torch.float32, device=device) for x in (k, v))
    for keys, causal in blocks:
        a, b, c = kernel.backward(dc, qc, k[:, :, keys], v[:, :, keys], out.to(dtype), lse, causal=causal,
                                  segment_ids=sc, kv_segment_ids=seg[:, keys])
        gq += a.float()
        gk[:, :, keys] += b.float()
        gv[:, :, keys] += c.float()
    err = lambda got, want: (got.float().cpu() - want.float()).abs().max().item()  # noqa: E731
    return {"out": err(out, ref[:, :, c0:]), "dq": err(gq, qr.grad[:, :, c0:]), "dk": err(gk, kr.grad),
            "dv": err(gv, vr.grad)}
