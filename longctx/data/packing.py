"""Rows of packed documents: their format, the builder that fills one, and the batch they make.

A row (all int32, (T,)):
    input_ids     tokens; padding uses the tokenizer's pad id (EOS, else 0 if it has none)
    labels        PRE-SHIFTED targets: labels[t] is the token that follows input_ids[t] in
                  the same document; -100 at padding and at the last token of a document
                  (unless cross_document_labels, where it is the next document's first token
                  when that one starts in the same row)
    position_ids  0, 1, 2, ... restarting at every document start (and at the piece of a
                  document carried over from the previous row, and at the padding)
    segment_ids   0, 1, 2, ... one id per document piece in the row; the padding is one more
                  segment of its own
    answer        bool, labels[t] is an answer token (synthetic corpus), or None

The packers that fill rows from a document stream (carry, pad, fit) are in packers.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from longctx.base.labels import IGNORE_INDEX
from longctx.data.documents import Doc


@dataclass
class Row:
    input_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray
    segment_ids: np.ndarray
    answer: Optional[np.ndarray]
    n_real: int  # tokens that are not padding


def empty_row(seq_len: int, pad_id: int, answer: bool) -> Row:
    """A row of padding only (used to complete the last batch of a finite epoch)."""
    return Row(
        np.full(seq_len, pad_id, np.int32), np.full(seq_len, IGNORE_INDEX, np.int32),
        np.arange(seq_len, dtype=np.int32), np.zeros(seq_len, np.int32),
        np.zeros(seq_len, bool) if answer else None, 0,
    )


class RowBuilder:
    """One row being filled with document pieces, left to right; the rest becomes padding."""

    def __init__(self, seq_len: int, pad_id: int, answer: bool, cross_document_labels: bool):
        T = self.T = seq_len
        self.ids = np.full(T, pad_id, dtype=np.int32)
        self.labels = np.full(T, IGNORE_INDEX, dtype=np.int32)
        self.pos = np.zeros(T, dtype=np.int32)
        self.seg = np.zeros(T, dtype=np.int32)
        self.ans = np.zeros(T, dtype=bool) if answer else None
        self.cross = cross_document_labels
        self.fill, self.seg_id = 0, 0
        self.prev_ended = False  # the piece before `fill` ended its document

    @property
    def space(self) -> int:
        return self.T - self.fill

    def put(self, d: Doc, off: int, take: int) -> int:
        """Append d.tokens[off:off + take] as a new segment; returns take."""
        a = self.fill
        self.ids[a : a + take] = d.tokens[off : off + take]
        nxt = d.tokens[off + 1 : off + take + 1]  # take, or take - 1 when the doc ends here
        self.labels[a : a + len(nxt)] = nxt
        if self.ans is not None and d.answer is not None:
            self.ans[a : a + len(nxt)] = d.answer[off + 1 : off + take + 1]
        if self.cross and self.prev_ended and off == 0:
            self.labels[a - 1] = d.tokens[0]
        self.pos[a : a + take] = np.arange(take, dtype=np.int32)
        self.seg[a : a + take] = self.seg_id
        self.seg_id += 1
        self.fill += take
        self.prev_ended = off + take == len(d)
        return take

    def finish(self) -> Row:
        f, T = self.fill, self.T
        if f < T:
            self.pos[f:] = np.arange(T - f, dtype=np.int32)
            self.seg[f:] = self.seg_id
        return Row(self.ids, self.labels, self.pos, self.seg, self.ans, f)


def rows_to_batch(rows, *, document_masking: bool, answer_mask: bool) -> dict:
    """Stack rows into the loader's batch: LongTensors (B, T) (+ answer_mask, bool), and
    real_tokens (B,): each row's tokens that are not padding."""
    batch = {
        "input_ids": torch.from_numpy(np.stack([r.input_ids for r in rows]).astype(np.int64)),
        "labels": torch.from_numpy(np.stack([r.labels for r in rows]).astype(np.int64)),
        "position_ids": torch.from_numpy(np.stack([r.position_ids for r in rows]).astype(np.int64)),
        "real_tokens": torch.tensor([r.n_real for r in rows], dtype=torch.int64),
    }
    if document_masking:
        batch["segment_ids"] = torch.from_numpy(np.stack([r.segment_ids for r in rows]).astype(np.int64))
    else:
        batch["segment_ids"] = torch.zeros_like(batch["input_ids"])
    if answer_mask:
        T = len(rows[0].input_ids)
        batch["answer_mask"] = torch.from_numpy(
            np.stack([r.answer if r.answer is not None else np.zeros(T, bool) for r in rows])
        )
    return batch


def fold_trailing_padding(segment_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Give a row's last segment the id of the one before it when none of its labels count.

    segment_ids, labels: (B, T) -> (B, T). Under causal attention no token attends to a later
    one, so tokens at the end of a row whose labels are all ignored (the padding of `pad`
    packing) can share the last document's segment without changing the loss or any
    gradient: their own outputs are never scored, and no scored token sees them. The
    attention kernels then run a row holding one document and its padding unmasked, which is
    faster than the masked kernel (docs/data.md has the measurement).
    """
    last = segment_ids[:, -1:]  # (B, 1)
    in_last = segment_ids == last  # (B, T)
    unscored = ((labels != IGNORE_INDEX) & in_last).sum(1) == 0  # (B,)
    has_prev = (~in_last).any(1)  # (B,)
    prev = torch.where(in_last, torch.full_like(segment_ids, torch.iinfo(segment_ids.dtype).min), segment_ids).amax(1)
    fold = (unscored & has_prev)[:, None] & in_last  # (B, T)
    return torch.where(fold, prev[:, None].expand_as(segment_ids), segment_ids)


def real_token_mask(real_tokens: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(B,) each row's real tokens -> (B, T) bool, True on them: a row's padding trails it."""
    return torch.arange(seq_len, device=real_tokens.device) < real_tokens[:, None]


def trim_unscored_tail(batch: dict, multiple: int) -> dict:
    """Drop the trailing columns no row scores: (B, T) tensors -> (B, T') with T' <= T.

    T' is the last column holding a label in any row, plus one, rounded up to `multiple`
    (context parallelism needs T' divisible by 2 x cp; a round size keeps kernel blocks
    regular). Exact for the same reason as fold_trailing_padding: under causal attention no
    scored token sees a later one, and the dropped tokens' own outputs are never scored. A
    batch of documents shorter than its rows (`pad` packing) then costs what its longest
    document costs.
    Entries that are not (B, T) tensors pass through unchanged.
    """
    labels = batch["labels"]  # (B, T)
    B, T = labels.shape
    scored = (labels != IGNORE_INDEX).any(0).nonzero()  # (n, 1) columns with a label in some row
    keep = int(scored[-1, 0]) + 1 if scored.numel() else 1
    keep = min(T, -(-keep // multiple) * multiple)
    if keep == T:
        return batch
    return {k: (v[:, :keep] if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[:2] == (B, T) else v)
            for k, v in batch.items()}


def segment_ids_from_position_ids(position_ids: np.ndarray) -> np.ndarray:
    """Each position 0 starts a new segment: (…, T) → (…, T) ids 0, 1, 2, …"""
    return (np.cumsum(position_ids == 0, axis=-1) - 1).astype(np.int32)
