"""The one step that applies parallelism to a plain model, in a fixed order (torchtitan's habit):

    1. attention    the local kernel (cp 1) or context-parallel attention over the mesh's cp group
    2. checkpoint   activation checkpointing of the blocks (checkpointing.py), their inputs
                    offloaded (activation_offload.py), and the MLPs' sequence tiles (model/swiglu.py)
    3. compile      the norms and MLPs, in place (compiled.py)
    4. ZeRO         the DeepSpeed engine over every dp x cp rank (zero.py)

    engine = parallel_engine(model, mesh, cfg.parallel, device=device, optimizer=opt, ds_config=ds)

A later training stage changes only what a stage may change: the trainer gives the model the
stage's RoPE and maximum length (`model.set_context`) and, when its cp size differs, that mesh's
attention (`attention_for`, installed with `model.set_attention`).
"""
from __future__ import annotations

from typing import Optional

import torch

from longctx.attention import AttentionFn, get_attention
from longctx.model.llama import Transformer
from longctx.parallel.activation_offload import ActivationOffload
from longctx.parallel.checkpointing import apply_activation_checkpointing
from longctx.parallel.compiled import compile_pointwise
from longctx.parallel.cp import make_cp_attention
from longctx.parallel.layout import ulysses_degree
from longctx.parallel.mesh import Mesh
from longctx.parallel.zero import initialize_engine


def attention_for(mesh: Mesh, par, device: torch.device) -> AttentionFn:
    """The attention of a mesh: `par.attention_backend` locally for cp 1, else context-parallel
    attention (`par.cp_impl`) over the mesh's cp group. `par` is the config's parallel section."""
    if mesh.cp_size == 1:
        return get_attention(par.attention_backend, device)
    return make_cp_attention(mesh.cp_group, impl=par.cp_impl, backend=par.attention_backend,
                             ulysses_size=ulysses_degree(par.cp_impl, mesh.cp_size, par.ulysses_size))


def parallel_engine(model: Transformer, mesh: Mesh, par, *, device: torch.device, optimizer: torch.optim.Optimizer,
                ds_config: dict, offload: Optional[ActivationOffload] = None):
    """Apply steps 1-4 to `model` (in place) and return the DeepSpeed engine that trains it.

    `optimizer` holds the model's parameters (the wrappers of steps 2-3 keep them); `offload`:
    where the checkpointed blocks' inputs wait for the backward (activation_offload.py)."""
    model.set_attention(attention_for(mesh, par, device))
    apply_activation_checkpointing(model, par.activation_checkpointing, par.checkpoint_every,
                                   recompute_attention=par.recompute_attention,
                                   checkpoint_fn=None if offload is None else offload.checkpoint_fn)
    model.set_mlp_tiling(par.mlp_tile_tokens)
    compile_pointwise(model, par.compile)
    engine, _ = initialize_engine(model, optimizer, ds_config)
    return engine
