"""longctx/eval/ppl_targets.py: every length scores the same target tokens, and the NLL equals a
cross-entropy over the full logits of those positions."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from longctx.base.labels import IGNORE_INDEX
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.ppl_targets import perplexity, plan_targets, score_windows, target_ends, windows_for
from longctx.model import build_model, get_preset


def test_target_ends_are_spaced_from_the_longest_window_to_the_end():
    assert target_ends(100, 40, 4) == [40, 60, 80, 100]
    assert target_ends(39, 40, 4) == []
    assert target_ends(41, 40, 8) == [40, 41]  # no end twice


def test_every_length_predicts_the_same_tokens():
    toks = list(range(1000, 1300))
    for bos in (None, 7):
        targets = set()
        for length in (16, 32, 64):
            ids, labels = windows_for(toks, 200, length, 8, bos)
            assert len(ids) == len(labels) == length
            targets.add(tuple(x for x in labels if x != IGNORE_INDEX))
            assert (ids[0] == bos) if bos is not None else ids[0] == toks[200 - length]
        assert targets == {tuple(toks[192:200])}


def test_nll_equals_cross_entropy_of_the_full_logits():
    torch.manual_seed(0)
    model = build_model(get_preset("debug-tiny", max_position_embeddings=256), seed=0).eval()
    tok = load_tokenizer("byte")
    docs = [[int(x) for x in torch.randint(0, 255, (n,))] for n in (150, 90, 200)]
    spans = plan_targets(docs, 128, 3)
    assert [d for d, _ in spans] == [0, 0, 0, 2, 2, 2]
    rows = score_windows(model, tok, docs, spans, 64, 16, chunk=8)
    for row in rows:
        ids, labels = windows_for(docs[row["doc"]], row["end"], 64, 16, tok.bos_id if tok.adds_bos else None)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).float()[0]
        want = F.cross_entropy(logits, torch.tensor(labels), ignore_index=IGNORE_INDEX, reduction="sum")
        assert row["tokens"] == 16 and abs(row["nll"] - float(want)) < 1e-3 * max(1.0, float(want))
    assert perplexity(rows) > 1.0
