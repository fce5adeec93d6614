"""Training stages resolved once: each RunStage carries every field it trains with, so
nothing downstream falls back to the base config. A config without `stages` is one stage,
"main", from data / train / optim.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from longctx.base.errors import UserError
from longctx.config.sections import (
    ModelSection,
    OptimSection,
    ParallelSection,
    StageSection,
    TrainConfig,
    require_at_least,
    require_finite,
)
from longctx.data.config import DataConfig
from longctx.model.auto.support import AutoModelSpec
from longctx.model.config import ModelConfig, check_window, get_preset
from longctx.model.hf_config import read_model_config
from longctx.model.rope_parameters import normalize_rope_parameters, require_explicit_fields
from longctx.parallel.zigzag import check_seq_len
from longctx.storage.hub import CONFIG_FILES, hub_or_local

# RoPE types whose frequencies do not depend on max_position_embeddings (scaled ones, once
# original_max_position_embeddings is set): a stage longer than it raises it to its length
LENGTH_FREE_ROPE = ("default", "linear", "yarn", "llama3")


@dataclass
class RunStage:
    """One training stage with every field resolved once: nothing downstream falls back to the base config."""

    index: int
    name: str  # the stage's name; "main" for a config without `stages`
    where: str  # field prefix for error messages: "stages[3]", or "model" without stages
    steps: int
    seq_len: int
    model: ModelSection  # base section + the stage's rope_parameters / max_position_embeddings
    parallel: ParallelSection  # cp_size resolved (stage's or base's)
    optim: OptimSection  # lr / warmup_steps resolved
    data: DataConfig  # seq_len, sources, emit_answer_mask resolved
    # resolved field -> the field the user sets to change it (e.g. "cp_size" -> "stages[1].cp_size"
    # when the stage sets it, else "parallel.cp_size"), for error messages
    field_names: Dict[str, str]

    def validate(self) -> None:
        """The stage's own values (portable: no file, any world size)."""
        require_at_least(self.field_names["steps"], self.steps, 1)
        require_finite(self.field_names["lr"], self.optim.lr, positive=True)
        require_at_least(self.field_names["warmup_steps"], self.optim.warmup_steps, 0)
        require_at_least(self.field_names["seq_len"], self.seq_len, 2)
        require_at_least(self.field_names["cp_size"], self.parallel.cp_size, 1)
        check_seq_len(self.seq_len, self.parallel.cp_size, seq_len_field=self.field_names["seq_len"],
                      cp_size_field=self.field_names["cp_size"])


def resolve_stages(cfg: TrainConfig) -> list[RunStage]:
    """The stages to run, each complete (reads no file)."""
    if not cfg.stages:
        return [_resolve(cfg, 0, StageSection(name="main", seq_len=cfg.data.seq_len, steps=cfg.train.steps), False)]
    return [_resolve(cfg, i, stage, True) for i, stage in enumerate(cfg.stages)]


def _set(value, base):
    return base if value is None else value


def _resolve(cfg: TrainConfig, index: int, stage: StageSection, staged: bool) -> RunStage:
    where = f"stages[{index}]" if staged else "model"

    def named(field: str, own: bool, base: str) -> str:
        return f"stages[{index}].{field}" if own else base

    names = {
        "steps": named("steps", staged, "train.steps"),
        "seq_len": named("seq_len", staged, "data.seq_len"),
        "lr": named("lr", stage.lr is not None, "optim.lr"),
        "warmup_steps": named("warmup_steps", stage.warmup_steps is not None, "optim.warmup_steps"),
        "cp_size": named("cp_size", bool(stage.cp_size), "parallel.cp_size"),
        "rope_parameters": named("rope_parameters", bool(stage.rope_parameters), "model.rope_parameters"),
        "max_position_embeddings": named("max_position_embeddings", staged, "model.max_position_embeddings"),
        "sources": named("sources", stage.sources is not None, "data.sources"),
    }
    m = cfg.model
    model = dataclasses.replace(m, rope_parameters=stage.rope_parameters or m.rope_parameters,
                                max_position_embeddings=stage.max_position_embeddings or m.max_position_embeddings)
    sources = stage.sources if stage.sources is not None else cfg.data.sources
    data = dataclasses.replace(cfg.data, seq_len=stage.seq_len, sources=list(sources),
                               emit_answer_mask=cfg.data.emit_answer_mask or cfg.train.answer_loss_weight != 1.0)
    return RunStage(
        index=index, name=stage.name or "main", where=where, steps=stage.steps, seq_len=stage.seq_len, model=model,
        parallel=dataclasses.replace(cfg.parallel, cp_size=stage.cp_size or cfg.parallel.cp_size),
        optim=dataclasses.replace(cfg.optim, lr=_set(stage.lr, cfg.optim.lr),
                                  warmup_steps=_set(stage.warmup_steps, cfg.optim.warmup_steps)),
        data=data, field_names=names)


def missing_weights_note(model: ModelSection) -> Optional[str]:
    """A note when model.init_from does not exist (yet): the architecture is model.preset's
    until the weights are there (training itself stops on the missing directory)."""
    if model.init_from is None or init_from_dir(model) is not None:
        return None
    return (f"model.init_from {model.init_from} does not exist yet (nor in the Hugging Face cache): architecture from "
            f"model.preset={model.preset} (training checks the weights, or downloads them, when it starts)")


def init_from_dir(model: ModelSection) -> Optional[Path]:
    """model.init_from's directory here: the path itself, or a Hub id's snapshot in the HF cache
    (no network: validate_config downloads it before a run); None when neither is there."""
    if model.init_from is None:
        return None
    return hub_or_local(model.init_from, "model.init_from", CONFIG_FILES, revision=model.revision, download=False)


def missing_data_note(stages: list[RunStage]) -> Optional[str]:
    """A note naming the data source paths that do not exist (yet): a dry run plans without
    them (training itself stops on a missing path)."""
    missing = {f"{st.field_names['sources']}[{i}].path {src.path}": None for st in stages
               for i, src in enumerate(st.data.sources) if not src.path_exists()}
    if not missing:
        return None
    verb = "does" if len(missing) == 1 else "do"
    return f"{', '.join(missing)}: {verb} not exist yet (training checks the data when it starts)"


def origin_config(model: ModelSection) -> ModelConfig | AutoModelSpec:
    """The architecture before the model section's changes: model.init_from's config.json (the
    preset's when that directory does not exist yet, see missing_weights_note). Reads only
    config.json; validate_config reads it once for the whole run (RunPlan.origin)."""
    local = init_from_dir(model)
    return read_model_config(local, model.allow_untested) if local is not None else get_preset(model.preset)


def stage_model_config(stage: RunStage, base: Optional[ModelConfig] = None) -> ModelConfig:
    """The model configuration of one stage: `base` (origin_config(stage.model) when None),
    then the model section's overrides, then the stage's RoPE / max length."""
    m = stage.model
    base = origin_config(m) if base is None else base
    changes: Dict[str, Any] = dict(m.overrides)
    if m.rope_parameters is not None:
        changes.pop("rope_parameters", None)  # the model section's (or stage's) own field wins
    if m.max_position_embeddings is not None:
        changes["max_position_embeddings"] = m.max_position_embeddings
    # the transformers path takes any config.json key; the native path its ModelConfig fields
    valid = set(base.hf) if isinstance(base, AutoModelSpec) else {f.name for f in dataclasses.fields(type(base))}
    for key in changes:
        if key not in valid:
            close = difflib.get_close_matches(key, sorted(valid), n=1)
            raise UserError(f"model.overrides.{key}: not a model field"
                            + (f"; did you mean {close[0]!r}?" if close else ""))
    model_cfg = base.replace(**changes)
    if m.rope_parameters is not None:
        model_cfg = _with_rope(model_cfg, dict(m.rope_parameters), stage.field_names["rope_parameters"])
    if (m.max_position_embeddings is None and model_cfg.max_position_embeddings < stage.seq_len
            and model_cfg.rope_parameters["rope_type"] in LENGTH_FREE_ROPE):
        # trained at this length: the config (and its export) says so; the RoPE is unchanged
        model_cfg = model_cfg.replace(max_position_embeddings=stage.seq_len)
    check_window(model_cfg, stage.seq_len, stage.field_names["seq_len"], "model.overrides.sliding_window=null")
    return model_cfg


def _with_rope(model_cfg: ModelConfig, rope: dict, field: str) -> ModelConfig:
    """`model_cfg` with the user's rope_parameters, checked under `field` (the stage's own
    field when the stage sets them): the user's dict must name what training cannot default."""
    normalized = normalize_rope_parameters(rope, head_dim=model_cfg.head_dim,
                                           max_position_embeddings=model_cfg.max_position_embeddings, where=field)
    require_explicit_fields(rope, field)
    return model_cfg.replace(rope_parameters=normalized)
