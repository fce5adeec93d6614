"""The CUDA attention paths' CPU-verifiable parts: VarlenKernel's cu_seqlens plan over the exact
stand-in with the kernels' API (documents, GQA, bottom-right causal, CP-style blocks merged by
LSE), FlexAttention's document block mask (forward; torch has no flex backward on CPU), and
`auto`'s rule against the H100 measurements it was derived from."""
import pytest
import torch

from helpers.attention import (
    DOC_CASES,
    assert_close,
    blocks_vs_whole,
    document_ids,
    make_qkv,
    packed_ids,
    reference,
    run_fn,
)
from longctx.attention import eager_attention
from longctx.attention.dispatch import AutoAttention, DocumentStats, choose, document_stats
from longctx.attention.flex import document_block_mask, flex_document_attention
from longctx.attention.varlen import VarlenKernel, build_plan, make_varlen_attention
from longctx.attention.varlen_ops import ReferenceVarlen, VarlenOps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", DOC_CASES, ids=[f"c{i}" for i in range(len(DOC_CASES))])
def test_varlen_attention_matches_reference(case, dtype):
    Hq, Hkv, T, S, causal, bounds = case
    q, k, v = make_qkv(B=2, Hq=Hq, Hkv=Hkv, T=T, S=S, dtype=dtype)
    seg, kv_seg = document_ids(2, T, S, bounds)
    kw = dict(causal=causal, segment_ids=seg, kv_segment_ids=kv_seg)
    want_out, want_lse, dout, dq, dk, dv = reference(q, k, v, **kw)
    out, gq, gk, gv = run_fn(make_varlen_attention(ReferenceVarlen()), q, k, v, dout, **kw)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for name, got, want in (("out", out, want_out), ("dq", gq, dq), ("dk", gk, dk), ("dv", gv, dv)):
        assert got.dtype == dtype
        assert_close(name, got, want, tol)
    _, lse = VarlenKernel().forward(q, k, v, **kw)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))  # rows that see nothing: -inf
    finite = ~torch.isinf(want_lse)
    assert_close("lse", lse[finite], want_lse[finite], 1e-5)


def test_a_document_in_two_runs_is_merged_exactly():
    """Ids that re-appear after another document (not contiguous runs): the same query meets two
    key runs, in two calls merged through their LSE."""
    q, k, v = make_qkv(B=1, Hq=4, Hkv=2, T=16, S=16)
    seg = torch.tensor([[0] * 5 + [1] * 4 + [0] * 7])
    want_out, _, dout, dq, dk, dv = reference(q, k, v, causal=True, segment_ids=seg)
    plan = build_plan(1, 16, 16, causal=True, segment_ids=seg, kv_segment_ids=None, device="cpu")
    assert not plan.q_unique and len(plan.calls) >= 2
    out, gq, gk, gv = run_fn(make_varlen_attention(ReferenceVarlen()), q, k, v, dout, causal=True, segment_ids=seg)
    for name, got, want in (("out", out, want_out), ("dq", gq, dq), ("dk", gk, dk), ("dv", gv, dv)):
        assert_close(name, got, want, 1e-5)


def test_ring_style_blocks_merge_to_the_whole_attention():
    """A query chunk against earlier keys (fully visible) and its own chunk (causal), each block
    through VarlenKernel with the block's ids, merged by LSE; the backward of each block given the
    final out/lse sums to the whole gradient (what ring attention does per step)."""
    for name, err in blocks_vs_whole(VarlenKernel(ReferenceVarlen()), torch.float32, "cpu").items():
        assert err <= 1e-5, (name, err)


def test_plan_is_one_call_over_the_documents():
    """Packed rows: one causal call whose sequences are exactly the documents, no token gather;
    whole rows: one sequence per row."""
    seg = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [5, 5, 6, 6, 6, 6, 6, 6]])
    plan = build_plan(2, 8, 8, causal=True, segment_ids=seg, kv_segment_ids=None, device="cpu")
    assert plan.whole and len(plan.calls) == 1 and plan.q_unique and plan.k_unique
    call = plan.calls[0]
    assert call.causal and call.q_index is None and call.k_index is None
    assert call.cu_q.tolist() == [0, 3, 5, 8, 10, 16] and call.cu_q.dtype == torch.int32
    assert (call.max_q, call.max_k) == (6, 6)
    rows = build_plan(3, 8, 8, causal=True, segment_ids=None, kv_segment_ids=None, device="cpu").calls
    assert len(rows) == 1 and rows[0].cu_q.tolist() == [0, 8, 16, 24]
    decode = build_plan(2, 1, 9, causal=True, segment_ids=None, kv_segment_ids=None, device="cpu").calls[0]
    assert decode.cu_q.tolist() == [0, 1, 2] and decode.cu_k.tolist() == [0, 9, 18]
    assert decode.causal  # bottom-right causal: the one query of a decode step sees its whole cache


def test_plan_cu_seqlens_from_segments():
    """Rows flattened; a sequence at every row start and id change, the same id in two rows two
    sequences; an id that re-appears in its row is no single call."""
    def one_call(ids):
        plan = build_plan(*ids.shape, ids.shape[1], causal=True, segment_ids=ids, kv_segment_ids=None, device="cpu")
        return plan.calls[0]

    call = one_call(torch.tensor([[0, 0, 1, 1, 1], [3, 3, 3, 4, 4]]))
    assert call.cu_q.tolist() == [0, 2, 5, 8, 10] and call.cu_q.dtype == torch.int32 and call.max_q == 3
    call = one_call(torch.zeros(2, 4, dtype=torch.long))
    assert call.cu_q.tolist() == [0, 4, 8] and call.max_q == 4  # one id in both rows: still a sequence per row
    plan = build_plan(1, 3, 3, causal=True, segment_ids=torch.tensor([[0, 1, 0]]), kv_segment_ids=None, device="cpu")
    assert len(plan.calls) == 2 and not plan.q_unique  # id 0 re-appears: two calls merged by LSE


def test_plan_cache_follows_the_ids_tensor():
    kernel = VarlenKernel(ReferenceVarlen())
    q, k, _ = make_qkv(B=1, Hq=2, Hkv=1, T=8, S=8)
    seg = torch.tensor([[0, 0, 1, 1, 1, 1, 2, 2]])
    first = kernel.varlen_plan(q, k, True, seg, None)
    assert kernel.varlen_plan(q, k, True, seg, None) is first  # every layer reuses it
    seg[0, 6:] = 1  # edited in place: planned again, from the new ids
    again = kernel.varlen_plan(q, k, True, seg, None)
    assert again is not first and again.calls[0].cu_q.tolist() == [0, 2, 8]


class _Refuses(VarlenOps):
    name = "refuses"

    def fwd(self, *args):
        raise AssertionError("a flash kernel got fp32 inputs")

    bwd = fwd


def test_fp32_inputs_take_exact_math_not_a_half_precision_kernel():
    q, k, v = make_qkv(B=1, Hq=4, Hkv=2, T=12, S=12)
    seg = packed_ids(1, 12, [5])
    out, _ = VarlenKernel(_Refuses()).forward(q, k, v, causal=True, segment_ids=seg)
    assert_close("out", out, eager_attention(q, k, v, causal=True, segment_ids=seg), 1e-5)
    with pytest.raises(AssertionError, match="fp32 inputs"):
        VarlenKernel(_Refuses()).forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True, segment_ids=seg)


@pytest.mark.parametrize("T, bounds, block", [(300, [5, 130, 131, 290], 128), (64, [3, 17, 40], 16),
                                              (200, [], 32), (96, [31, 32, 64], 32)])
def test_flex_document_block_mask_matches_reference(T, bounds, block):
    """Partial and full key blocks, documents across and on block edges, a ragged last block."""
    q, k, v = make_qkv(B=2, Hq=4, Hkv=2, T=T, S=T)
    seg = packed_ids(2, T, bounds)
    with torch.no_grad():
        out = flex_document_attention(q, k, v, seg, block_mask=document_block_mask(seg, block=block))
    assert_close("flex", out, eager_attention(q, k, v, causal=True, segment_ids=seg), 1e-5)


def test_flex_block_mask_skips_other_documents():
    """Two 256-token documents, 128-token blocks: the second document's blocks never list the first's."""
    seg = torch.tensor([[0] * 256 + [1] * 256])
    mask = document_block_mask(seg)
    partial, full = mask.kv_num_blocks[0, 0].tolist(), mask.full_kv_num_blocks[0, 0].tolist()
    assert partial == [1, 1, 1, 1]  # only the diagonal block needs the mask function
    assert full == [0, 1, 0, 1]  # block 3 sees block 2 in full, never blocks 0-1


# The H100 measurement the rule comes from (forward + backward ms, bf16, one row; docs/results/
# 2026-12-05-gpu-attention-dispatch.md). Methods: sdpa (whole row, no boundaries: only a valid
# choice for one document), per-document, varlen (torch's), flex. None: not measured (OOM).
H100 = [
    # (head_dim, T, docs, {method: ms})
    (64, 32768, 1, {"sdpa": 9.9, "per-document": 10.2, "varlen": 15.2, "flex": 14.7}),
    (64, 32768, 16, {"per-document": 5.2, "varlen": 3.6, "flex": 4.0}),
    (64, 32768, 64, {"per-document": 15.6, "varlen": 1.42, "flex": 1.41}),
    (64, 131072, 16, {"per-document": 26.0, "varlen": 28.1}),
    (128, 32768, 1, {"sdpa": 54.4, "per-document": 56.8, "varlen": 92.8, "flex": 76.2}),
    (128, 32768, 16, {"per-document": 18.9, "varlen": 15.1, "flex": 12.9}),
    (128, 32768, 64, {"per-document": 43.4, "varlen": 6.0, "flex": 5.3}),
]


@pytest.mark.parametrize("head_dim, T, docs, ms", H100, ids=[f"d{d}-{t // 1024}k-{n}docs" for d, t, n, _ in H100])
def test_auto_rule_is_within_10_percent_of_the_fastest_measured(head_dim, T, docs, ms):
    stats = DocumentStats(rows=1, documents=docs, tokens=T, contiguous=True)
    chosen = choose(stats, head_dim, frozenset({"varlen", "flex"}))
    assert chosen in ms, f"{chosen} was not measured for this shape"
    assert ms[chosen] <= 1.1 * min(ms.values()), (chosen, ms)


def test_auto_rule_structure():
    packed = DocumentStats(rows=2, documents=9, tokens=8192, contiguous=True)
    assert choose(None, 64, frozenset({"varlen", "flex"})) == "sdpa"
    assert choose(DocumentStats(2, 2, 8192, True), 64, frozenset({"varlen"})) == "sdpa"  # one document per row
    assert choose(packed, 64, frozenset({"fa4", "varlen", "flex"})) == "fa4"
    assert choose(packed, 64, frozenset({"flash", "varlen", "flex"})) == "flash"
    assert choose(packed, 128, frozenset({"varlen"})) == "varlen"  # no triton: no flex
    assert choose(DocumentStats(1, 3, 96, False), 128, frozenset({"varlen", "flex"})) == "varlen"
    assert choose(packed, 64, frozenset()) == "per-document"  # a CUDA build without flash kernels


def test_document_stats_and_auto_on_cpu():
    stats = document_stats(torch.tensor([[0, 0, 1, 1], [2, 2, 2, 2]]))
    assert (stats.rows, stats.documents, stats.tokens, stats.contiguous) == (2, 3, 8, True)
    assert not document_stats(torch.tensor([[0, 1, 0]])).contiguous
    q, k, _ = make_qkv(B=1, Hq=2, Hkv=1, T=8, S=8, dtype=torch.bfloat16)
    auto = AutoAttention(torch.device("cpu"))
    assert auto.available == frozenset()
    assert auto.method(q, k, True, torch.zeros(1, 8, dtype=torch.long), None) == "sdpa"  # CPU: the sdpa backend
