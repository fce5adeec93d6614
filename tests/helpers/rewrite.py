"""A batch rewrite the trainer applies before sharding (fold_trailing_padding, trim_unscored_tail)
checked against the batch as packed: the loss and every gradient at cp = world vs cp = 1.

    checks = fold_checks(rank, world)   # [(case, what, rel error, tol)] for helpers.cp.check_all
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from longctx.data.packing import fold_trailing_padding, trim_unscored_tail
from longctx.model import build_model, get_preset
from longctx.parallel import make_cp_attention, positions_from_segments, shard_batch

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def packed_batch(L=24):
    """Two rows packed like `pad`: documents, then padding with labels -100 (positions
    restart at the padding, as the packer writes them)."""
    g = torch.Generator().manual_seed(7)
    V = get_preset("debug-tiny").vocab_size
    ids = torch.randint(0, V, (2, L), generator=g)
    seg = torch.zeros(2, L, dtype=torch.long)
    for b, cuts in enumerate(([7, 15], [11])):  # row 0: 2 docs + padding; row 1: 1 doc + padding
        for c in cuts:
            seg[b, c:] += 1
    pos = positions_from_segments(seg)
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    labels = labels.masked_fill(torch.cat([seg[:, 1:] != seg[:, :-1], torch.ones(2, 1, dtype=torch.bool)], 1), -100)
    labels = labels.masked_fill(seg == seg[:, -1:], -100)  # the last segment is padding
    return {"input_ids": ids, "labels": labels, "segment_ids": seg, "position_ids": pos}


def loss_and_grads(model, batch, n_tokens):
    logits = model(batch["input_ids"], position_ids=batch["position_ids"], segment_ids=batch["segment_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100, reduction="sum")
    (loss / n_tokens).backward()
    return loss.detach(), {n: p.grad.float() for n, p in model.named_parameters()}


def rel_err(a, b):
    return (a.float() - b.float()).abs().max().item() / max(b.float().abs().max().item(), 1e-30)


def compare_rewritten(rank, world, dtype, rewrite):
    """[(case, what, rel error, tol)]: rewrite(batch, world) run at cp = world vs the batch as
    packed at cp = 1 (loss and every gradient)."""
    cfg = get_preset("debug-tiny")
    batch = packed_batch()
    n = int((batch["labels"] != -100).sum())
    ref_loss, ref_grads = loss_and_grads(build_model(cfg, seed=3).to(dtype), batch, n)
    rewritten = rewrite(batch, world)
    model = build_model(cfg, seed=3).to(dtype)
    if world > 1:
        rewritten = shard_batch(rewritten, rank, world)  # positions from the rewritten segments
        model.set_attention(make_cp_attention(None, impl="ring"))
    loss, grads = loss_and_grads(model, rewritten, n)
    if world > 1:
        dist.all_reduce(loss)
        for g in grads.values():
            dist.all_reduce(g)
    case, tol = f"cp{world}/{dtype}", TOL[dtype]
    checks = [(case, "loss", rel_err(loss, ref_loss), tol)]
    checks += [(case, f"grad {k}", rel_err(grads[k], ref_grads[k]), tol) for k in ref_grads]
    return checks


def _fold(batch, world):
    folded = dict(batch, segment_ids=fold_trailing_padding(batch["segment_ids"], batch["labels"]))
    assert not torch.equal(folded["segment_ids"], batch["segment_ids"])
    return folded


def _fold_and_trim(batch, world):
    """What the trainer does to a batch before sharding it."""
    folded = dict(batch, segment_ids=fold_trailing_padding(batch["segment_ids"], batch["labels"]))
    trimmed = trim_unscored_tail(folded, 2 * max(world, 2))
    assert trimmed["input_ids"].shape[1] < batch["input_ids"].shape[1]  # the case really trims
    return trimmed


def fold_checks(rank, world):
    """fold_trailing_padding in fp32 and bf16 (a run_distributed worker)."""
    return compare_rewritten(rank, world, torch.float32, _fold) + compare_rewritten(rank, world, torch.bfloat16, _fold)


def fold_and_trim_checks(rank, world):
    """fold then trim_unscored_tail in fp32 and bf16 (a run_distributed worker)."""
    return (compare_rewritten(rank, world, torch.float32, _fold_and_trim)
            + compare_rewritten(rank, world, torch.bfloat16, _fold_and_trim))
