"""Packing: nothing lost or duplicated, positions restart per document, labels at the
edges, no attention across documents, flash-attn's varlen boundaries at the document starts."""
from collections import Counter

import numpy as np
import pytest
import torch

from helpers.data import collect, file_config, make_texts, rebuild_documents, write_jsonl
from longctx.attention import build_mask
from longctx.attention.varlen import build_plan
from longctx.data import ByteTokenizer, build_loader

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    texts = make_texts(120, seed=3, min_words=1, max_words=40)  # 10 .. 300 bytes, seq_len 64
    path = write_jsonl(tmp_path_factory.mktemp("pack") / "docs.jsonl", texts)
    return path, texts


def expected_docs(texts):
    return Counter(tuple(TOK.encode(t, add_bos=True, add_eos=True)) for t in texts)


@pytest.mark.parametrize("packing", ["carry", "pad", "fit"])
@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_epoch_loses_and_duplicates_no_token(corpus, packing, dp_size):
    path, texts = corpus
    got = Counter()
    total_real = 0
    for rank in range(dp_size):
        cfg = file_config(path, epochs=1, packing=packing, shuffle_window=16)
        batches = collect(build_loader(cfg, TOK, dp_rank=rank, dp_size=dp_size, seed=5))
        got.update(rebuild_documents(batches, TOK.bos_id, TOK.pad_id))
        total_real += sum(int((b["input_ids"] != TOK.pad_id).sum()) for b in batches)
    assert got == expected_docs(texts)  # every document exactly once, whole, in one piece order
    assert total_real == sum(len(t.encode()) + 2 for t in texts)


def test_carry_fills_rows_completely(corpus):
    path, _ = corpus
    batches = collect(build_loader(file_config(path, epochs=1, packing="carry"), TOK, dp_rank=0, dp_size=1, seed=0))
    ids = np.concatenate([b["input_ids"] for b in batches])
    pad_rows = [(r == TOK.pad_id).any() for r in ids]
    assert not any(pad_rows[:-2])  # only the final partial row (and padding rows after it)


def check_row_invariants(b, bos_id, cross_doc=False):
    ids, lab, pos, seg = b["input_ids"], b["labels"], b["position_ids"], b["segment_ids"]
    B, T = ids.shape
    for r in range(B):
        for t in range(T):
            if t == 0:
                assert pos[r, t] == 0
            elif seg[r, t] != seg[r, t - 1]:
                assert pos[r, t] == 0  # a new segment restarts positions
            else:
                assert pos[r, t] == pos[r, t - 1] + 1
            if ids[r, t] == bos_id:
                assert pos[r, t] == 0  # every document start is a position 0
        for t in range(T - 1):
            if lab[r, t] == -100:
                continue
            if seg[r, t + 1] == seg[r, t]:
                assert lab[r, t] == ids[r, t + 1]  # pre-shifted target inside a document
            elif cross_doc:
                assert lab[r, t] == ids[r, t + 1] == bos_id
            else:
                raise AssertionError("label crosses a document boundary")


@pytest.mark.parametrize("cross_doc", [False, True])
def test_positions_restart_and_labels_at_edges(corpus, cross_doc):
    path, _ = corpus
    cfg = file_config(path, epochs=1, cross_document_labels=cross_doc)
    batches = collect(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=1))
    n_ignored_eos = 0
    for b in batches:
        check_row_invariants(b, TOK.bos_id, cross_doc)
        eos = b["input_ids"] == TOK.eos_id
        n_ignored_eos += int((b["labels"][eos] == -100).sum())
        assert (b["labels"][b["input_ids"] == TOK.pad_id] == -100).all()
    if not cross_doc:  # the last token of every document is ignored
        assert n_ignored_eos == sum(int((b["input_ids"] == TOK.eos_id).sum()) for b in batches)
    else:
        assert n_ignored_eos < sum(int((b["input_ids"] == TOK.eos_id).sum()) for b in batches)


def test_carried_piece_keeps_its_target_at_the_row_end(corpus):
    path, _ = corpus
    batches = collect(build_loader(file_config(path, epochs=1, packing="carry"), TOK, dp_rank=0, dp_size=1, seed=2))
    rows = [(b["input_ids"][r], b["labels"][r]) for b in batches for r in range(b["input_ids"].shape[0])]
    carried = 0
    for (ids, lab), (nids, _) in zip(rows, rows[1:]):
        if nids[0] != TOK.bos_id and nids[0] != TOK.pad_id:  # next row continues a document
            assert lab[-1] == nids[0]
            carried += 1
    assert carried > 10


def test_no_attention_across_documents(corpus):
    path, _ = corpus
    b = next(iter(build_loader(file_config(path, mbs=4), TOK, dp_rank=0, dp_size=1, seed=0)))
    seg = b["segment_ids"]
    B, T = seg.shape
    mask = build_mask(T, T, causal=True, segment_ids=seg, kv_segment_ids=None, device=seg.device)[:, 0]
    # ground truth from the tokens alone: a document starts at BOS, at the row start (a
    # carried piece) and where padding begins
    ids = b["input_ids"]
    start = ids == TOK.bos_id
    start[:, 0] = True
    start[:, 1:] |= (ids[:, 1:] == TOK.pad_id) & (ids[:, :-1] != TOK.pad_id)
    doc = torch.cumsum(start.long(), dim=1)
    same_doc = doc[:, :, None] == doc[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    assert torch.equal(mask, same_doc & causal)
    assert int(mask.sum()) < int(causal.sum()) * B  # several documents per row really are masked
    # with masking off everything is one segment: plain causal attention
    b2 = next(iter(build_loader(file_config(path, mbs=4, document_masking=False), TOK, dp_rank=0, dp_size=1, seed=0)))
    assert int(b2["segment_ids"].abs().sum()) == 0
    assert torch.equal(b2["input_ids"], b["input_ids"])


def test_flash_varlen_sequences_are_the_packed_documents(corpus):
    """The loader's segment ids as the varlen kernels get them (VarlenKernel's plan): one sequence
    per document piece, each starting where the positions restart."""
    path, _ = corpus
    b = next(iter(build_loader(file_config(path, mbs=4), TOK, dp_rank=0, dp_size=1, seed=0)))
    B, T = b["segment_ids"].shape
    plan = build_plan(B, T, T, causal=True, segment_ids=b["segment_ids"], kv_segment_ids=None, device="cpu")
    assert plan.whole  # packed rows are contiguous runs: one varlen call over every token, no gather
    cu, max_len = plan.calls[0].cu_q, plan.calls[0].max_q
    flat_pos = b["position_ids"].reshape(-1)
    starts = (flat_pos == 0).nonzero().squeeze(1)
    assert len(starts) > 4  # some row holds several documents
    assert cu.tolist() == starts.tolist() + [flat_pos.numel()]
    assert max_len == int(flat_pos.max()) + 1  # the longest piece: positions count up from 0 within each
