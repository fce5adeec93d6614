"""Teacher-forced scoring of a task sample: one forward pass of prompt + reference answer, no
KV cache, no generation (`longctx eval mode=teacher_forced` and the training's retrieval probe,
longctx/train/probe.py, share it, so both score the same tokens the same way).

The reference answer is written as the task's answer budget counts it: " " + the references
joined by ", " (string_match_all tasks: every reference), or " " + the first reference
(string_match_part, QA: any reference counts, the first is fed). Each piece is encoded on its
own, without BOS, after the prompt (encoded as generation encodes it). A reference is right when
every one of its tokens is the argmax of the logits at the position before it; a sample scores
100 x the share of its references that are right (string_match_all's share; 0 or 100 for one
reference), the same 0..100 scale generation's scores use. The share of answer tokens that are
the argmax (token accuracy) is kept beside it: partial credit that moves before exact matches do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from longctx.base.labels import IGNORE_INDEX
from longctx.eval.tasks import Sample


@dataclass(frozen=True)
class ForcedRow:
    """One sample as the forward pass reads it (lists of one row's length T)."""
    input_ids: list  # prompt + reference answer tokens
    labels: list  # pre-shifted: the answer token at the position that predicts it, IGNORE_INDEX elsewhere
    refs: list  # the reference each label belongs to, -1 elsewhere
    n_refs: int


def reference_pieces(sample: Sample) -> list[str]:
    """The text pieces of the reference answer, one per scored reference."""
    if sample.metric == "string_match_part":
        return [" " + sample.outputs[0]]
    return [(" " if i == 0 else ", ") + out for i, out in enumerate(sample.outputs)]


def forced_row(sample: Sample, encode_prompt: Callable[[str], list], encode_piece: Callable[[str], list]) -> ForcedRow:
    """The sample's prompt followed by its reference answer, with the answer tokens as labels."""
    ids = list(encode_prompt(sample.prompt))
    labels = [IGNORE_INDEX] * len(ids)
    refs = [-1] * len(ids)
    pieces = reference_pieces(sample)
    for r, piece in enumerate(pieces):
        for tok in encode_piece(piece):
            labels[-1] = tok  # predicted at the last position so far
            refs[-1] = r
            ids.append(tok)
            labels.append(IGNORE_INDEX)
            refs.append(-1)
    return ForcedRow(ids, labels, refs, len(pieces))


def row_tensors(rows: Sequence[ForcedRow], length: int, pad_id: int) -> dict:
    """(B, length) input_ids, labels, refs and position_ids of `rows`, right-padded (causal
    attention: padding after a token changes nothing before it)."""
    B = len(rows)
    out = {"input_ids": torch.full((B, length), pad_id, dtype=torch.long),
           "labels": torch.full((B, length), IGNORE_INDEX, dtype=torch.long),
           "refs": torch.full((B, length), -1, dtype=torch.long),
           "position_ids": torch.arange(length).expand(B, length).contiguous()}
    for b, row in enumerate(rows):
        n = len(row.input_ids)
        out["input_ids"][b, :n] = torch.tensor(row.input_ids)
        out["labels"][b, :n] = torch.tensor(row.labels)
        out["refs"][b, :n] = torch.tensor(row.refs)
    return out


def reference_tallies(logits: torch.Tensor, labels: torch.Tensor, refs: torch.Tensor, row_of: torch.Tensor,
                      n_rows: int, max_refs: int) -> torch.Tensor:
    """(n_rows, max_refs, 2) float64 [misses, tokens] per reference from the logits of the
    labelled positions: logits (N, V); labels, refs, row_of (N,) (row_of: each position's row)."""
    tally = torch.zeros(n_rows * max_refs, 2, dtype=torch.float64, device=logits.device)
    slot = row_of * max_refs + refs  # (N,)
    miss = (logits.argmax(dim=-1) != labels).to(torch.float64)  # (N,)
    tally[:, 0].index_add_(0, slot, miss)
    tally[:, 1].index_add_(0, slot, torch.ones_like(miss))
    return tally.view(n_rows, max_refs, 2)


def sample_score(tally: Sequence[Sequence[float]], n_refs: int) -> float:
    """0..100: the share of the sample's references whose tokens were all the argmax."""
    right = sum(1 for misses, tokens in tally[:n_refs] if tokens > 0 and misses == 0)
    return 100.0 * right / n_refs


@torch.no_grad()
def score_batch(model, rows: Sequence[ForcedRow], pad_id: int) -> list[tuple[float, list, int]]:
    """One process: (score, argmax ids of the answer positions, how many of them are the
    reference's) of each row, one forward of the batch."""
    length = max(len(r.input_ids) for r in rows)
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in row_tensors(rows, length, pad_id).items()}  # (B, T)
    at = batch["labels"] != IGNORE_INDEX  # (B, T)
    logits = model(batch["input_ids"], position_ids=batch["position_ids"], logits_at=at)  # (N, V)
    row_of = at.nonzero()[:, 0]  # (N,)
    max_refs = max(r.n_refs for r in rows)
    tally = reference_tallies(logits, batch["labels"][at], batch["refs"][at], row_of, len(rows), max_refs).tolist()
    argmax = logits.argmax(dim=-1)  # (N,)
    out = []
    for b, row in enumerate(rows):
        right = sum(int(tokens - misses) for misses, tokens in tally[b])
        out.append((sample_score(tally[b], row.n_refs), argmax[row_of == b].tolist(), right))
    return out
