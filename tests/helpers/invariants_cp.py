"""The layouts invariant inside one spawned gloo world (test_invariants_cp.py): for every
generated row layout and every model type, each CP impl's loss (cross-entropy over the real
targets plus the MoE load-balancing loss) and gradients equal one process's. One model per type
serves every case (its attention function swapped, its gradients cleared)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from helpers.auto_models import TYPES, tiny_auto_model
from helpers.layouts import MODEL_TYPES_NATIVE, make_batch
from helpers.model import FAMILY_CASES, tiny_model
from longctx.attention import sdpa_attention
from longctx.parallel import make_cp_attention, shard_batch
from longctx.parallel.checkpointing import model_key

REL_TOL = 1e-5


def _model(model_type: str):
    if model_type in MODEL_TYPES_NATIVE:
        return tiny_model(seed=3, **FAMILY_CASES[model_type])
    return tiny_auto_model(model_type)


def _objective(model, batch, n_targets: int):
    loss_sum, _ = model(batch["input_ids"], position_ids=batch["position_ids"], segment_ids=batch["segment_ids"],
                        labels=batch["labels"], token_mask=batch["token_mask"], loss_chunk_size=5)
    aux = model.auxiliary_loss()  # this rank's share: the shares of a cp group sum to the row's
    return loss_sum / max(n_targets, 1) + (aux if aux is not None else 0.0)


def _grads(model, reduce: bool) -> dict:
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
        if reduce:
            dist.all_reduce(g)  # cp ranks hold partial gradients of one replica
        out[model_key(name)] = g
    return out


def layout_checks(rank: int, world: int, layouts, impls: dict, types=TYPES + MODEL_TYPES_NATIVE) -> list:
    """(case, what, rel err, tol) for every layout x type x impl."""
    attns = {name: make_cp_attention(None, impl=impl, ulysses_size=u) for name, (impl, u) in impls.items()}
    checks = []
    for model_type in types:
        model = _model(model_type)
        for layout in layouts:
            batch = make_batch(layout, vocab=model.embed_tokens.num_embeddings, rows=2)
            n_targets = int((batch["labels"] != -100).sum())
            model.set_attention(sdpa_attention)  # one process
            model.zero_grad(set_to_none=True)
            ref = _objective(model, batch, n_targets)
            ref.backward()
            ref_value, ref_grads = ref.item(), _grads(model, reduce=False)
            scale = max(1e-3, *(g.abs().max().item() for g in ref_grads.values()))
            local = shard_batch({k: v for k, v in batch.items() if v is not None}, rank, world)
            local.setdefault("segment_ids", None)
            for name, attn in attns.items():
                model.set_attention(attn)
                model.zero_grad(set_to_none=True)
                obj = _objective(model, local, n_targets)
                obj.backward()
                value = obj.detach().clone()
                dist.all_reduce(value)
                case = f"{model_type}/{name}/{layout}"
                checks.append((case, "loss", abs(value.item() - ref_value) / max(abs(ref_value), 1e-3), REL_TOL))
                grads = _grads(model, reduce=True)
                err = max((grads[n] - g).abs().max().item() for n, g in ref_grads.items())
                checks.append((case, "grads", err / scale, REL_TOL))
    return checks


def sinks_checkpoint_checks(rank: int, world: int, layout) -> list:
    """GPT-OSS (every layer through longctx::cp_attention_sinks) under the ring with every block
    checkpointed: keeping the attention (the default) sends in the backward only what the ring's
    backward sends, recomputing it replays the forward's sends too; the gradients are equal."""
    from longctx.parallel.checkpointing import apply_activation_checkpointing
    from longctx.parallel.comm import COMM_STATS, reset_comm_stats

    batch = make_batch(layout, rows=2)
    n_targets = int((batch["labels"] != -100).sum())
    local = shard_batch({k: v for k, v in batch.items() if v is not None}, rank, world)
    local.setdefault("segment_ids", None)
    sends, grads = {}, {}
    for recompute in (False, True):
        model = tiny_auto_model("gpt_oss")
        apply_activation_checkpointing(model, "full", recompute_attention=recompute)
        model.set_attention(make_cp_attention(None, impl="ring"))
        reset_comm_stats()
        obj = _objective(model, local, n_targets)
        forward = COMM_STATS["p2p_bytes"]
        reset_comm_stats()
        obj.backward()
        sends[recompute] = (forward, COMM_STATS["p2p_bytes"])
        grads[recompute] = _grads(model, reduce=True)
    (f_keep, b_keep), (f_re, b_re) = sends[False], sends[True]
    checks = [("sac-sinks", "forward sends", float(f_keep != f_re or f_keep == 0), 0.0),
              ("sac-sinks", "kept: backward sends what the ring's backward sends", float(b_re != b_keep + f_keep), 0.0)]
    scale = max(g.abs().max().item() for g in grads[True].values())
    err = max((grads[False][n] - g).abs().max().item() for n, g in grads[True].items())
    checks.append(("sac-sinks", "grads", err / scale, REL_TOL))
    return checks


def cp2_checks(rank: int, world: int, layouts, impls: dict) -> list:
    return layout_checks(rank, world, layouts, impls) + sinks_checkpoint_checks(rank, world, layouts[2])
