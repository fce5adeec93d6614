"""`model_overrides`: ModelConfig fields replaced at eval time, without training (zero-shot RoPE).

    base = base_model_config(model_dir)                 # reads config.json (or the checkpoint's record)
    config, effective = apply_overrides(base, {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
    model = load_model(model_dir, config=config)

A rope_parameters override keeps the model's rope_theta unless it sets one, and a scaled type's
original_max_position_embeddings defaults to the model's own max_position_embeddings (the length
it was pretrained at). Fields that change the weights' shapes are refused: the weights would not
load. `effective` holds the overridden fields as the model runs with them (normalized, defaults
filled): what results.json records and the cells' key hashes.
"""
from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, Mapping

from longctx.base.errors import UserError
from longctx.model.config import ModelConfig
from longctx.model.hf_config import read_checkpoint_or_model_config

WHERE = "eval.model_overrides"
# fields that change no weight's shape (or whether the head is tied): valid at eval time
EVAL_FIELDS = ("rope_parameters", "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id",
               "pad_token_id", "initializer_range", "sliding_window")
_SCALED = ("yarn", "llama3", "longrope")  # types computed from original_max_position_embeddings


def check_keys(overrides: Mapping[str, Any]) -> None:
    """Every key a ModelConfig field that leaves the weights' shapes alone (no file read)."""
    if not isinstance(overrides, Mapping):
        raise UserError(f"{WHERE}: must be a mapping of ModelConfig fields, e.g. "
                        f"{WHERE}.max_position_embeddings=32768")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    for key in overrides:
        if key not in fields:
            close = difflib.get_close_matches(str(key), sorted(fields), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UserError(f"{WHERE}.{key}: not a model field; {hint}valid: {', '.join(EVAL_FIELDS)}")
        if key not in EVAL_FIELDS:
            raise UserError(f"{WHERE}.{key}: changes the shapes of the weights (they would not load); "
                            f"valid at eval: {', '.join(EVAL_FIELDS)}")
    rope = overrides.get("rope_parameters")
    if rope is not None and not isinstance(rope, Mapping):
        raise UserError(f"{WHERE}.rope_parameters: must be a mapping, e.g. {{rope_type: yarn, factor: 4.0, "
                        "original_max_position_embeddings: 8192}}")


def base_model_config(model_dir: Path) -> ModelConfig:
    """The configuration the model directory loads with (config.json, or a checkpoint's record)."""
    # loads torch: eval/config.py, which needs only check_keys, stays free of it (`--help` is fast)
    from longctx.eval.model_io import is_ds_only_checkpoint, trained_model

    model_dir = Path(model_dir)
    if is_ds_only_checkpoint(model_dir):
        return trained_model(model_dir).config
    return read_checkpoint_or_model_config(model_dir)  # the transformers path's models too


def apply_overrides(base: ModelConfig, overrides: Mapping[str, Any]) -> tuple[ModelConfig, dict]:
    """(base with the overrides, {overridden field: its value as the model runs with it});
    a bad field or value is one UserError naming eval.model_overrides.<field>."""
    check_keys(overrides)
    if not overrides:
        return base, {}
    changes = dict(overrides)
    if changes.get("rope_parameters") is not None:
        changes["rope_parameters"] = _rope_defaults(dict(changes["rope_parameters"]), base)
    _check_dynamic(changes, base)
    try:
        config = base.replace(field_path=WHERE, **changes)
    except (TypeError, ValueError) as e:  # e.g. a string where a number belongs
        raise UserError(f"{WHERE}: {e}") from None
    return config, {key: getattr(config, key) for key in overrides}


def _rope_defaults(rope: dict, base: ModelConfig) -> dict:
    """The model's theta, and its length as the pretraining length of a scaled type."""
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    rope.setdefault("rope_theta", base.rope_parameters["rope_theta"])
    if rope.get("rope_type") in _SCALED and rope.get("original_max_position_embeddings") is None:
        rope["original_max_position_embeddings"] = base.rope_parameters.get(
            "original_max_position_embeddings", base.max_position_embeddings)
    return rope


def _check_dynamic(changes: dict, base: ModelConfig) -> None:
    """Dynamic NTK grows its base past max_position_embeddings (as in transformers): raising that
    length with it leaves every shorter sequence unscaled."""
    rope = changes.get("rope_parameters") or {}
    new_max = changes.get("max_position_embeddings")
    if rope.get("rope_type") == "dynamic" and isinstance(new_max, int) and new_max > base.max_position_embeddings:
        raise UserError(f"{WHERE}.max_position_embeddings: dynamic NTK scales the sequences longer than "
                        f"max_position_embeddings (the pretrained length, {base.max_position_embeddings} here); "
                        f"with {new_max} nothing shorter is scaled: leave max_position_embeddings out")
