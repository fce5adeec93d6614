"""DeepSpeed ZeRO (stage 0-3, optional CPU offload) over all dp x cp ranks.

Gradients are averaged by DeepSpeed over the whole world. The trainer scales each rank's
loss so that this average equals the gradient of the global mean over real tokens (see
train/step.py), which makes every dp x cp layout give the same update.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Optional

import torch
from torch import nn

from longctx.parallel.checkpointing import model_key
from longctx.parallel.ds_ops import ensure_built, skip_unused_ops

# deepspeed is imported inside the functions that use it: importing it takes seconds and sets
# up its accelerator, which `longctx export` and eval do not need (their ZeRO consolidation,
# longctx/checkpoint/model.py, imports it when a checkpoint has no model/).


def deepspeed_config(*, zero_stage: int, micro_batch_size: int, grad_accum: int, world_size: int,
                     dtype: str, grad_clip: float, offload_optimizer: bool = False,
                     offload_params: bool = False, offload_params_path: Optional[str] = None,
                     user: Optional[dict] = None) -> dict:
    """Our engine config, with `user` (a parsed parallel.deepspeed_config: config.load_deepspeed_json,
    which validate_config ran, RunPlan.deepspeed) merged over it."""
    zero: dict[str, Any] = {"stage": zero_stage}
    if zero_stage >= 2:
        zero.update({"overlap_comm": True, "contiguous_gradients": True})
    if zero_stage == 3:
        zero.update({"stage3_gather_16bit_weights_on_model_save": True})
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if offload_params and offload_params_path:  # ZeRO-Infinity: the partitions on an NVMe drive
        zero["offload_param"] = {"device": "nvme", "nvme_path": offload_params_path,
                                 "pin_memory": torch.cuda.is_available()}
    elif offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    cfg = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch_size * grad_accum * world_size,
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bfloat16"},
        "gradient_clipping": grad_clip,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    return _deep_merge(cfg, user) if user else cfg


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build_optimizer(model: nn.Module, *, lr: float, betas: tuple[float, float], eps: float,
                    weight_decay: float, offload: bool) -> torch.optim.Optimizer:
    """AdamW; no weight decay on norms and biases. With optimizer offload DeepSpeed needs its
    CPU Adam (compiled on first use)."""
    decay, no_decay = _decay_groups(model)
    groups = [{"params": [p for _, p in decay], "weight_decay": weight_decay},
              {"params": [p for _, p in no_decay], "weight_decay": 0.0}]
    if offload:
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # lazy, see the top of this file

        ensure_built(offload_optimizer=True)  # built once per environment; its constructor then loads it
        return DeepSpeedCPUAdam(groups, lr=lr, betas=betas, eps=eps, adamw_mode=True)
    # the fused kernel: one pass per tensor (CPU and CUDA) instead of a loop over tensors
    fused = all(p.device.type in ("cpu", "cuda") for p in model.parameters())
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)


def _decay_groups(model: nn.Module) -> tuple[list, list]:
    """(name, parameter) pairs with weight decay (matrices) and without (norms, biases); the
    frozen parameters (an adapter run's base weights) in neither: no optimizer state for them."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        ndim = len(p.ds_shape) if hasattr(p, "ds_shape") else p.ndim  # ZeRO-3 leaves a flat partition in p
        (no_decay if ndim < 2 else decay).append((name, p))
    return decay, no_decay


def optimizer_param_names(model: nn.Module) -> list[str]:
    """The model's parameter names (model_key) in the order build_optimizer hands them to the
    optimizer: its state dict numbers them in this order."""
    decay, no_decay = _decay_groups(model)
    return [model_key(name) for name, _ in decay + no_decay]


def quiet_deepspeed_deprecations() -> None:
    """Hide torch's FutureWarnings about the collective names DeepSpeed calls (dozens per
    run, one per call site and rank); every other warning, ours included, still shows."""
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning,
                            module=r"torch\.distributed\.c10d_logger")


def initialize_engine(model: nn.Module, optimizer: torch.optim.Optimizer, ds_config: dict):
    import deepspeed  # lazy, see the top of this file

    quiet_deepspeed_deprecations()
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    skip_unused_ops()  # engine start would build the inference-only shm comm op
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    # DeepSpeed records parameter names (a checkpoint's param_shapes, which its zero_to_fp32.py
    # writes out) from named_parameters(), i.e. with activation-checkpointing wrappers in them;
    # the checkpoint's module state dict is already clean (the wrappers' state-dict hooks).
    for param, name in engine.param_names.items():  # in place: the ZeRO optimizer holds this dict
        engine.param_names[param] = model_key(name)
    if ds_config["zero_optimization"]["stage"] == 3:
        # The chunked loss reads the head weight outside the head's own forward.
        deepspeed.zero.register_external_parameter(model, model.output_weight)
    return engine, optimizer


def full_state_dict(engine, model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on every rank's CPU (gathers ZeRO-3 partitions)."""
    stage = engine.zero_optimization_stage()
    if stage == 3:
        import deepspeed  # lazy, see the top of this file

        state = {}
        params = dict(model.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
            for name, p in params.items():
                state[model_key(name)] = p.detach().to("cpu").clone()
        return state
    return {model_key(k): v.detach().to("cpu") for k, v in model.state_dict().items()}

