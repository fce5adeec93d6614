"""Local attention backends against the materialized reference (eager autograd math)."""
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.attention import CASES, TOL, assert_close, make_qkv, packed_ids, reference, run_fn
from longctx.attention import (
    EagerKernel,
    attention_with_lse,
    eager_attention,
    get_attention,
    get_kernel,
    kernel_attention,
    merge_attention,
    resolve_backend,
    sdpa_attention,
)
from longctx.attention.sdpa import SdpaKernel, document_groups, document_runs_attention
from longctx.base.errors import UserError


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("case", CASES, ids=[f"c{i}" for i in range(len(CASES))])
def test_attention_with_lse_matches_reference(case, backend, dtype):
    Hq, Hkv, T, S, causal, bnd = case
    q, k, v = make_qkv(Hq=Hq, Hkv=Hkv, T=T, S=S, dtype=dtype)
    kw = dict(causal=causal, scale=0.3)
    if bnd is not None:
        kw["segment_ids"] = packed_ids(2, T, bnd)
    out_r, lse_r, dout, dq_r, dk_r, dv_r = reference(q, k, v, **kw)
    (out, lse), dq, dk, dv = run_fn(lambda *a, **b: attention_with_lse(*a, backend=backend, **b), q, k, v, dout, **kw)
    tol = TOL[dtype]
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (2, Hq, T)
    assert dk.shape == k.shape and dv.shape == v.shape  # gradients at kv-head count
    assert_close("out", out, out_r, tol)
    assert_close("lse", lse, lse_r, tol)
    assert_close("dq", dq, dq_r, tol)
    assert_close("dk", dk, dk_r, tol)
    assert_close("dv", dv, dv_r, tol)


@pytest.mark.parametrize("case", CASES[:7], ids=[f"c{i}" for i in range(7)])
def test_sdpa_attention_model_path(case):
    Hq, Hkv, T, S, causal, bnd = case
    q, k, v = make_qkv(Hq=Hq, Hkv=Hkv, T=T, S=S)
    kw = dict(causal=causal)
    if bnd is not None:
        kw["segment_ids"] = packed_ids(2, T, bnd)
    out_r, _, dout, dq_r, dk_r, dv_r = reference(q, k, v, **kw)
    out, dq, dk, dv = run_fn(sdpa_attention, q, k, v, dout, **kw)
    for name, a, b in [("out", out, out_r), ("dq", dq, dq_r), ("dk", dk, dk_r), ("dv", dv, dv_r)]:
        assert_close(name, a, b, 1e-5)


def test_documents_never_attend_across_boundaries():
    q, k, v = make_qkv(Hq=4, Hkv=2, T=16, S=16)
    ids = packed_ids(1, 16, [6]).expand(2, 16)
    out = sdpa_attention(q, k, v, causal=True, segment_ids=ids)
    # changing keys/values of document 0 must not change any output of document 1
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :6] += 5.0
    v2[:, :, :6] -= 3.0
    out2 = sdpa_attention(q, k2, v2, causal=True, segment_ids=ids)
    assert torch.equal(out[:, :, 6:], out2[:, :, 6:])
    assert not torch.allclose(out[:, :, :6], out2[:, :, :6])


@pytest.mark.parametrize("kernel", [SdpaKernel(), EagerKernel()], ids=["sdpa", "eager"])
def test_block_merge_and_block_backward_are_exact(kernel):
    """Attention over keys split into blocks, merged through the LSE, equals attention over all
    keys; each block's backward with the merged out/lse gives its share of the gradients."""
    q, k, v = make_qkv(B=2, Hq=8, Hkv=2, T=12, S=30)
    ids_q = packed_ids(2, 12, [4])
    ids_k = packed_ids(2, 30, [4, 20])
    kw = dict(causal=False, scale=0.25)
    out_full, lse_full = kernel.forward(q, k, v, segment_ids=ids_q, kv_segment_ids=ids_k, **kw)
    out = lse = None
    for sl in (slice(0, 7), slice(7, 19), slice(19, 30)):
        o, block_lse = kernel.forward(q, k[:, :, sl], v[:, :, sl], segment_ids=ids_q, kv_segment_ids=ids_k[:, sl], **kw)
        out, lse = merge_attention(out, lse, o, block_lse)
    assert_close("merged out", out, out_full, 1e-5)
    assert_close("merged lse", lse, lse_full, 1e-5)
    dout = torch.randn_like(out_full)
    dq_full, dk_full, dv_full = kernel.backward(dout, q, k, v, out_full, lse_full, segment_ids=ids_q,
                                                kv_segment_ids=ids_k, **kw)
    dq = torch.zeros_like(dq_full)
    for sl in (slice(0, 7), slice(7, 19), slice(19, 30)):
        gq, gk, gv = kernel.backward(dout, q, k[:, :, sl], v[:, :, sl], out_full, lse_full, segment_ids=ids_q,
                                     kv_segment_ids=ids_k[:, sl], **kw)
        dq += gq
        assert_close("block dk", gk, dk_full[:, :, sl], 1e-5)
        assert_close("block dv", gv, dv_full[:, :, sl], 1e-5)
    assert_close("summed dq", dq, dq_full, 1e-5)


def test_block_with_no_visible_key_has_minus_inf_lse():
    q, k, v = make_qkv(B=1, Hq=2, Hkv=1, T=4, S=6)
    out, lse = get_kernel("sdpa").forward(q, k, v, causal=False, segment_ids=torch.zeros(1, 4, dtype=torch.long),
                                          kv_segment_ids=torch.ones(1, 6, dtype=torch.long))
    assert torch.isinf(lse).all() and (lse < 0).all() and torch.equal(out, torch.zeros_like(out))
    # merging an empty block changes nothing
    o2, l2 = get_kernel("sdpa").forward(q, k, v, causal=False)
    mo, ml = merge_attention(o2, l2, out, lse)
    assert_close("out", mo, o2, 1e-7)
    assert_close("lse", ml, l2, 1e-7)


class _ShapeRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor):
                self.shapes.append((str(func), tuple(t.shape)))
        return out


@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_gqa_does_not_materialize_repeated_kv(causal):
    B, Hq, Hkv, T, S, D = 1, 8, 2, 8, 20, 16
    q, k, v = make_qkv(B=B, Hq=Hq, Hkv=Hkv, T=T, S=S, D=D)
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    with _ShapeRecorder() as rec:
        out = sdpa_attention(q, k, v, causal=causal)
        out.sum().backward()
    # a repeated K/V would be a (B, Hq, S, D) tensor (or (B, Hq, S - T, D) for the causal prefix block)
    expanded = [(f, s) for f, s in rec.shapes if len(s) == 4 and s[1] == Hq and s[2] in (S, S - T)]
    assert not expanded, f"repeated K/V materialized: {expanded[:3]}"
    assert k.grad.shape == k.shape


def test_backend_selection():
    assert resolve_backend("auto", "cpu") == "sdpa"
    assert get_attention("eager", "cpu") is eager_attention
    assert get_attention("auto", "cpu") is sdpa_attention
    with pytest.raises(UserError, match="valid: auto, sdpa, flash, fa4, varlen, flex, eager"):
        resolve_backend("xformers")
    for name, package in (("flash", "pip install flash-attn,"), ("fa4", "pip install --pre flash-attn-4,"),
                          ("varlen", "needs a CUDA device"), ("flex", "needs a CUDA device")):
        with pytest.raises(UserError, match=f"attention backend: '{name}' needs .*no CUDA device.*"):
            get_kernel(name, "cpu")
        with pytest.raises(UserError, match=package):
            get_attention(name, "cpu")


def test_kernel_attention_no_grad_decode_matches():
    q, k, v = make_qkv(B=1, Hq=4, Hkv=2, T=1, S=9)
    with torch.no_grad():
        out, _ = kernel_attention(SdpaKernel(), q, k, v, causal=True)
    assert_close("decode", out, eager_attention(q, k, v, causal=True), 1e-5)


@pytest.mark.parametrize("kernel_cls", [SdpaKernel, EagerKernel], ids=["sdpa", "eager"])
@pytest.mark.parametrize("T, S, causal", [(30, 30, True), (30, 30, False), (12, 30, True), (30, 12, True)])
def test_document_masks_are_tiled(kernel_cls, T, S, causal):
    """Long packed sequences never build a T x S mask: with a small tile the kernel runs many
    tiles (aligned / unaligned diagonals, skipped and merged tiles) and stays exact."""
    from longctx.attention import plan_tiles

    kernel = kernel_cls()
    kernel.tile = 7
    q, k, v = make_qkv(B=2, Hq=4, Hkv=2, T=T, S=S)
    ids_k = packed_ids(2, S, [3, 11, 20])
    ids_q = ids_k[:, S - T:] if T <= S else torch.cat([ids_k[:, :1].expand(2, T - S), ids_k], 1)
    kw = dict(causal=causal, segment_ids=ids_q, kv_segment_ids=ids_k, scale=0.3)
    tiles = plan_tiles(T, S, causal=causal, segment_ids=ids_q, kv_segment_ids=ids_k, device=q.device, tile=7)
    assert len(tiles) > 3 and all(t.mask is None or t.mask.shape[-2:] == (t.q1 - t.q0, t.k1 - t.k0) for t in tiles)
    assert all(t.q1 - t.q0 <= 7 and (t.mask is None or t.k1 - t.k0 <= 7) for t in tiles)
    out_r, lse_r, dout, dq_r, dk_r, dv_r = reference(q, k, v, **kw)
    (out, lse), dq, dk, dv = run_fn(lambda *a, **b: kernel_attention(kernel, *a, **b), q, k, v, dout, **kw)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_r))
    for name, a, b in [("out", out, out_r),
                       ("lse", torch.nan_to_num(lse, neginf=0.0), torch.nan_to_num(lse_r, neginf=0.0)),
                       ("dq", dq, dq_r), ("dk", dk, dk_r), ("dv", dv, dv_r)]:
        assert_close(name, a, b, 1e-5)


def test_causal_more_queries_than_keys_without_documents():
    q, k, v = make_qkv(B=1, Hq=4, Hkv=2, T=10, S=6)
    out_r, lse_r, dout, dq_r, dk_r, dv_r = reference(q, k, v, causal=True)
    (out, lse), dq, dk, dv = run_fn(lambda *a, **b: attention_with_lse(*a, backend="sdpa", **b), q, k, v, dout,
                                    causal=True)
    assert torch.isinf(lse[:, :, :4]).all() and torch.equal(out[:, :, :4], torch.zeros_like(out[:, :, :4]))
    for name, a, b in [("out", out, out_r), ("dq", dq, dq_r), ("dk", dk, dk_r), ("dv", dv, dv_r)]:
        assert_close(name, a, b, 1e-5)


def test_eager_kernel_row_chunks_are_exact():
    """The materialized kernel bounds its score memory by chunking query rows; results are unchanged."""
    q, k, v = make_qkv(B=2, Hq=4, Hkv=2, T=20, S=26)
    ids_k = packed_ids(2, 26, [9])
    kw = dict(causal=True, segment_ids=ids_k[:, 6:], kv_segment_ids=ids_k, scale=0.3)
    whole = EagerKernel()
    chunked = EagerKernel()
    chunked.max_score_elems = 2 * 4 * 26 * 3  # 3 query rows per chunk
    assert len(chunked._row_chunks(q, 26)) == 7
    out, lse = whole.forward(q, k, v, **kw)
    out_c, lse_c = chunked.forward(q, k, v, **kw)
    assert_close("out", out_c, out, 1e-6)
    assert_close("lse", lse_c, lse, 1e-6)
    dout = torch.randn_like(out)
    for name, a, b in zip("dq dk dv".split(), chunked.backward(dout, q, k, v, out, lse, **kw),
                          whole.backward(dout, q, k, v, out, lse, **kw)):
        assert_close(name, a, b, 1e-5)


@pytest.mark.parametrize("group_tokens", [1, 8, 2048])
@pytest.mark.parametrize("seed", range(12))
def test_document_runs_attention_matches_the_masked_reference(seed, group_tokens):
    """The GPU sdpa path for packed documents (unmasked causal calls for long documents, masked
    calls for groups of short ones, no T x T mask) equals masked attention in forward and
    backward (fp32 1e-5); here on CPU's SDPA kernels."""
    rng = random.Random(seed)
    B, T = rng.randint(1, 3), rng.randint(2, 48)
    Hq, Hkv = rng.choice([(4, 4), (4, 2), (9, 3), (3, 1)])
    q, k, v = make_qkv(B=B, Hq=Hq, Hkv=Hkv, T=T, S=T, seed=seed)
    cuts = sorted(rng.sample(range(1, T), min(T - 1, rng.randint(0, 5))))  # 1-token documents included
    ids = packed_ids(B, T, cuts)
    out_r, _, dout, dq_r, dk_r, dv_r = reference(q, k, v, causal=True, segment_ids=ids)
    out, dq, dk, dv = run_fn(lambda a, b, c, **kw: document_runs_attention(a, b, c, ids, group_tokens=group_tokens),
                             q, k, v, dout)
    for name, got, want in (("out", out, out_r), ("dq", dq, dq_r), ("dk", dk, dk_r), ("dv", dv, dv_r)):
        assert_close(name, got, want, 1e-5)


def test_document_runs_attention_declines_a_document_split_in_two_runs():
    """A row where one document id appears in two separate runs cannot be cut into independent
    causal calls: the function says so (None) and sdpa_attention masks instead."""
    q, k, v = make_qkv(B=1, Hq=4, Hkv=2, T=12, S=12)
    ids = torch.tensor([[0] * 4 + [1] * 4 + [0] * 4])
    assert document_runs_attention(q, k, v, ids) is None
    assert document_runs_attention(q, k, v, torch.tensor([[0] * 4 + [1] * 4 + [2] * 4])) is not None


def test_document_groups_keep_long_documents_alone_and_pack_short_neighbours():
    runs = [(0, 3, 0), (3, 5, 1), (5, 15, 2), (15, 16, 3), (16, 18, 4), (18, 22, 5), (22, 24, 6)]
    assert document_groups(runs, 4) == [(0, 3, 1), (3, 5, 1), (5, 15, 1), (15, 18, 2), (18, 22, 1), (22, 24, 1)]
    assert document_groups(runs, 100) == [(0, 24, 7)]
    assert document_groups(runs, 1) == [(a, e, 1) for a, e, _ in runs]
    groups = document_groups(runs, 6)
    assert [g[:2] for g in groups] == [(0, 5), (5, 15), (15, 18), (18, 24)]  # covering [0, 24) in order
    assert all(e - a <= 6 or n == 1 for a, e, n in groups)  # a group of several stays within the limit
