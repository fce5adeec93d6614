"""Log-likelihoods of continuations, as lm-eval asks for them, from the chunked loss.

A row is (inputs, targets): the model reads `inputs` and the last len(targets) positions
predict `targets` (lm-eval's context + continuation, shifted by one). Each row's log-likelihood
is minus the sum of its targets' cross-entropy from model/loss.py (chunks of positions, fp32
softmax statistics, never the (tokens x vocab) logits); whether every target is the argmax is
read from the targets' positions only, a chunk of positions at a time.

Under context parallelism each rank scores its zigzag shard of the (right-padded) rows, as
eval/ppl.py does, and the per-row sums are all-reduced over the group.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from longctx.base.labels import IGNORE_INDEX
from longctx.eval.sequence_rope import row_lengths
from longctx.model.loss import chunked_cross_entropy
from longctx.parallel import make_cp_attention, shard_sequence
from longctx.parallel.zigzag import zigzag_multiple

Row = tuple[Sequence[int], Sequence[int]]  # (inputs, targets of the last len(targets) inputs)


def _row_tensors(rows: Sequence[Row], length: int, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, labels), each (B, length): rows right-padded (causal attention keeps padding after a
    row's last token out of its scores), labels IGNORE_INDEX but at each row's targets."""
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long, device=device)  # (B, T)
    labels = torch.full_like(ids, IGNORE_INDEX)  # (B, T)
    for b, (inputs, targets) in enumerate(rows):
        n, k = len(inputs), len(targets)
        ids[b, :n] = torch.tensor(list(inputs), dtype=torch.long, device=device)
        labels[b, n - k:n] = torch.tensor(list(targets), dtype=torch.long, device=device)
    return ids, labels


def _sums(model, hidden: torch.Tensor, labels: torch.Tensor, chunk: int) -> torch.Tensor:
    """(2, B) fp32: each row's target loss sum and its count of targets that are not the argmax."""
    B = labels.shape[0]
    row_of = torch.arange(B, device=labels.device)[:, None].expand_as(labels)  # (B, T)
    _, _, by_row = chunked_cross_entropy(hidden, model.output_weight, labels, chunk_size=chunk,
                                         buckets=row_of, n_buckets=B)  # (2, B): loss sums, counts
    scored = labels != IGNORE_INDEX  # (B, T)
    h, y, rows = hidden[scored], labels[scored], row_of[scored]  # (N, d), (N,), (N,)
    wrong = torch.zeros(B, dtype=torch.float32, device=labels.device)
    for a in range(0, y.numel(), chunk):  # (c, V) logits of the targets' positions, a chunk at a time
        miss = (F.linear(h[a:a + chunk], model.output_weight).argmax(-1) != y[a:a + chunk]).float()
        wrong.index_add_(0, rows[a:a + chunk], miss)
    return torch.stack([by_row[0], wrong])


@torch.no_grad()
def score_rows(model, rows: Sequence[Row], *, pad_id: int = 0, cp_group=None, cp_impl: str = "ring",
               chunk: int = 1024) -> list[tuple[float, bool]]:
    """(log-likelihood of the targets, whether greedy decoding gives them) for each row; every
    rank of `cp_group` passes the same rows and gets the same answers."""
    device = model.embed_tokens.weight.device
    P = dist.get_world_size(cp_group) if cp_group is not None else 1
    longest = max(len(inputs) for inputs, _ in rows)
    length = -(-longest // zigzag_multiple(P)) * zigzag_multiple(P) if P > 1 else longest
    ids, labels = _row_tensors(rows, length, pad_id, device)
    with row_lengths(model, [len(inputs) for inputs, _ in rows]):
        if P == 1:
            sums = _sums(model, model.forward_hidden(ids), labels, chunk)  # (2, B)
        else:
            rank = dist.get_rank(cp_group)
            pos = torch.arange(length, device=device).expand_as(ids)  # (B, T)
            local = [shard_sequence(x, rank, P, dim=1).contiguous() for x in (ids, pos, labels)]
            with model.attention_scope(make_cp_attention(cp_group, impl=cp_impl)):
                hidden = model.forward_hidden(local[0], local[1])  # (B, T/P, d)
            sums = _sums(model, hidden, local[2], chunk).double()
            dist.all_reduce(sums, group=cp_group)
    loss, wrong = sums.tolist()
    return [(-float(x), w == 0) for x, w in zip(loss, wrong)]


def batches(lengths: Sequence[int], max_batch_tokens: int, batch_size: Optional[int] = None) -> list[list[int]]:
    """Indices cut into batches, longest first: batch_size rows each, or as many as keep
    rows x the batch's longest row within max_batch_tokens (at least one)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    for i in order:
        if out and len(out[-1]) < (batch_size or max(1, max_batch_tokens // max(lengths[out[-1][0]], 1))):
            out[-1].append(i)
        else:
            out.append([i])
    return out
