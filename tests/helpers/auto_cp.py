"""Two training steps of the transformers-path models under context parallelism against one
process: the losses of both steps (cross-entropy plus the MoE load-balancing loss, whose router
coefficient is large enough that a per-shard auxiliary loss fails) and the weights after them.
Runs inside test_cp_model.py's spawned workers."""
from __future__ import annotations

import torch
import torch.distributed as dist

from helpers.auto_models import TYPES, tiny_auto_model
from longctx.parallel import make_cp_attention, positions_from_segments, shard_batch

REL_TOL = 1e-5
STEPS = 2
LR = 0.5


def auto_batch(L: int) -> dict:
    """Two rows of packed documents (boundaries inside and on shard edges), no target across a boundary."""
    g = torch.Generator().manual_seed(5)
    B = 2
    ids = torch.randint(3, 96, (B, L), generator=g)
    seg = torch.zeros(B, L, dtype=torch.long)
    for b, cuts in enumerate(([5, 12, 17], [9, 16])):
        for c in cuts:
            seg[b, c:] += 1
    labels = torch.cat([ids[:, 1:], torch.full((B, 1), -100)], dim=1)
    labels = labels.masked_fill(torch.cat([seg[:, 1:] != seg[:, :-1], torch.ones(B, 1, dtype=torch.bool)], 1), -100)
    return {"input_ids": ids, "labels": labels, "segment_ids": seg, "position_ids": positions_from_segments(seg)}


def _objective(model, batch, n_tokens):
    """(the step's objective on these tokens, its value): CE sum / n plus this forward's aux share."""
    loss_sum, _ = model(batch["input_ids"], position_ids=batch["position_ids"], segment_ids=batch["segment_ids"],
                        labels=batch["labels"], loss_chunk_size=7)
    aux = model.auxiliary_loss()
    return loss_sum / n_tokens + (aux if aux is not None else 0.0)


def _train(model, batch, n_tokens, reduce: bool):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        obj = _objective(model, batch, n_tokens)
        obj.backward()
        value = obj.detach().clone()
        if reduce:
            dist.all_reduce(value)
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)  # cp ranks hold partial gradients of one replica
        losses.append(value.item())
        opt.step()
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def auto_checks(rank: int, world: int, impls: dict, L: int, types=TYPES) -> list:
    batch = auto_batch(L)
    n_tokens = int((batch["labels"] != -100).sum())
    local = shard_batch(batch, rank, world)
    checks = []
    for model_type in types:
        ref_losses, ref_weights = _train(tiny_auto_model(model_type), batch, n_tokens, reduce=False)
        for name, (impl, u) in impls.items():
            model = tiny_auto_model(model_type)
            model.set_attention(make_cp_attention(None, impl=impl, ulysses_size=u))
            losses, weights = _train(model, local, n_tokens, reduce=True)
            case = f"{model_type}/{name}"
            for step, (got, want) in enumerate(zip(losses, ref_losses)):
                checks.append((case, f"loss step {step}", abs(got - want) / abs(want), REL_TOL))
            for n, want in ref_weights.items():
                rel = (weights[n] - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
                checks.append((case, f"weight {n}", rel, REL_TOL))
    return checks
