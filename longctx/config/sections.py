"""The training config's sections: typed dataclasses (the omegaconf schema), each with the
checks of its own fields (`validate()`: no file read, any machine, any world size).

Each component receives only its own section (model, data, parallel, optim, ...). The data
section, DataConfig, lives with the data package and validates itself there.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from longctx.attention.backends import BACKENDS
from longctx.base.errors import UserError
from longctx.config.adapter import AdapterSection
from longctx.config.validation import ValidationSection
from longctx.data.config import DataConfig
from longctx.data.source_config import SourceConfig
from longctx.model.config import PRESETS
from longctx.parallel.layout import CP_IMPLS
from longctx.parallel.timeout_values import DEFAULT_STARTUP_TIMEOUT_S, DEFAULT_TIMEOUT_S, timeout_problem
from longctx.reporting.wandb_log import check_mode

DTYPES = ("float32", "bfloat16")
SCHEDULES = ("cosine", "linear", "constant")
CHECKPOINTING = ("none", "full", "selective")
OFFLOAD_ACTIVATIONS = ("none", "host", "disk")  # parallel.offload_activations (parallel/activation_offload.py)
OFFLOAD_PARAMS_DEVICES = ("cpu", "nvme")  # parallel.offload_params_device (DeepSpeed's offload_param.device)
COMPILE_MODES = ("none", "norms_mlp")  # parallel.compile (longctx/parallel/compiled.py)
NONFINITE_POLICIES = ("stop", "skip_step")  # train.nonfinite (longctx/train/nonfinite.py)


def require_one_of(where: str, value: str, valid, hint: bool = False) -> None:
    if value not in valid:
        close = difflib.get_close_matches(str(value), list(valid), n=1) if hint else []
        suggestion = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(f"{where}: unknown {value!r}; {suggestion}valid: {', '.join(valid)}")


def require_at_least(where: str, value, minimum) -> None:
    if value < minimum:
        raise UserError(f"{where}: must be >= {minimum}, got {value}")


def require_finite(where: str, value: float, *, positive: bool) -> None:
    ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        raise UserError(f"{where}: must be a finite number {'>' if positive else '>='} 0, got {value}")


@dataclass
class ModelSection:
    preset: str = "debug-tiny"
    init_from: Optional[str] = None  # HF Llama directory or Hub id ("org/name") to start from (longctx/storage/hub.py)
    revision: Optional[str] = None  # the Hub revision of init_from (branch, tag or commit; default main)
    rope_parameters: Optional[Dict[str, Any]] = None  # replaces the preset's / checkpoint's RoPE
    max_position_embeddings: Optional[int] = None
    overrides: Dict[str, Any] = field(default_factory=dict)  # any other ModelConfig (or config.json) field
    # a model type the transformers path has not been tested on: run it after an exactness self-check
    allow_untested: bool = False

    def validate(self) -> None:
        if self.init_from is None and self.preset not in PRESETS:
            raise UserError(f"model.preset: unknown {self.preset!r}; valid: {', '.join(sorted(PRESETS))}")
        if self.max_position_embeddings is not None:
            require_at_least("model.max_position_embeddings", self.max_position_embeddings, 1)


@dataclass
class ParallelSection:
    cp_size: int = 1
    cp_impl: str = "ring"  # ring | allgather | ulysses | hybrid
    ulysses_size: int = 1  # hybrid: Ulysses degree inside each cp group (ring degree = cp_size / this); 0: auto
    attention_backend: str = "auto"  # auto | sdpa | flash | fa4 | varlen | flex | eager
    zero_stage: int = 0  # DeepSpeed ZeRO stage 0..3, sharded over all dp x cp ranks
    offload_optimizer: bool = False
    offload_params: bool = False  # stage 3 only
    offload_params_device: str = "cpu"  # cpu | nvme (ZeRO-Infinity: DeepSpeed's async_io op, libaio)
    offload_params_path: Optional[str] = None  # nvme: a folder on the NVMe drive (one per node)
    # checkpointed blocks' inputs between forward and backward: none | host | disk (parallel/activation_offload.py)
    offload_activations: str = "none"
    offload_activations_path: Optional[str] = None  # disk: the folder of the per-rank files (default <out_dir>/offload)
    activation_checkpointing: str = "none"  # none | full | selective
    checkpoint_every: int = 2  # selective: checkpoint every k-th block
    recompute_attention: bool = False  # false: keep attention kernel outputs in checkpointed blocks
    mlp_tile_tokens: int = 0  # > 0: each MLP runs in sequence tiles of this many tokens (model/swiglu.py)
    compile: str = "none"  # none | norms_mlp: torch.compile each block's norms and MLP (parallel/compiled.py)
    deepspeed_config: Optional[str] = None  # a user DeepSpeed JSON merged over ours
    timeout_s: float = DEFAULT_TIMEOUT_S  # a collective or a step stalled this long ends the job (parallel/timeouts.py)
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S  # the same limit until the first step has finished

    def validate(self) -> None:
        for name in ("timeout_s", "startup_timeout_s"):
            if problem := timeout_problem(getattr(self, name)):
                raise UserError(f"parallel.{name}: {problem}")
        require_one_of("parallel.cp_impl", self.cp_impl, CP_IMPLS)
        require_at_least("parallel.ulysses_size", self.ulysses_size, 0)
        if self.ulysses_size == 0 and self.cp_impl != "hybrid":
            raise UserError(f"parallel.ulysses_size: 0 (the degree chosen from the head counts) applies only to "
                            f"cp_impl hybrid (cp_impl is {self.cp_impl}); set it to 1 or leave it unset")
        require_one_of("parallel.attention_backend", self.attention_backend, BACKENDS, hint=True)
        if self.zero_stage not in (0, 1, 2, 3):
            raise UserError(f"parallel.zero_stage: must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.offload_params and self.zero_stage != 3:
            raise UserError("parallel.offload_params: needs parallel.zero_stage=3")
        require_one_of("parallel.offload_params_device", self.offload_params_device, OFFLOAD_PARAMS_DEVICES)
        if self.offload_params_device == "nvme" and not self.offload_params:
            raise UserError("parallel.offload_params_device: nvme applies with parallel.offload_params=true")
        if (self.offload_params_device == "nvme") != (self.offload_params_path is not None):
            raise UserError("parallel.offload_params_path: " + (
                "required with offload_params_device=nvme (a folder on the NVMe drive)"
                if self.offload_params_device == "nvme" else
                f"applies only to offload_params_device=nvme (it is {self.offload_params_device}); leave it unset"))
        require_one_of("parallel.activation_checkpointing", self.activation_checkpointing, CHECKPOINTING)
        require_one_of("parallel.offload_activations", self.offload_activations, OFFLOAD_ACTIVATIONS)
        if self.offload_activations != "none" and self.activation_checkpointing == "none":
            raise UserError(f"parallel.offload_activations: {self.offload_activations} offloads the inputs that "
                            "activation checkpointing keeps; set parallel.activation_checkpointing=full (or "
                            "selective), or offload_activations=none")
        if self.offload_activations_path is not None and self.offload_activations != "disk":
            raise UserError(f"parallel.offload_activations_path: applies only to offload_activations=disk "
                            f"(it is {self.offload_activations}); set offload_activations=disk or leave the path unset")
        require_one_of("parallel.compile", self.compile, COMPILE_MODES)
        if self.compile != "none" and self.zero_stage == 3:
            raise UserError("parallel.compile: not supported with parallel.zero_stage=3 (its parameter hooks run "
                            "inside the compiled modules); use zero_stage <= 2 or compile=none")
        require_at_least("parallel.checkpoint_every", self.checkpoint_every, 1)
        require_at_least("parallel.mlp_tile_tokens", self.mlp_tile_tokens, 0)
        if self.mlp_tile_tokens and self.zero_stage == 3:
            raise UserError("parallel.mlp_tile_tokens: not supported with parallel.zero_stage=3 (the tiles read "
                            "the MLP weights outside the modules whose hooks gather them); use zero_stage <= 2 "
                            "or mlp_tile_tokens=0")


@dataclass
class OptimSection:
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # cosine/linear decay to lr * this
    warmup_steps: int = 0
    schedule: str = "cosine"  # cosine | linear | constant
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables

    def validate(self) -> None:
        require_one_of("optim.schedule", self.schedule, SCHEDULES)
        require_finite("optim.lr", self.lr, positive=True)
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise UserError(f"optim.{name}: must be in [0, 1), got {getattr(self, name)}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise UserError(f"optim.eps: must be a finite number > 0 (e.g. 1e-8), got {self.eps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise UserError(f"optim.min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        require_finite("optim.weight_decay", self.weight_decay, positive=False)
        require_finite("optim.grad_clip", self.grad_clip, positive=False)
        require_at_least("optim.warmup_steps", self.warmup_steps, 0)


@dataclass
class TrainSection:
    steps: int = 20  # optimizer steps (when `stages` is empty)
    grad_accum: int = 1
    seed: int = 0
    dtype: str = "float32"  # float32 | bfloat16 (parameters and compute; fp32 master weights in bf16)
    loss_chunk_size: int = 1024  # tokens per chunk of the vocabulary head's cross-entropy
    answer_loss_weight: float = 1.0  # >1 up-weights answer tokens of the synthetic corpus
    # a step whose loss or gradient norm is not finite: stop (exit 3 after max_nonfinite_steps
    # consecutive ones, the weights never checkpointed) or skip_step (drop its update, go on)
    nonfinite: str = "stop"
    max_nonfinite_steps: int = 3  # consecutive non-finite steps tolerated (skip_step: then stop too)
    adapter: Optional[AdapterSection] = None  # LoRA and trainable modules, the rest frozen (config/adapter.py)

    def validate(self) -> None:
        require_one_of("train.dtype", self.dtype, DTYPES)
        if self.adapter is not None:
            self.adapter.validate()
        require_at_least("train.grad_accum", self.grad_accum, 1)
        if self.seed < 0:
            raise UserError(f"train.seed: must be >= 0 (numpy's generators take no negative seeds), got {self.seed}")
        require_one_of("train.nonfinite", self.nonfinite, NONFINITE_POLICIES)
        require_at_least("train.max_nonfinite_steps", self.max_nonfinite_steps, 1)
        require_at_least("train.loss_chunk_size", self.loss_chunk_size, 1)
        require_finite("train.answer_loss_weight", self.answer_loss_weight, positive=False)


@dataclass
class CheckpointSection:
    every: int = 0  # steps between checkpoints (0: only at stage ends and on preemption)
    keep_last: int = 2
    resume: str = "none"  # none | auto (newest complete checkpoint) | path to a checkpoint
    save_hf: bool = True  # each checkpoint carries a Hugging Face export in model/
    export_hf: bool = True  # write <out_dir>/hf at the end of the run

    def validate(self) -> None:
        require_at_least("checkpoint.keep_last", self.keep_last, 1)
        require_at_least("checkpoint.every", self.every, 0)


@dataclass
class WandbSection:
    """log.wandb: Weights & Biases logging beside TensorBoard (longctx/reporting/wandb_log.py); unset: off."""

    project: str = "longctx"
    entity: Optional[str] = None  # W&B's default entity of the logged-in user when null
    name: Optional[str] = None  # the run's display name (default: out_dir's name)
    mode: str = "online"  # online | offline (written under out_dir/wandb, uploaded later by `wandb sync`)

    def validate(self) -> None:
        check_mode("log.wandb.mode", self.mode)
        if not self.project:
            raise UserError("log.wandb.project: must name a W&B project, got an empty string")


@dataclass
class LogSection:
    every: int = 1
    tensorboard: bool = True
    wandb: Optional[WandbSection] = None  # e.g. log.wandb.project=NAME (log.wandb.mode=offline)
    progress: bool = True
    peak_tflops: Optional[float] = None  # per device, for MFU; null: known GPU table / measured on CPU

    def validate(self) -> None:
        require_at_least("log.every", self.every, 1)
        if self.wandb is not None:
            self.wandb.validate()
        if self.peak_tflops is not None and not (math.isfinite(self.peak_tflops) and self.peak_tflops > 0):
            raise UserError(f"log.peak_tflops: must be null or a finite number > 0, got {self.peak_tflops}")


@dataclass
class StageSection:
    """One stage of a staged context extension, as written; unset fields inherit the base
    config (longctx.config.stages resolves them)."""

    name: str = ""
    seq_len: int = MISSING
    steps: int = MISSING
    lr: Optional[float] = None
    warmup_steps: Optional[int] = None
    cp_size: Optional[int] = None
    rope_parameters: Optional[Dict[str, Any]] = None
    max_position_embeddings: Optional[int] = None
    # this stage's data sources instead of data.sources (e.g. an easy task mix first); the
    # rest of the data section (tokenizer, packing, batch size) is shared
    sources: Optional[List[SourceConfig]] = None


@dataclass
class TrainConfig:
    out_dir: str = "runs/default"
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    log: LogSection = field(default_factory=LogSection)
    validation: ValidationSection = field(default_factory=ValidationSection)  # held-out loss by position
    stages: List[StageSection] = field(default_factory=list)
