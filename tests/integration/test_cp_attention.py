"""Context-parallel attention on gloo vs single-process eager attention on the whole sequence.

One spawned process group per world size runs every case (impl x dtype x causal x GQA/MQA x
packed documents); each rank checks its output shard and its dQ/dK/dV shards.
"""
import itertools

import torch

from helpers.attention import TOL, packed_ids
from helpers.cp import check_all, max_err, run_distributed
from longctx.attention import ReferenceVarlen, VarlenKernel, eager_attention
from longctx.parallel import make_cp_attention, shard_sequence

# (8, 4): two kv heads per Ulysses member at world 2, so its backward runs by head groups
HEADS = {"gqa4": (8, 2), "gqa2": (8, 4), "mqa": (4, 1)}


def _attention_worker(rank, world, impls, L, boundaries, backend):
    B, D = 2, 8
    checks = []
    # "varlen-reference": the CUDA varlen kernels' plumbing (cu_seqlens per block, LSE merge) over
    # an exact CPU stand-in with their API
    kernel = VarlenKernel(ReferenceVarlen()) if backend == "varlen-reference" else None
    cps = {name: make_cp_attention(None, impl=impl, ulysses_size=u, backend=backend, kernel=kernel)
           for name, (impl, u) in impls.items()}
    for dtype, causal, heads, docs in itertools.product(TOL, (True, False), HEADS, (False, True)):
        Hq, Hkv = HEADS[heads]
        g = torch.Generator().manual_seed(1234)
        q = torch.randn(B, Hq, L, D, generator=g).to(dtype)
        k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
        v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
        # O(1) gradient magnitudes: an absolute bf16 bound is only meaningful there (spacing at 4.0 is 0.016)
        dout = 0.25 * torch.randn(B, Hq, L, D, generator=g)
        seg = packed_ids(B, L, boundaries) if docs else None
        # reference: fp32 eager on the whole sequence (same bf16-rounded inputs)
        qr, kr, vr = (x.float().requires_grad_() for x in (q, k, v))
        ref = eager_attention(qr, kr, vr, causal=causal, scale=0.35, segment_ids=seg)
        ref.backward(dout)
        want = {"out": ref, "dq": qr.grad, "dk": kr.grad, "dv": vr.grad}
        shard = lambda x: shard_sequence(x, rank, world, dim=2)  # noqa: E731
        for name, attn in cps.items():
            ql, kl, vl = (shard(x).detach().requires_grad_() for x in (q, k, v))
            seg_l = None if seg is None else shard_sequence(seg, rank, world, dim=1)
            out = attn(ql, kl, vl, causal=causal, scale=0.35, segment_ids=seg_l)
            out.backward(shard(dout).to(dtype))
            case = f"{name}/{str(dtype)[6:]}/{'causal' if causal else 'full'}/{heads}/{'docs' if docs else 'nodocs'}"
            assert out.dtype == dtype and kl.grad.shape == kl.shape
            for what, got in (("out", out), ("dq", ql.grad), ("dk", kl.grad), ("dv", vl.grad)):
                checks.append((case, what, max_err(got, shard(want[what])), TOL[dtype]))
    return checks


N_VARIANTS = 2 * 2 * len(HEADS) * 2  # dtype x causal x heads x docs


def test_cp_attention_world2():
    impls = {"ring": ("ring", None), "allgather": ("allgather", None), "ulysses": ("ulysses", None)}
    # L=24 -> 4 chunks of 6; boundaries inside chunks (4, 15) and on shard boundaries (6, 18)
    res = run_distributed(_attention_worker, 2, impls, 24, [4, 6, 15, 18], "sdpa")
    check_all(res, min_checks=len(impls) * N_VARIANTS * 4)


def test_cp_attention_world4_and_hybrid_2x2():
    impls = {"ring": ("ring", None), "allgather": ("allgather", None), "ulysses": ("ulysses", None),
             "hybrid2x2": ("hybrid", 2)}
    # L=32 -> 8 chunks of 4; a document spanning chunks 2..5 (ranks 2, 3, 3, 2), cuts at 6 and 8
    res = run_distributed(_attention_worker, 4, impls, 32, [6, 8, 21], "sdpa")
    check_all(res, min_checks=len(impls) * N_VARIANTS * 4)


def test_cp_attention_varlen_plumbing_world2_and_hybrid_world4():
    """Every CP impl over VarlenKernel (the CUDA kernels' cu_seqlens plan and LSE merge) with the
    exact stand-in: documents inside chunks, on shard boundaries and spanning ranks."""
    impls = {"ring": ("ring", None), "allgather": ("allgather", None), "ulysses": ("ulysses", None)}
    res = run_distributed(_attention_worker, 2, impls, 24, [4, 6, 15, 18], "varlen-reference")
    check_all(res, min_checks=len(impls) * N_VARIANTS * 4)
    res = run_distributed(_attention_worker, 4, {"hybrid2x2": ("hybrid", 2)}, 32, [6, 8, 21], "varlen-reference")
    check_all(res, min_checks=N_VARIANTS * 4)


def test_cp_ring_eager_kernel_and_no_overlap_world2():
    """The same ring with the explicit-gradient eager block kernel, and with overlap disabled."""
    res = run_distributed(_ring_variants_worker, 2)
    check_all(res, min_checks=2 * 4)


def _ring_variants_worker(rank, world):
    L, B, D, Hq, Hkv = 16, 1, 8, 4, 2
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, Hq, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g),
               torch.randn(B, Hkv, L, D, generator=g))
    dout = torch.randn(B, Hq, L, D, generator=g)
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ref = eager_attention(qr, kr, vr, causal=True)
    ref.backward(dout)
    shard = lambda x: shard_sequence(x, rank, world, dim=2)  # noqa: E731
    checks = []
    for name, attn in {"eager-kernel": make_cp_attention(None, "ring", backend="eager"),
                       "no-overlap": make_cp_attention(None, "ring", overlap=False)}.items():
        ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
        out = attn(ql, kl, vl, causal=True)
        out.backward(shard(dout))
        for what, got, want in (("out", out, ref), ("dq", ql.grad, qr.grad), ("dk", kl.grad, kr.grad),
                                ("dv", vl.grad, vr.grad)):
            checks.append((name, what, max_err(got, shard(want)), 1e-5))
    return checks


def _head_groups_worker(rank, world):
    """The pure-Ulysses backward by head groups against one pass over every head (groups=1)."""
    from longctx.parallel.hybrid import _Attention, _ulysses_backward_by_head_groups
    from longctx.parallel.saved import SavedForward

    attn = make_cp_attention(None, "ulysses")
    B, Hq, Hkv, L, D = 2, 8, 4, 32, 8
    checks = []
    for dtype in TOL:
        g = torch.Generator().manual_seed(3)
        q, dout = (torch.randn(B, Hq, L, D, generator=g).to(dtype) for _ in range(2))
        k, v = (torch.randn(B, Hkv, L, D, generator=g).to(dtype) for _ in range(2))
        seg = packed_ids(B, L, [5, 13, 20])
        ql, kl, vl, dl = (shard_sequence(x, rank, world, dim=2) for x in (q, k, v, dout))
        seg_l = shard_sequence(seg, rank, world, dim=1)
        out, lse = attn.attention_with_lse(ql, kl, vl, causal=True, segment_ids=seg_l)
        full_seg = attn._global_segments(seg_l)
        by_groups, one_pass = (
            _ulysses_backward_by_head_groups(dl, SavedForward(ql, kl, vl, out, lse),
                                             _Attention(attn.ulysses, attn.ring, attn.kernel, True, D ** -0.5,
                                                        full_seg), groups)
            for groups in (Hkv // world, 1))
        for what, a, b in zip(("dq", "dk", "dv"), by_groups, one_pass):
            checks.append((str(dtype), what, float(not torch.equal(a, b)), 0.0))
    return checks


def test_ulysses_backward_by_head_groups_is_one_pass_bit_for_bit():
    check_all(run_distributed(_head_groups_worker, 2), min_checks=2 * 3)
