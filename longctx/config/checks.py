"""Whole-config checks of a TrainConfig, before any model, data or process-group work (and
before the run directory is created): every bad input a user can make ends here in one
UserError. The sections check their own fields (sections.py); this adds what spans sections,
files on this machine and the world size.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from longctx.attention.backends import check_backend_available
from longctx.base.errors import UserError
from longctx.config.probe import check_probe_lengths
from longctx.config.run_plan import RunPlan, derive_plan
from longctx.config.sections import TrainConfig
from longctx.config.stages import RunStage, resolve_stages
from longctx.config.validation import check_buckets, check_heldout
from longctx.data.config import validate_data_config
from longctx.data.tokenizer import check_local_tokenizer_vocab
from longctx.model.auto.support import AutoModelSpec
from longctx.model.config import ModelConfig
from longctx.parallel.layout import CPFields, ulysses_degree, validate_cp
from longctx.parallel.nvme import check_async_io
from longctx.reporting.wandb_log import check_installed
from longctx.storage.hub import MODEL_FILES, hub_or_local

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")  # what load_pretrained reads


def validate_config(cfg: TrainConfig, world_size: int, *, weights: bool = True,
                    stages: Optional[Sequence[RunStage]] = None) -> RunPlan:
    """Every check, for a run on this machine with `world_size` processes; returns the run plan
    derived on the way (`stages`: resolve_stages(cfg), when the caller has them already).
    weights=False (a dry run, --print-config) accepts a model.init_from directory that does not
    exist yet: the architecture is then model.preset's (config.stages.missing_weights_note says
    so), and data source paths that do not exist yet (config.stages.missing_data_note)."""
    stages = validate_portable(cfg, stages)
    deepspeed = _validate_on_this_machine(cfg, weights)
    plan = derive_plan(cfg, world_size, stages=stages, deepspeed=deepspeed, files=weights)
    for stage, model_cfg in zip(plan.stages, plan.model_configs):
        _validate_stage(stage, model_cfg, world_size, files=weights)
    if cfg.validation.enabled:
        check_heldout(cfg.validation, plan.stages, files=weights)
    check_local_tokenizer_vocab(cfg.data.tokenizer, plan.model_configs[-1].vocab_size)
    if cfg.train.adapter is not None:
        check_adapter_names(cfg.train.adapter, plan.model_configs[0])
    check_out_dir(cfg.out_dir)
    return plan


def validate_portable(cfg: TrainConfig, stages: Optional[Sequence[RunStage]] = None) -> list[RunStage]:
    """The checks that hold on any machine and for any world size, reading no file: what
    `longctx plan` checks of a job that runs elsewhere. validate_config adds the rest. Returns
    the stages (`stages`, else resolve_stages(cfg)), checked."""
    for section in (cfg.model, cfg.parallel, cfg.optim, cfg.train, cfg.checkpoint, cfg.log, cfg.validation):
        section.validate()
    if cfg.data.micro_batch_size < 1:
        raise UserError(f"data.micro_batch_size: must be >= 1, got {cfg.data.micro_batch_size}")
    stages = list(resolve_stages(cfg) if stages is None else stages)
    for stage in stages:
        stage.validate()
    check_buckets(cfg.validation, stages)
    check_probe_lengths(cfg.validation.probe, stages)
    if cfg.train.adapter is not None and cfg.parallel.compile != "none":
        raise UserError("parallel.compile: not with train.adapter yet (the compiled MLPs have not been checked with "
                        "LoRA layers inside); use parallel.compile=none")
    if cfg.train.adapter is not None and cfg.train.adapter.dropout > 0 and cfg.parallel.mlp_tile_tokens:
        raise UserError("train.adapter.dropout: must be 0 with parallel.mlp_tile_tokens (the tiles' backward "
                        "recomputes the MLP, and a new dropout mask would differ from the forward's)")
    return stages


def _validate_on_this_machine(cfg: TrainConfig, weights: bool) -> Optional[dict]:
    """Files and libraries the run needs here: init_from (and its weights, with `weights`), the
    attention backend, the DeepSpeed JSON, a resume path, cache directories (data sources and
    the tokenizer: per stage). Returns the DeepSpeed JSON, parsed (None when not set)."""
    m, par, ck = cfg.model, cfg.parallel, cfg.checkpoint
    if m.init_from is not None:
        # a Hub id downloads here (weights), or is read from the HF cache when there (a dry run)
        local = hub_or_local(m.init_from, "model.init_from", MODEL_FILES, revision=m.revision, download=weights)
        if weights or local is not None:
            _check_init_from(local or Path(m.init_from), weights)
    check_backend_available(par.attention_backend, "parallel.attention_backend")
    if cfg.log.wandb is not None:
        check_installed("log.wandb")
    deepspeed = None
    if par.deepspeed_config is not None:
        deepspeed = load_deepspeed_json(par.deepspeed_config)
        _check_zero_stage(deepspeed, par.deepspeed_config, par.zero_stage)
    if ck.resume not in ("none", "auto") and not Path(ck.resume).is_dir():
        raise UserError(f"checkpoint.resume: {ck.resume} is not 'none', 'auto' or an existing checkpoint directory")
    for name in ("cache_dir", "hf_cache_dir"):
        if getattr(cfg.data, name) is not None:
            check_out_dir(getattr(cfg.data, name), f"data.{name}")
    if par.offload_activations_path is not None:
        check_out_dir(par.offload_activations_path, "parallel.offload_activations_path")
    if par.offload_params_path is not None:
        check_out_dir(par.offload_params_path, "parallel.offload_params_path")
        check_async_io("parallel.offload_params_device")
    return deepspeed


def check_adapter_names(adapter, model_cfg) -> None:
    """train.adapter's module names against the model's modules (built on the meta device: no
    memory, no weights), and PEFT there to apply them. Imports torch: adapter runs only."""
    from longctx.model.adapter import check_adapter
    from longctx.model.llama import build_model

    try:
        import peft  # noqa: F401
    except ImportError:
        raise UserError("train.adapter: needs the peft package (pip install 'longctx[adapters]')") from None
    if isinstance(model_cfg, AutoModelSpec):
        from longctx.model.auto.model import build_auto_model  # imports transformers: this path only

        model = build_auto_model(model_cfg, device="meta")
    else:
        model = build_model(model_cfg, device="meta")
    check_adapter(adapter, model)


def _check_init_from(path: Path, weights: bool) -> None:
    """model.init_from: a Hugging Face Llama directory (config.json, and the weight files when
    training starts; their contents are verified as they load)."""
    expected = "expected a Hugging Face Llama directory: config.json and model.safetensors(.index.json)"
    if not path.exists():
        raise UserError(f"model.init_from: {path} does not exist ({expected}); download the model there, or set "
                        "model.init_from=DIR or a Hub id org/name (the dry run and --print-config take the "
                        "architecture from model.preset without it)")
    if not (path / "config.json").is_file():
        raise UserError(f"model.init_from: {path} has no config.json ({expected})")
    if weights and not any((path / name).is_file() for name in WEIGHT_FILES):
        raise UserError(f"model.init_from: {path} has no weights (none of {', '.join(WEIGHT_FILES)})")


def _validate_stage(stage: RunStage, model_cfg: ModelConfig, world_size: int, files: bool = True) -> None:
    """One stage's cp layout for this world size, its data and its model (`model_cfg`)."""
    names, par = stage.field_names, stage.parallel
    cp = par.cp_size
    if world_size % cp != 0:
        raise UserError(f"{names['cp_size']}: {cp} must divide the world size {world_size} (world = dp x cp)")
    validate_data_config(stage.data, files=files, sources_field=names["sources"])
    validate_cp(world_size, cp, par.cp_impl, ulysses_degree(par.cp_impl, cp, par.ulysses_size),
                model_cfg.num_attention_heads, model_cfg.num_key_value_heads, stage.seq_len,
                fields=CPFields(cp_size=names["cp_size"], seq_len=names["seq_len"]))
    if isinstance(model_cfg, AutoModelSpec):
        _check_transformers_path(par, model_cfg.model_type)
    if model_cfg.max_position_embeddings < stage.seq_len:  # set too small, or a length-dependent RoPE
        field = names["max_position_embeddings"]
        raise UserError(f"{field}: the model's max_position_embeddings {model_cfg.max_position_embeddings} is below "
                        f"the training length {names['seq_len']}={stage.seq_len}; "
                        f"set {field}={stage.seq_len} (or more)")


def _check_transformers_path(par, model_type: str) -> None:
    """What the transformers path does not run: MLP tiling and compiling the norms and MLPs are
    the native model's (its own MLP and RMSNorm modules); a transformers model would run untiled
    and eager without saying so."""
    if par.mlp_tile_tokens:
        raise UserError(f"parallel.mlp_tile_tokens: MLP tiling runs on the native model path only; model_type "
                        f"{model_type!r} runs through transformers' own class: set parallel.mlp_tile_tokens=0")
    if par.compile != "none":
        raise UserError(f"parallel.compile: {par.compile!r} compiles the native model's norms and MLPs only; "
                        f"model_type {model_type!r} runs through transformers' own class: set parallel.compile=none")


def load_deepspeed_json(path: str) -> dict:
    """A user DeepSpeed JSON (parallel.deepspeed_config), parsed: readable, a JSON object, its
    zero_optimization an object. The one reader: the trainer merges what this returns."""
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
    return user


def _check_zero_stage(user: dict, path: str, zero_stage: int) -> None:
    """The JSON must not silently change the ZeRO stage the rest of the config (and the planner) assumes."""
    stage = (user.get("zero_optimization") or {}).get("stage")
    if stage is not None and stage != zero_stage:
        raise UserError(f"parallel.deepspeed_config: {path} sets ZeRO stage {stage} but parallel.zero_stage is "
                        f"{zero_stage}; set parallel.zero_stage={stage}")


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
