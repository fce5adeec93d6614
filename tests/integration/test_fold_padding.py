"""fold_trailing_padding: a row's unscored tail joins the document before it, and the loss and
every gradient stay those of the unfolded batch (cp = 1 and ring cp = 2), fp32 and bf16."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.cp import check_all, run_distributed
from longctx.data.packing import fold_trailing_padding
from longctx.model import build_model, get_preset
from longctx.parallel import make_cp_attention, positions_from_segments, shard_batch

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def test_fold_cases():
    seg = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2],   # doc, doc, padding
                        [0, 0, 0, 0, 0, 1, 1, 1],   # doc, padding
                        [0, 0, 0, 0, 0, 0, 0, 0],   # one document, no padding
                        [0, 0, 0, 0, 1, 1, 1, 1],   # two documents, the last one scored
                        [0, 0, 0, 0, 0, 0, 0, 0]])  # all padding (an empty row)
    lab = torch.full_like(seg, -100)
    lab[0, :4] = 7
    lab[1, :4] = 7
    lab[2, :7] = 7
    lab[3, :7] = 7
    out = fold_trailing_padding(seg, lab)
    assert out.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1],
                            [0, 0, 0, 0, 0, 0, 0, 0],
                            [0, 0, 0, 0, 0, 0, 0, 0],
                            [0, 0, 0, 0, 1, 1, 1, 1],
                            [0, 0, 0, 0, 0, 0, 0, 0]]
    assert seg[0].tolist() == [0, 0, 0, 1, 1, 2, 2, 2]  # the input is not modified


def _batch(L=24):
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


def _loss_and_grads(model, batch, n_tokens):
    logits = model(batch["input_ids"], position_ids=batch["position_ids"], segment_ids=batch["segment_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100, reduction="sum")
    (loss / n_tokens).backward()
    return loss.detach(), {n: p.grad.float() for n, p in model.named_parameters()}


def _rel(a, b):
    return (a.float() - b.float()).abs().max().item() / max(b.float().abs().max().item(), 1e-30)


def _fold(batch, world):
    folded = dict(batch, segment_ids=fold_trailing_padding(batch["segment_ids"], batch["labels"]))
    assert not torch.equal(folded["segment_ids"], batch["segment_ids"])
    return folded


def compare_rewritten(rank, world, dtype, rewrite):
    """[(case, what, rel error, tol)]: rewrite(batch, world) run at cp = world vs the batch as
    packed at cp = 1 (loss and every gradient)."""
    cfg = get_preset("debug-tiny")
    batch = _batch()
    n = int((batch["labels"] != -100).sum())
    ref_loss, ref_grads = _loss_and_grads(build_model(cfg, seed=3).to(dtype), batch, n)
    rewritten = rewrite(batch, world)
    model = build_model(cfg, seed=3).to(dtype)
    if world > 1:
        rewritten = shard_batch(rewritten, rank, world)  # positions from the rewritten segments
        model.set_attention(make_cp_attention(None, impl="ring"))
    loss, grads = _loss_and_grads(model, rewritten, n)
    if world > 1:
        dist.all_reduce(loss)
        for g in grads.values():
            dist.all_reduce(g)
    case, tol = f"cp{world}/{dtype}", TOL[dtype]
    checks = [(case, "loss", _rel(loss, ref_loss), tol)]
    checks += [(case, f"grad {k}", _rel(grads[k], ref_grads[k]), tol) for k in ref_grads]
    return checks


def _worker(rank, world):
    return compare_rewritten(rank, world, torch.float32, _fold) + compare_rewritten(rank, world, torch.bfloat16, _fold)


def test_fold_keeps_loss_and_gradients_cp1():
    check_all([_worker(0, 1)], min_checks=4)


def test_fold_keeps_loss_and_gradients_ring_cp2():
    check_all(run_distributed(_worker, 2), min_checks=4)


def test_the_comparison_sees_a_wrong_fold():
    """Control: merging two scored documents (what fold must never do) changes the loss."""
    batch = _batch()
    n = int((batch["labels"] != -100).sum())
    ref, _ = _loss_and_grads(build_model(get_preset("debug-tiny"), seed=3), batch, n)
    wrong = dict(batch, segment_ids=torch.zeros_like(batch["segment_ids"]))
    loss, _ = _loss_and_grads(build_model(get_preset("debug-tiny"), seed=3), wrong, n)
    assert _rel(loss, ref) > 100 * TOL[torch.float32]
