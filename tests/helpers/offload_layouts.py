"""Activation offload under context parallelism and ZeRO, run inside one spawned gloo group of 4:
for each layout, the same model trained with parallel.offload_activations none, host and disk
gives the same bits (losses of every step, gradients or weights after them).

    cp cases    cp 4 (ring, all-gather, Ulysses, hybrid 2 x 2), native and transformers-path
                models, full checkpointing: loss and every parameter gradient of one backward
    ZeRO cases  cp 2 x dp 2 under DeepSpeed ZeRO 0-3 (the trainer's engine, parallel_engine):
                losses of two optimizer steps and the weights after them
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from helpers.auto_cp import auto_batch
from helpers.auto_models import tiny_auto_model
from helpers.model import perturb_norms_and_biases
from longctx.model import build_model, get_preset
from longctx.parallel import make_cp_attention, shard_batch
from longctx.parallel.activation_offload import offload_for
from longctx.parallel.checkpointing import apply_activation_checkpointing, model_key
from longctx.parallel.mesh import build_mesh
from longctx.parallel.parallelize import parallel_engine
from longctx.parallel.zero import build_optimizer, deepspeed_config, full_state_dict

MODES = ("none", "host", "disk")
CP_IMPLS = {"ring": ("ring", 1), "allgather": ("allgather", 1), "ulysses": ("ulysses", 4), "hybrid": ("hybrid", 2)}
ZERO_CASES = {0: ("ring", "native"), 1: ("allgather", "native"), 2: ("ulysses", "auto"), 3: ("ring", "native")}
CPU = torch.device("cpu")


def _native():
    cfg = get_preset("debug-tiny").replace(num_hidden_layers=2)
    return perturb_norms_and_biases(build_model(cfg, seed=3), seed=4)


def _auto():
    return tiny_auto_model("qwen2_moe")


BUILD = {"native": _native, "auto": _auto}


def _objective(model, batch, n_tokens):
    loss_sum, _ = model(batch["input_ids"], position_ids=batch["position_ids"], segment_ids=batch["segment_ids"],
                        labels=batch["labels"], loss_chunk_size=7)
    aux = model.auxiliary_loss() if hasattr(model, "auxiliary_loss") else None
    return loss_sum / n_tokens + (aux if aux is not None else 0.0)


def _cp_grads(path, impl, u, mode, local, n_tokens, folder, rank):
    model = BUILD[path]()
    model.set_attention(make_cp_attention(None, impl=impl, ulysses_size=u))
    offload = offload_for(mode, CPU, folder, rank)
    apply_activation_checkpointing(model, "full", checkpoint_fn=None if offload is None else offload.checkpoint_fn)
    obj = _objective(model, local, n_tokens)
    obj.backward()
    puts = 0 if offload is None else offload.store.stats["put"]
    if offload is not None:
        offload.close()
    return obj.item(), {model_key(n): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, puts


def _zero_run(stage, impl, path, mode, mesh, batch, n_tokens, folder, rank, world):
    u = 2 if impl == "ulysses" else 1
    par = SimpleNamespace(cp_size=mesh.cp_size, cp_impl=impl, ulysses_size=u, attention_backend="auto",
                          activation_checkpointing="full", checkpoint_every=1, recompute_attention=False,
                          mlp_tile_tokens=0, compile="none")
    model = BUILD[path]()
    optimizer = build_optimizer(model, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, offload=False)
    ds = deepspeed_config(zero_stage=stage, micro_batch_size=1, grad_accum=1, world_size=world, dtype="float32",
                          grad_clip=1.0)
    offload = offload_for(mode, CPU, folder, rank)
    engine = parallel_engine(model, mesh, par, device=CPU, optimizer=optimizer, ds_config=ds, offload=offload)
    row = {k: v[mesh.dp_rank:mesh.dp_rank + 1] for k, v in batch.items()}  # dp rank d trains row d
    local = shard_batch(row, mesh.cp_rank, mesh.cp_size)
    losses = []
    for _ in range(2):
        obj = _objective(model, local, n_tokens)  # this rank's share of the global mean
        engine.backward(obj)
        engine.step()
        value = obj.detach().clone()
        dist.all_reduce(value)
        losses.append(value.item())
    weights = full_state_dict(engine, model)
    puts = 0 if offload is None else offload.store.stats["put"]
    engine.destroy()
    if offload is not None:
        offload.close()
    return losses, weights, puts


def offload_checks(rank: int, world: int, L: int) -> list:
    """(case, what, difference, tolerance) rows; every tolerance is 0 (bit-identical)."""
    batch = auto_batch(L)
    n_all = int((batch["labels"] != -100).sum())
    checks = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        local = shard_batch(batch, rank, world)
        for path in ("native", "auto"):
            for name, (impl, u) in CP_IMPLS.items():
                if path == "auto" and name in ("allgather", "hybrid"):
                    continue  # the transformers path: one ring and one all-to-all case
                ref_loss, ref_grads, _ = _cp_grads(path, impl, u, "none", local, n_all, folder, rank)
                for mode in MODES[1:]:
                    loss, grads, puts = _cp_grads(path, impl, u, mode, local, n_all, folder, rank)
                    case = f"{path}/cp{world}-{name}/{mode}"
                    checks.append((case, "blocks offloaded", float(puts == 0), 0.0))
                    checks.append((case, "loss", abs(loss - ref_loss), 0.0))
                    diff = max((grads[k] - g).abs().max().item() for k, g in ref_grads.items())
                    checks.append((case, "gradients", diff + float(grads.keys() != ref_grads.keys()), 0.0))
        # DeepSpeed reads the launcher's variables (this spawned process's own environment)
        os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world))
        mesh = build_mesh(2)
        n_rows = int((batch["labels"][: mesh.dp_size] != -100).sum())
        for stage, (impl, path) in ZERO_CASES.items():
            ref_losses, ref_weights, _ = _zero_run(stage, impl, path, "none", mesh, batch, n_rows, folder, rank, world)
            for mode in ("disk",) if stage != 3 else ("host", "disk"):
                losses, weights, puts = _zero_run(stage, impl, path, mode, mesh, batch, n_rows, folder, rank, world)
                case = f"{path}/zero{stage}-cp2-dp2-{impl}/{mode}"
                checks.append((case, "blocks offloaded", float(puts == 0), 0.0))
                checks.append((case, "losses", max(abs(a - b) for a, b in zip(losses, ref_losses)), 0.0))
                diff = max((weights[k] - w).abs().max().item() for k, w in ref_weights.items())
                checks.append((case, "weights", diff, 0.0))
        checks.append(("disk", "files left", float(any(folder.iterdir())), 0.0))
    return checks
