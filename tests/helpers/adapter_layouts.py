"""Adapter training under many layouts in one spawned gloo group (tests/integration/test_adapter_layouts.py).

Each case builds a tiny model with LoRA (every projection, MLP included) and trainable
embeddings and norms, applies the layout through parallel_engine (cp impl, ZeRO stage,
activation checkpointing, the tiled MLP) and runs 2 optimizer steps of the trainer's own
train_step on packed documents. Every rank also trains the same model alone (plain torch: the
one-process reference) and compares: the trained weights within 1e-5 (fp32), the frozen
weights bit-identical to the start, no optimizer state for a frozen weight.
"""
from __future__ import annotations

import os

import torch

from longctx.base.labels import IGNORE_INDEX
from longctx.config.adapter import AdapterSection
from longctx.config.sections import ParallelSection
from longctx.model.adapter import apply_adapter
from longctx.model.config import PRESETS
from longctx.model.llama import build_model
from longctx.parallel.checkpointing import model_key
from longctx.parallel.mesh import build_mesh
from longctx.parallel.parallelize import parallel_engine
from longctx.parallel.zero import build_optimizer, deepspeed_config, full_state_dict
from longctx.train.step import StepSetup, train_step

T, B, STEPS, LR, CLIP = 64, 2, 2, 1e-3, 0.5
ADAPTER = AdapterSection(r=4, alpha=8.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                          "up_proj", "down_proj"],
                         trainable=["embed_tokens", "norm"])


def packed_batches(vocab: int, seed: int = 5) -> list[dict]:
    """STEPS batches (B, T) of packed documents: positions restart at each document, labels
    stop at its end."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(3, vocab, (B, T), generator=g)
        seg = torch.zeros(B, T, dtype=torch.long)
        seg[0, 23:] = 1
        seg[0, 50:] = 2
        seg[1, 40:] = 1
        starts = torch.ones(B, T, dtype=torch.bool)
        starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
        index = torch.arange(T).expand(B, T)
        first = torch.cummax(torch.where(starts, index, torch.zeros_like(index)), dim=1).values
        labels = torch.full((B, T), IGNORE_INDEX)
        labels[:, :-1] = torch.where(seg[:, 1:] == seg[:, :-1], ids[:, 1:], IGNORE_INDEX)
        out.append({"input_ids": ids, "position_ids": index - first, "segment_ids": seg, "labels": labels})
    return out


def build(kind: str):
    """A fresh model of `kind` with the adapter (fp32, same on every rank); lora_B random so every
    factor gets a gradient in the first step."""
    if kind == "native":
        model = build_model(PRESETS["debug-tiny-qwen3"](), seed=0)
    else:
        from helpers.auto_models import tiny_auto_model

        model = tiny_auto_model("olmo2")
    apply_adapter(model, ADAPTER, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return model


def optimizer(model):
    """AdamW with eps 1e-6: a token seen once gives an embedding gradient ~1e-6 of the largest,
    whose fp32 sum differs in its last bits between layouts (the summation order); with eps 1e-8
    Adam divides that noise by a second moment of the same size and moves the weight by up to
    ~1e-5 (lr 1e-3) from rounding alone. Measured: the gradients agree to ~1e-7 at cp 4."""
    return build_optimizer(model, lr=LR, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1, offload=False)


def reference(kind: str, batches: list[dict]) -> dict:
    """The one-process run: mean loss over real tokens, clipped, AdamW."""
    model = build(kind)
    opt = optimizer(model)
    for batch in batches:
        loss_sum, weight, *_ = model(batch["input_ids"], position_ids=batch["position_ids"],
                                     segment_ids=batch["segment_ids"], labels=batch["labels"])
        (loss_sum / weight).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_case(kind: str, case: dict, batches: list[dict], world: int):
    """(trained state, start state, frozen parameters holding optimizer state) of one layout."""
    model = build(kind)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    par = ParallelSection(**case)
    mesh = build_mesh(par.cp_size)
    ds = deepspeed_config(zero_stage=par.zero_stage, micro_batch_size=B // mesh.dp_size, grad_accum=1,
                          world_size=world, dtype="float32", grad_clip=CLIP)
    engine = parallel_engine(model, mesh, par, device=torch.device("cpu"), optimizer=optimizer(model), ds_config=ds)
    setup = StepSetup(mesh, world, torch.device("cpu"), 1, B // mesh.dp_size, T, 1024, bucket_ends=(T,),
                      loss_buckets=torch.tensor([T]))
    rows = slice(mesh.dp_rank * setup.micro_batch_size, (mesh.dp_rank + 1) * setup.micro_batch_size)
    for batch in batches:
        train_step(engine, model, iter([{k: v[rows] for k, v in batch.items()}]), LR, setup)
    trained = full_state_dict(engine, model)
    frozen_with_state = [model_key(n) for n, p in model.named_parameters()
                         if not p.requires_grad and p in engine.optimizer.state]
    engine.destroy()
    return trained, start, frozen_with_state


def worker(rank: int, world: int, cases: list[tuple[str, str, dict]]) -> list:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    checks = []
    refs = {}
    for kind, name, case in cases:
        torch.manual_seed(0)
        batches = packed_batches(512 if kind == "native" else 96)
        if kind not in refs:
            refs[kind] = reference(kind, batches)
        trained, start, frozen_with_state = run_case(kind, case, batches, world)
        want = refs[kind]
        trainable_err = frozen_err = 0.0
        moved = 1.0  # the least any trained tensor moved (an unsynced or untrained one stays put)
        for key, value in trained.items():
            if ".lora_" in key or "embed_tokens" in key or key.endswith("norm.weight"):
                trainable_err = max(trainable_err, (value - want[key]).abs().max().item())
                moved = min(moved, (value - start[key]).abs().max().item())
            else:
                frozen_err = max(frozen_err, 0.0 if torch.equal(value, start[key]) else float("inf"))
        checks += [(f"{kind}/{name}", "trained vs one process", trainable_err, 1e-5),
                   (f"{kind}/{name}", "frozen bit-identical", frozen_err, 0.0),
                   (f"{kind}/{name}", "frozen with optimizer state", float(len(frozen_with_state)), 0.0),
                   (f"{kind}/{name}", "every trained tensor moved (> 1e-4)", 1e-4 / max(moved, 1e-12), 1.0)]
    return checks


