"""Varlen attention by tiles (plan_document_tiles): per batch row, each document's queries
against the same document's keys, unmasked. The tiles must cover exactly the pairs the
causal + document mask keeps, each pair once, and the sdpa kernel that runs them must match
the materialized reference, forward and backward."""
import random

import pytest
import torch

from helpers.attention import TOL, assert_close, make_qkv, reference, run_fn
from longctx.attention import EagerKernel, eager_attention, kernel_attention
from longctx.attention.core import build_mask
from longctx.attention.kernel import _disjoint, plan_document_tiles
from longctx.attention.sdpa import SdpaKernel


def random_runs(B, n, max_docs, rng, first_id=0):
    """(B, n) ids in contiguous runs (1..max_docs documents per row)."""
    rows = []
    for _ in range(B):
        cuts = sorted(rng.sample(range(1, n), min(n - 1, rng.randint(0, max_docs - 1)))) if n > 1 else []
        ids, doc = [], first_id
        for i in range(n):
            if cuts and i == cuts[0]:
                cuts.pop(0)
                doc += 1
            ids.append(doc)
        rows.append(ids)
    return torch.tensor(rows)


def covered(tiles, B, T, S):
    """(B, 1, T, S) count of tiles covering each (query, key) pair (causal squares lower-triangular)."""
    cover = torch.zeros(B, 1, T, S, dtype=torch.long)
    for t in tiles:
        block = torch.ones(t.q1 - t.q0, t.k1 - t.k0, dtype=torch.long)
        if t.is_causal:
            assert t.q1 - t.q0 == t.k1 - t.k0, "causal tiles are squares"
            block = block.tril()
        rows = range(B) if t.row is None else [t.row]
        for b in rows:
            cover[b, 0, t.q0:t.q1, t.k0:t.k1] += block
    return cover


@pytest.mark.parametrize("seed", range(40))
def test_tiles_cover_exactly_the_visible_pairs(seed):
    rng = random.Random(seed)
    B, causal = rng.randint(1, 3), rng.random() < 0.75
    T = rng.randint(2, 40)
    S = rng.choice([T, rng.randint(1, 40)])
    kv = random_runs(B, S, 4, rng)
    if T == S and rng.random() < 0.7:
        q = kv  # one local sequence (self-attention of a packed row)
    else:  # an independent layout (a ring block): queries may hold documents the keys lack
        q = random_runs(B, T, 4, rng, first_id=rng.randint(0, 2))
    tiles = plan_document_tiles(B, T, S, causal=causal, segment_ids=q, kv_segment_ids=kv)
    want = build_mask(T, S, causal=causal, segment_ids=q, kv_segment_ids=kv, device="cpu")
    want = want.expand(B, 1, T, S).long()
    got = covered(tiles, B, T, S)
    assert torch.equal(got, want), f"tiles {tiles}"  # every kept pair once, nothing else
    assert all(t.mask is None for t in tiles)


def test_same_document_layout_gives_one_aligned_square_per_document():
    ids = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4, [3] * 16])
    tiles = plan_document_tiles(2, 16, 16, causal=True, segment_ids=ids, kv_segment_ids=None)
    spans = [(t.row, t.q0, t.q1, t.k0, t.k1, t.is_causal) for t in tiles]
    assert spans == [(0, 0, 5, 0, 5, True), (0, 5, 12, 5, 12, True), (0, 12, 16, 12, 16, True),
                     (1, 0, 16, 0, 16, True)]
    assert _disjoint(tiles)


def test_without_documents_one_tile_per_row():
    tiles = plan_document_tiles(3, 6, 10, causal=True, segment_ids=None, kv_segment_ids=None)
    assert [(t.row, t.q0, t.q1, t.k0, t.k1, t.is_causal) for t in tiles] == [
        (b, q0, 6, k0, k1, c) for b in range(3) for q0, k0, k1, c in ((0, 0, 4, False), (0, 4, 10, True))]
    assert not _disjoint(tiles)  # prefix and square share their queries: outputs are merged


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T, S, causal", [(40, 40, True), (40, 40, False), (16, 40, True), (40, 16, True)])
def test_sdpa_document_runs_match_reference(dtype, T, S, causal):
    """The CPU sdpa kernel runs these tiles (GQA 4:2, documents of different lengths per row,
    a key layout that lacks some query documents) and matches the fp32 reference."""
    rng = random.Random(T * 100 + S + causal)
    kv_ids = random_runs(3, S, 4, rng)
    q_ids = kv_ids if T == S else random_runs(3, T, 3, rng)
    q, k, v = make_qkv(B=3, Hq=4, Hkv=2, T=T, S=S, dtype=dtype)
    kw = dict(causal=causal, segment_ids=q_ids, kv_segment_ids=kv_ids, scale=0.3)
    out_r, lse_r, dout, dq_r, dk_r, dv_r = reference(q, k, v, **kw)
    (out, lse), dq, dk, dv = run_fn(lambda *a, **b: kernel_attention(SdpaKernel(), *a, **b), q, k, v, dout, **kw)
    assert out.dtype == dtype and dq.dtype == dtype
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_r))  # rows that see nothing: -inf, out 0
    tol = TOL[dtype]
    for name, a, b in [("out", out, out_r),
                       ("lse", torch.nan_to_num(lse, neginf=0.0), torch.nan_to_num(lse_r, neginf=0.0)),
                       ("dq", dq, dq_r), ("dk", dk, dk_r), ("dv", dv, dv_r)]:
        assert_close(name, a, b, tol)


def test_document_runs_agree_with_masked_tiles_in_fp32():
    """The same block computed by document runs (sdpa) and by masked tiles (eager kernel)."""
    rng = random.Random(3)
    ids = random_runs(4, 48, 5, rng)
    q, k, v = make_qkv(B=4, Hq=4, Hkv=4, T=48, S=48)
    kw = dict(causal=True, segment_ids=ids, kv_segment_ids=ids)
    out_a, lse_a = SdpaKernel().forward(q, k, v, **kw)
    out_b, lse_b = EagerKernel().forward(q, k, v, **kw)
    assert_close("out", out_a, out_b, 1e-5)
    assert_close("lse", lse_a, lse_b, 1e-5)
    assert_close("eager_attention", out_a, eager_attention(q, k, v, **kw), 1e-5)
