"""A run's pieces built from its config sections: the plain model, its optimizer, the DeepSpeed
config, and the run directory's first files (resolved config, per-rank logs)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from longctx.config import RunPlan, TrainConfig, validate_config
from longctx.config.stages import init_from_dir
from longctx.model.adapter import apply_adapter, trainable_count
from longctx.model.auto.support import AutoModelSpec
from longctx.model.config import ModelConfig
from longctx.model.hf import load_pretrained
from longctx.model.llama import Transformer, build_model, count_parameters
from longctx.parallel.zero import build_optimizer, deepspeed_config
from longctx.train.summary import weights_line


def train_dtype(cfg) -> torch.dtype:
    """train.dtype as a torch dtype (its valid names, config/sections.py DTYPES, are torch's own)."""
    return getattr(torch, cfg.train.dtype)


def build_plain_model(cfg, model_cfg: ModelConfig | AutoModelSpec, device: torch.device) -> tuple[nn.Module, str]:
    """The model of `model_cfg` in train.dtype: model.init_from's weights, else model.preset's
    architecture initialised from train.seed. A native family is longctx's own model; any other
    decoder is transformers' own class with longctx's attention (model/auto/). Returns (model,
    the lines that say which path it takes and where the weights come from)."""
    m = cfg.model
    source = m.init_from
    checked = ""
    if isinstance(model_cfg, AutoModelSpec):
        # imports transformers: this path only
        from longctx.model.auto.model import build_auto_model, load_auto_model
        from longctx.model.auto.selfcheck import self_check
        from longctx.model.auto.support import TESTED

        if m.init_from:
            local = init_from_dir(m) or Path(m.init_from)
            model = load_auto_model(local, model_cfg, device=device)
            source = m.init_from if str(local) == m.init_from else f"{m.init_from} ({local})"
        else:
            model = build_auto_model(model_cfg, seed=cfg.train.seed, device=device)
        if model_cfg.model_type not in TESTED:  # model.allow_untested: exact on this model, or stop
            checked = "\n" + self_check(model)
    elif m.init_from:
        local = init_from_dir(m) or Path(m.init_from)  # a Hub id: its snapshot, downloaded by validate_config
        model = load_pretrained(local, config=model_cfg, device=device)
        source = m.init_from if str(local) == m.init_from else f"{m.init_from} ({local})"
    else:
        model = build_model(model_cfg, device=device, seed=cfg.train.seed)
    line = weights_line(source, m.preset, len(model.state_dict()), count_parameters(model), cfg.train.seed)
    model = model.to(train_dtype(cfg))
    if cfg.train.adapter is not None:  # LoRA in train.dtype, the rest frozen (model/adapter.py)
        apply_adapter(model, cfg.train.adapter, cfg.train.seed)
        line += "\n" + adapter_line(cfg.train.adapter, model)
    return model, f"{path_line(model)}\n{line}{checked}"


def adapter_line(adapter, model: nn.Module) -> str:
    """What an adapter run trains (the run's first lines say so)."""
    total, trained = count_parameters(model), trainable_count(model)
    also = f" + trainable {', '.join(adapter.trainable)}" if adapter.trainable else ""
    return (f"adapter: LoRA r={adapter.r} alpha={adapter.alpha:g} on {', '.join(adapter.target_modules)}{also}; "
            f"training {trained:,} of {total:,} parameters ({100 * trained / total:.2f}%), the rest frozen")


def path_line(model: nn.Module) -> str:
    """Which model path a run takes (the run's first lines say so)."""
    if isinstance(model, Transformer):
        return f"model path: native ({model.config.model_type}, longctx/model/llama.py)"
    return (f"model path: transformers ({model.config.model_type}: transformers' {type(model.hf).__name__} "
            "with longctx's attention)")


def optimizer_for(model: nn.Module, optim, offload: bool) -> torch.optim.Optimizer:
    """AdamW of the config's optim section (zero.build_optimizer)."""
    return build_optimizer(model, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps,
                           weight_decay=optim.weight_decay, offload=offload)


def deepspeed_config_for(cfg, world_size: int, user: Optional[dict]) -> dict:
    """The engine config of `cfg`; `user`: its parallel.deepspeed_config, parsed (RunPlan.deepspeed)."""
    par = cfg.parallel
    return deepspeed_config(zero_stage=par.zero_stage, micro_batch_size=cfg.data.micro_batch_size,
                            grad_accum=cfg.train.grad_accum, world_size=world_size, dtype=cfg.train.dtype,
                            grad_clip=cfg.optim.grad_clip, offload_optimizer=par.offload_optimizer,
                            offload_params=par.offload_params, offload_params_path=par.offload_params_path, user=user)


def setup_logging(out_dir: Path, rank: int) -> None:
    """Every rank logs to logs/rank_XXXXX.log; rank 0's warnings also reach the console."""
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(logs / f"rank_{rank:05d}.log")
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    if rank == 0:
        console = logging.StreamHandler(sys.stderr)
        console.setLevel(logging.WARNING)
        root.addHandler(console)


def resolved_header(cfg) -> str:
    """Comments that say where the model's architecture comes from (the preset field stays in
    the YAML, so the file loads back, but an init_from checkpoint's config.json wins)."""
    if cfg.model.init_from:
        return (f"# model: architecture and weights from model.init_from={cfg.model.init_from} (its config.json); "
                f"model.preset ({cfg.model.preset}) is not used\n")
    return f"# model: preset {cfg.model.preset}, random init (train.seed {cfg.train.seed})\n"


def plan_for(cfg: TrainConfig, plan: Optional[RunPlan], world_size: int) -> RunPlan:
    """`plan` when validate_config made it for this world with weights and data checked (the
    command's), else validate_config's plan now: everything cheap, before any process group."""
    if plan is not None and plan.world_size == world_size and plan.files:
        return plan
    return validate_config(cfg, world_size)
