"""Training configuration: typed dataclasses + omegaconf (YAML files and key=value overrides).

Loading is strict: an unknown key is rejected with the closest valid key suggested, a value
of the wrong type names its field, and cross-field checks run before anything heavy.
Each component receives only its own section (model, data, parallel, optim, ...).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import tempfile
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from longctx.attention.select import BACKENDS, check_backend_available
from longctx.data.config import DataConfig, SourceConfig, validate_data_config
from longctx.data.tokenizer import check_local_tokenizer_vocab
from longctx.errors import UserError
from longctx.model.config import PRESETS
from longctx.model.rope import require_explicit_fields
from longctx.parallel.layout import CP_IMPLS, ulysses_degree

DTYPES = ("float32", "bfloat16")
SCHEDULES = ("cosine", "linear", "constant")
CHECKPOINTING = ("none", "full", "selective")
COMPILE_MODES = ("none", "norms_mlp")  # parallel.compile (longctx/parallel/compiled.py)
# RoPE types whose frequencies do not depend on max_position_embeddings (scaled ones, once
# original_max_position_embeddings is set): a stage longer than it raises it to its length
LENGTH_FREE_ROPE = ("default", "linear", "yarn", "llama3")
NONFINITE_POLICIES = ("stop", "skip_step")  # train.nonfinite (longctx/train/nonfinite.py)


@dataclass
class ModelSection:
    preset: str = "debug-tiny"
    init_from: Optional[str] = None  # HF Llama directory to start from (continued pretraining)
    rope_parameters: Optional[Dict[str, Any]] = None  # replaces the preset's / checkpoint's RoPE
    max_position_embeddings: Optional[int] = None
    overrides: Dict[str, Any] = field(default_factory=dict)  # any other ModelConfig field


@dataclass
class ParallelSection:
    cp_size: int = 1
    cp_impl: str = "ring"  # ring | allgather | ulysses | hybrid
    ulysses_size: int = 1  # hybrid: Ulysses degree inside each cp group (ring degree = cp_size / this)
    attention_backend: str = "auto"  # auto | flash | sdpa | eager
    zero_stage: int = 0  # DeepSpeed ZeRO stage 0..3, sharded over all dp x cp ranks
    offload_optimizer: bool = False
    offload_params: bool = False  # stage 3 only
    activation_checkpointing: str = "none"  # none | full | selective
    checkpoint_every: int = 2  # selective: checkpoint every k-th block
    recompute_attention: bool = False  # false: keep attention kernel outputs in checkpointed blocks
    compile: str = "none"  # none | norms_mlp: torch.compile each block's norms and MLP (parallel/compiled.py)
    deepspeed_config: Optional[str] = None  # a user DeepSpeed JSON merged over ours


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


@dataclass
class CheckpointSection:
    every: int = 0  # steps between checkpoints (0: only at stage ends and on preemption)
    keep_last: int = 2
    resume: str = "none"  # none | auto (newest complete checkpoint) | path to a checkpoint
    save_hf: bool = True  # each checkpoint carries a Hugging Face export in model/
    export_hf: bool = True  # write <out_dir>/hf at the end of the run


@dataclass
class LogSection:
    every: int = 1
    tensorboard: bool = True
    progress: bool = True
    peak_tflops: Optional[float] = None  # per device, for MFU; null: known GPU table / measured on CPU


@dataclass
class StageSection:
    """One stage of a staged context extension; unset fields inherit the base config."""

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
    stages: List[StageSection] = field(default_factory=list)


# ------------------------------------------------------------------------------ loading
def _dataclass_in(t: Any) -> Any:
    """The dataclass inside a field type (X, Optional[X], List[X]), or None."""
    if is_dataclass(t):
        return t
    for arg in typing.get_args(t):
        found = _dataclass_in(arg)
        if found is not None:
            return found
    return None


def _check_keys(node: Any, schema: type, where: str) -> None:
    """Unknown keys anywhere in a user mapping -> UserError with the closest valid key."""
    hints = typing.get_type_hints(schema)
    for key, value in node.items():
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(hints), n=1)
            hint = f"did you mean '{where}{close[0]}'?" if close else f"valid: {', '.join(hints)}"
            raise UserError(f"{where}{key}: unknown key; {hint}")
        sub = _dataclass_in(hints[key])
        if sub is None:
            continue
        if is_dataclass(hints[key]) and value is not None and not isinstance(value, dict):
            raise UserError(f"{where}{key}: must be a mapping of {where}{key}.* fields "
                            f"(e.g. {where}{key}.{next(iter(typing.get_type_hints(sub)))}=...), "
                            f"got {type(value).__name__} {value!r}")
        if isinstance(value, dict):
            _check_keys(value, sub, f"{where}{key}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    _check_keys(item, sub, f"{where}{key}[{i}].")


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise UserError(f"override {item!r}: expected key=value (e.g. train.steps=100)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or not all(part.strip() for part in key.split(".")):
        raise UserError(f"override {item!r}: {key!r} is not a dotted key (e.g. train.steps=100)")
    return key, _parse_value(key, raw)


def _parse_value(key: str, raw: str) -> Any:
    """A YAML value as omegaconf's dotlist reads it; a syntax error names the key."""
    if raw == "":
        return ""
    try:
        return OmegaConf.to_container(OmegaConf.create(f"v: {raw}"))["v"]
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        raise UserError(f"{key}: cannot parse {raw!r} as a YAML value ({problem}); write mappings as "
                        "{a: 1, b: 2}, lists as [x, y], and quote strings with special characters") from None


def _nest(key: str, value: Any) -> dict:
    out: dict = {}
    cur = out
    parts = key.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def _load_file(path: str) -> DictConfig:
    """A YAML config file: it must exist, parse, and hold a non-empty mapping of sections."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise UserError(f"--config: {path} {what} (expected a YAML file)")
    try:
        user = OmegaConf.load(p)
    except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError) as e:
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        raise UserError(f"{path}: invalid YAML ({problem})") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(user, DictConfig):
        raise UserError(f"{path}: expected a mapping of sections at the top level (e.g. 'train: {{steps: 100}}'), "
                        f"got a {type(OmegaConf.to_container(user)).__name__}")
    if len(user) == 0:
        raise UserError(f"{path}: empty config file (expected a mapping of sections, e.g. 'train: {{steps: 100}}'; "
                        "leave out --config for the built-in defaults)")
    return user


def load_config(path: Optional[str] = None, overrides: Optional[list[str]] = None) -> TrainConfig:
    """YAML file (optional) + key=value overrides -> a validated TrainConfig object."""
    schema = OmegaConf.structured(TrainConfig)
    layers = []
    if path is not None:
        user = _load_file(path)
        _check_keys(OmegaConf.to_container(user), TrainConfig, "")
        layers.append(user)
    for item in overrides or []:
        key, value = _parse_override(item)
        nested = _nest(key, value)
        _check_keys(nested, TrainConfig, "")
        layers.append(OmegaConf.create(nested))
    try:
        merged = OmegaConf.merge(schema, *layers)
        cfg = OmegaConf.to_object(merged)
    except MissingMandatoryValue as e:
        raise UserError(f"{e.full_key}: required (no default)") from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or ""
        msg = str(e).splitlines()[0]
        raise UserError(f"{key}: {msg}" if key else msg) from None
    return cfg


def to_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


# --------------------------------------------------------------------------- validation
def resolved_stages(cfg: TrainConfig) -> list[StageSection]:
    """The stages to run; a config without `stages` is one stage from data/train/optim."""
    if cfg.stages:
        return cfg.stages
    return [StageSection(name="main", seq_len=cfg.data.seq_len, steps=cfg.train.steps)]


def stage_data_config(cfg: TrainConfig, stage: StageSection) -> DataConfig:
    """The data section a stage trains on: its seq_len, and its own sources when it has them."""
    sources = stage.sources if stage.sources is not None else cfg.data.sources
    return dataclasses.replace(cfg.data, seq_len=stage.seq_len, sources=list(sources))


def validate_config(cfg: TrainConfig, world_size: int) -> None:
    """Cheap cross-field checks, before any model, data or process-group work (and before the
    run directory is created): every bad input a user can make ends here in one UserError."""
    validate_portable(cfg)
    _validate_on_this_machine(cfg)
    model_cfg = None
    for i, stage in enumerate(resolved_stages(cfg)):
        model_cfg = _validate_stage(cfg, i, stage, world_size)
    check_local_tokenizer_vocab(cfg.data.tokenizer, model_cfg.vocab_size)
    check_out_dir(cfg.out_dir)


def validate_portable(cfg: TrainConfig) -> None:
    """The checks that hold on any machine and for any world size, reading no file: what
    `longctx plan` checks of a job that runs elsewhere. validate_config adds the rest."""
    tr = cfg.train
    _validate_model(cfg.model)
    _validate_parallel(cfg.parallel)
    _validate_optim(cfg.optim)
    if tr.dtype not in DTYPES:
        raise UserError(f"train.dtype: unknown {tr.dtype!r}; valid: {', '.join(DTYPES)}")
    if tr.grad_accum < 1:
        raise UserError(f"train.grad_accum: must be >= 1, got {tr.grad_accum}")
    if tr.seed < 0:
        raise UserError(f"train.seed: must be >= 0 (numpy's generators take no negative seeds), got {tr.seed}")
    if tr.nonfinite not in NONFINITE_POLICIES:
        raise UserError(f"train.nonfinite: unknown {tr.nonfinite!r}; valid: {', '.join(NONFINITE_POLICIES)}")
    if tr.max_nonfinite_steps < 1:
        raise UserError(f"train.max_nonfinite_steps: must be >= 1, got {tr.max_nonfinite_steps}")
    if tr.loss_chunk_size < 1:
        raise UserError(f"train.loss_chunk_size: must be >= 1, got {tr.loss_chunk_size}")
    if not (math.isfinite(tr.answer_loss_weight) and tr.answer_loss_weight >= 0):
        raise UserError(f"train.answer_loss_weight: must be a finite number >= 0, got {tr.answer_loss_weight}")
    _validate_checkpoint(cfg.checkpoint)
    _validate_log(cfg.log)
    if cfg.data.micro_batch_size < 1:
        raise UserError(f"data.micro_batch_size: must be >= 1, got {cfg.data.micro_batch_size}")
    for i, stage in enumerate(resolved_stages(cfg)):
        _validate_stage_fields(cfg, i, stage)


def _validate_on_this_machine(cfg: TrainConfig) -> None:
    """Files and libraries the run needs here: init_from, the attention backend, the DeepSpeed
    JSON, a resume path (data sources and the tokenizer: per stage, below)."""
    m, par, ck = cfg.model, cfg.parallel, cfg.checkpoint
    if m.init_from is not None and not (Path(m.init_from) / "config.json").is_file():
        what = "does not exist" if not Path(m.init_from).exists() else "has no config.json"
        raise UserError(f"model.init_from: {m.init_from} {what} (expected a Hugging Face Llama directory)")
    check_backend_available(par.attention_backend, "parallel.attention_backend")
    if par.deepspeed_config is not None:
        _validate_deepspeed_json(par.deepspeed_config, par.zero_stage)
    if ck.resume not in ("none", "auto") and not Path(ck.resume).is_dir():
        raise UserError(f"checkpoint.resume: {ck.resume} is not 'none', 'auto' or an existing checkpoint directory")
    for name in ("cache_dir", "hf_cache_dir"):
        if getattr(cfg.data, name) is not None:
            check_out_dir(getattr(cfg.data, name), f"data.{name}")


def _stage_fields(cfg: TrainConfig, i: int, stage: StageSection) -> tuple[str, str, int, str]:
    """(where, seq_len field, cp size, cp field) of stage i, named as the user wrote them."""
    where = f"stages[{i}]" if cfg.stages else "train"
    seq_where = f"stages[{i}].seq_len" if cfg.stages else "data.seq_len"
    cp = stage.cp_size or cfg.parallel.cp_size
    cp_where = f"stages[{i}].cp_size" if stage.cp_size else "parallel.cp_size"
    return where, seq_where, cp, cp_where


def _validate_stage_fields(cfg: TrainConfig, i: int, stage: StageSection) -> None:
    where, seq_where, cp, cp_where = _stage_fields(cfg, i, stage)
    if stage.steps < 1:
        raise UserError(f"{where}.steps: must be >= 1, got {stage.steps}")
    if stage.lr is not None and not (math.isfinite(stage.lr) and stage.lr > 0):
        raise UserError(f"{where}.lr: must be a finite number > 0, got {stage.lr}")
    if stage.warmup_steps is not None and stage.warmup_steps < 0:
        raise UserError(f"{where}.warmup_steps: must be >= 0, got {stage.warmup_steps}")
    if stage.seq_len < 2:
        raise UserError(f"{seq_where}: must be >= 2, got {stage.seq_len}")
    if cp < 1:
        raise UserError(f"{cp_where}: must be >= 1, got {cp}")


def _validate_stage(cfg: TrainConfig, i: int, stage: StageSection, world_size: int):
    """One stage's cp layout for this world size, its data and its model; returns the model config."""
    _, seq_where, cp, cp_where = _stage_fields(cfg, i, stage)
    if world_size % cp != 0:
        raise UserError(f"{cp_where}: {cp} must divide the world size {world_size} (world = dp x cp)")
    try:
        validate_data_config(stage_data_config(cfg, stage))
    except UserError as e:
        msg = str(e)
        if stage.sources is not None and msg.startswith("data.sources"):  # name the stage's field
            msg = f"stages[{i}].sources" + msg[len("data.sources"):]
        raise UserError(msg) from None
    model_cfg = stage_model_config(cfg, stage, where=f"stages[{i}]" if cfg.stages else "model")
    _validate_cp(cfg, cp, world_size, model_cfg, stage.seq_len, seq_where, cp_where)
    if model_cfg.max_position_embeddings < stage.seq_len:  # set too small, or a length-dependent RoPE
        field = f"stages[{i}].max_position_embeddings" if cfg.stages else "model.max_position_embeddings"
        raise UserError(f"{field}: the model's max_position_embeddings {model_cfg.max_position_embeddings} is below "
                        f"the training length {seq_where}={stage.seq_len}; set {field}={stage.seq_len} (or more)")
    return model_cfg


def _validate_model(m: ModelSection) -> None:
    if m.init_from is None and m.preset not in PRESETS:
        raise UserError(f"model.preset: unknown {m.preset!r}; valid: {', '.join(sorted(PRESETS))}")
    if m.max_position_embeddings is not None and m.max_position_embeddings < 1:
        raise UserError(f"model.max_position_embeddings: must be >= 1, got {m.max_position_embeddings}")


def _validate_parallel(par: ParallelSection) -> None:
    if par.cp_impl not in CP_IMPLS:
        raise UserError(f"parallel.cp_impl: unknown {par.cp_impl!r}; valid: {', '.join(CP_IMPLS)}")
    if par.ulysses_size < 1:
        raise UserError(f"parallel.ulysses_size: must be >= 1, got {par.ulysses_size}")
    if par.attention_backend not in BACKENDS:
        close = difflib.get_close_matches(str(par.attention_backend), BACKENDS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(f"parallel.attention_backend: unknown {par.attention_backend!r}; {hint}valid: {', '.join(BACKENDS)}")
    if par.zero_stage not in (0, 1, 2, 3):
        raise UserError(f"parallel.zero_stage: must be 0, 1, 2 or 3, got {par.zero_stage}")
    if par.offload_params and par.zero_stage != 3:
        raise UserError("parallel.offload_params: needs parallel.zero_stage=3")
    if par.activation_checkpointing not in CHECKPOINTING:
        raise UserError(f"parallel.activation_checkpointing: unknown {par.activation_checkpointing!r}; valid: {', '.join(CHECKPOINTING)}")
    if par.compile not in COMPILE_MODES:
        raise UserError(f"parallel.compile: unknown {par.compile!r}; valid: {', '.join(COMPILE_MODES)}")
    if par.compile != "none" and par.zero_stage == 3:
        raise UserError("parallel.compile: not supported with parallel.zero_stage=3 (its parameter hooks run "
                        "inside the compiled modules); use zero_stage <= 2 or compile=none")
    if par.checkpoint_every < 1:
        raise UserError(f"parallel.checkpoint_every: must be >= 1, got {par.checkpoint_every}")


def _validate_deepspeed_json(path: str, zero_stage: int) -> None:
    """A user DeepSpeed JSON: readable, a JSON object, and not silently changing the ZeRO stage
    the rest of the config (and the planner) assumes."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise UserError(f"parallel.deepspeed_config: {path} {what} (expected a DeepSpeed JSON file)")
    try:
        user = json.loads(p.read_text())
    except OSError as e:
        raise UserError(f"parallel.deepspeed_config: cannot read {path} ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"parallel.deepspeed_config: {path} is not valid JSON ({e})") from None
    if not isinstance(user, dict):
        raise UserError(f"parallel.deepspeed_config: {path} must hold a JSON object (DeepSpeed's config keys), "
                        f"got a {type(user).__name__}")
    zero = user.get("zero_optimization")
    if zero is not None and not isinstance(zero, dict):
        raise UserError(f"parallel.deepspeed_config: {path}: zero_optimization must be an object, got {zero!r}")
    stage = (zero or {}).get("stage")
    if stage is not None and stage != zero_stage:
        raise UserError(f"parallel.deepspeed_config: {path} sets ZeRO stage {stage} but parallel.zero_stage is "
                        f"{zero_stage}; set parallel.zero_stage={stage}")


def _validate_optim(opt: OptimSection) -> None:
    if opt.schedule not in SCHEDULES:
        raise UserError(f"optim.schedule: unknown {opt.schedule!r}; valid: {', '.join(SCHEDULES)}")
    if not (math.isfinite(opt.lr) and opt.lr > 0):
        raise UserError(f"optim.lr: must be a finite number > 0, got {opt.lr}")
    for name in ("beta1", "beta2"):
        if not 0 <= getattr(opt, name) < 1:
            raise UserError(f"optim.{name}: must be in [0, 1), got {getattr(opt, name)}")
    if not (math.isfinite(opt.eps) and opt.eps > 0):
        raise UserError(f"optim.eps: must be a finite number > 0 (e.g. 1e-8), got {opt.eps}")
    if not 0 <= opt.min_lr_ratio <= 1:
        raise UserError(f"optim.min_lr_ratio: must be in [0, 1], got {opt.min_lr_ratio}")
    for name in ("weight_decay", "grad_clip"):
        value = getattr(opt, name)
        if not (math.isfinite(value) and value >= 0):
            raise UserError(f"optim.{name}: must be a finite number >= 0, got {value}")
    if opt.warmup_steps < 0:
        raise UserError(f"optim.warmup_steps: must be >= 0, got {opt.warmup_steps}")


def _validate_checkpoint(ck: CheckpointSection) -> None:
    if ck.keep_last < 1:
        raise UserError(f"checkpoint.keep_last: must be >= 1, got {ck.keep_last}")
    if ck.every < 0:
        raise UserError(f"checkpoint.every: must be >= 0, got {ck.every}")


def _validate_log(log: LogSection) -> None:
    if log.every < 1:
        raise UserError(f"log.every: must be >= 1, got {log.every}")
    if log.peak_tflops is not None and not (math.isfinite(log.peak_tflops) and log.peak_tflops > 0):
        raise UserError(f"log.peak_tflops: must be null or a finite number > 0, got {log.peak_tflops}")


def _validate_cp(cfg: TrainConfig, cp: int, world_size: int, model_cfg, seq_len: int,
                 seq_where: str, cp_where: str) -> None:
    """The context-parallel checks of longctx.parallel, with this config's field names."""
    from longctx.parallel.layout import validate_cp

    par = cfg.parallel
    ulysses = ulysses_degree(par.cp_impl, cp, par.ulysses_size)
    try:
        validate_cp(world_size, cp, par.cp_impl, ulysses, model_cfg.num_attention_heads,
                    model_cfg.num_key_value_heads, seq_len)
    except UserError as e:
        raise UserError(str(e).replace("data.seq_len", seq_where).replace("parallel.cp_size", cp_where)) from None


def check_out_dir(out_dir: str, field: str = "out_dir") -> None:
    """A directory we may create or write into: not a file, and the nearest existing ancestor
    takes a real file create (root ignores mode bits). Creates nothing."""
    p = Path(out_dir).absolute()
    if p.exists() and not p.is_dir():
        raise UserError(f"{field}: {out_dir} is a file, not a directory")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{field}: {out_dir} is not writable ({probe} is not a directory)")
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".longctx-probe-"):
            pass
    except OSError as e:
        raise UserError(f"{field}: {out_dir} is not writable ({e.strerror})") from None


def stage_model_config(cfg: TrainConfig, stage: StageSection, where: str = "model"):
    """The model configuration of one stage: preset or init_from checkpoint, then the
    model section's overrides, then the stage's RoPE / max length. Reads only config.json."""
    from longctx.model.config import get_preset
    from longctx.model.hf import read_hf_config

    m = cfg.model
    base = read_hf_config(m.init_from) if m.init_from else get_preset(m.preset)
    changes: dict[str, Any] = dict(m.overrides)
    rope = stage.rope_parameters or m.rope_parameters
    if rope is not None:
        changes["rope_parameters"] = dict(rope)
    max_pos = stage.max_position_embeddings or m.max_position_embeddings
    if max_pos is not None:
        changes["max_position_embeddings"] = max_pos
    valid = {f.name for f in fields(type(base))}
    for key in changes:
        if key not in valid:
            close = difflib.get_close_matches(key, sorted(valid), n=1)
            raise UserError(f"model.overrides.{key}: not a model field" + (f"; did you mean {close[0]!r}?" if close else ""))
    try:
        model_cfg = base.replace(**changes)
    except UserError as e:
        msg = str(e)
        if msg.startswith("model.rope_parameters") and stage.rope_parameters:
            msg = f"{where}.rope_parameters" + msg[len("model.rope_parameters"):]
        raise UserError(msg) from None
    if rope is not None:  # the user's own dict, before normalization filled any default
        require_explicit_fields(dict(rope), f"{where}.rope_parameters" if stage.rope_parameters else "model.rope_parameters")
    if (max_pos is None and model_cfg.max_position_embeddings < stage.seq_len
            and model_cfg.rope_parameters["rope_type"] in LENGTH_FREE_ROPE):
        # trained at this length: the config (and its export) says so; the RoPE is unchanged
        model_cfg = model_cfg.replace(max_position_embeddings=stage.seq_len)
    return model_cfg
