"""RoPE settings without tensors: the fields of each rope_type, their validation and defaults,
and reading them from an HF config.json (torch-free, so config validation does not load torch).
The types and fields are rope.py's, which computes the frequencies.
"""
from __future__ import annotations

import math
from typing import Any

from longctx.base.errors import UserError

_COMMON = {"rope_type", "rope_theta"}
ROPE_KEYS: dict[str, set[str]] = {
    "default": _COMMON,
    "linear": _COMMON | {"factor"},
    "dynamic": _COMMON | {"factor", "original_max_position_embeddings"},
    "yarn": _COMMON | {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                       "attention_factor", "mscale", "mscale_all_dim", "truncate"},
    "llama3": _COMMON | {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "longrope": _COMMON | {"short_factor", "long_factor", "factor", "attention_factor",
                           "original_max_position_embeddings"},
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor", "long_factor"),
}


# The pretraining length the scaled types are computed from. transformers fills it from
# max_position_embeddings when a config.json leaves it out (standardize_rope_params), and so does
# normalize_rope_parameters for such files; a training config that sets rope_parameters for an
# extension usually raises max_position_embeddings too, so there it must be given.
EXPLICIT_IN_TRAINING: dict[str, tuple[str, ...]] = {
    "yarn": ("original_max_position_embeddings",),
    "llama3": ("original_max_position_embeddings",),
    "longrope": ("original_max_position_embeddings",),
}


def require_explicit_fields(params: Any, where: str = "model.rope_parameters") -> None:
    """UserError naming the first field of EXPLICIT_IN_TRAINING that a user's rope_parameters
    (not an HF config.json: those keep transformers' defaulting) leaves out."""
    if not isinstance(params, dict):
        return  # normalize_rope_parameters names the type error
    rope_type = params.get("rope_type", params.get("type", "default"))
    for key in EXPLICIT_IN_TRAINING.get(rope_type, ()):
        if params.get(key) is None:
            raise UserError(f"{where}.{key}: required for rope_type {rope_type!r} (the length the model was "
                            f"pretrained at, e.g. 4096 for Llama 2, 8192 for Llama 3)")


def rope_parameters_from_hf(config: dict) -> dict:
    """Read RoPE settings from an HF config.json dict (new `rope_parameters` or legacy
    `rope_theta` + `rope_scaling`)."""
    params = dict(config.get("rope_parameters") or {})
    legacy = config.get("rope_scaling") or {}
    if not params:
        params = dict(legacy)
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.pop("type", None)
    params.setdefault("rope_type", "default")
    if "rope_theta" not in params:
        params["rope_theta"] = float(config.get("rope_theta", 10000.0))
    if "original_max_position_embeddings" in config and params["rope_type"] in ("llama3", "yarn", "longrope"):
        params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    return params


def longrope_attention_factor(params: dict, max_position_embeddings: int) -> float:
    """The cos/sin scale of a normalized longrope config: its attention_factor, else the one its
    factor (by default max_position_embeddings / original_max_position_embeddings) implies."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_position_embeddings / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def rope_fields_to_hf(params: dict, max_position_embeddings: int) -> dict:
    """The config.json RoPE fields of a normalized config that transformers 4.56 and 5.x both read
    as it is: `rope_parameters` (5.x's name, and what read_hf_config reads back) beside the legacy
    top-level `rope_theta` and `rope_scaling` (4.x reads only these; 5.x too prefers a non-null
    `rope_scaling` over `rope_parameters`).

    longrope: 4.x takes `original_max_position_embeddings` from the top level only (without it
    the short/long switch happens at max_position_embeddings), and there it replaces `factor` by
    max_position_embeddings / original when it computes the attention scale; so the top-level
    field is written and `rope_scaling` carries the attention scale itself."""
    rope_type = params["rope_type"]
    fields: dict[str, Any] = {"rope_parameters": dict(params), "rope_theta": params["rope_theta"],
                              "rope_scaling": None}
    if rope_type == "default":
        return fields
    scaling = {"rope_type": rope_type, **{k: v for k, v in params.items() if k not in ("rope_type", "rope_theta")}}
    if rope_type == "longrope":
        scaling["attention_factor"] = longrope_attention_factor(params, max_position_embeddings)
        fields["original_max_position_embeddings"] = original = params["original_max_position_embeddings"]
        if scaling.get("factor") is None and max_position_embeddings >= original:
            scaling["factor"] = max_position_embeddings / original  # 5.x warns when a longrope config has none
    fields["rope_scaling"] = scaling
    return fields


def normalize_rope_parameters(params: Any, *, head_dim: int, max_position_embeddings: int,
                              where: str = "model.rope_parameters") -> dict:
    """Validate and fill defaults; raises UserError naming the bad field."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        try:
            params = dict(params)
        except (TypeError, ValueError):
            raise UserError(f"{where}: must be a mapping, got {type(params).__name__}") from None
    p = dict(params)
    if "type" in p:
        p.setdefault("rope_type", p.pop("type"))
    rope_type = p.setdefault("rope_type", "default")
    if rope_type not in ROPE_KEYS:
        raise UserError(f"{where}.rope_type: unknown {rope_type!r}; valid: {', '.join(ROPE_KEYS)}")
    allowed = ROPE_KEYS[rope_type]
    unknown = sorted(k for k in p if k not in allowed)
    if unknown:
        raise UserError(f"{where}: unknown field {unknown[0]!r} for rope_type {rope_type!r}; "
                        f"valid: {', '.join(sorted(allowed))}")
    missing = [k for k in _REQUIRED[rope_type] if p.get(k) is None]
    if missing:
        raise UserError(f"{where}.{missing[0]}: required for rope_type {rope_type!r}")
    p["rope_theta"] = float(p.get("rope_theta", 10000.0))
    if not p["rope_theta"] > 1.0:
        raise UserError(f"{where}.rope_theta: must be > 1, got {p['rope_theta']}")
    if rope_type in ("llama3", "yarn", "longrope"):
        p.setdefault("original_max_position_embeddings", max_position_embeddings)
        omp = p["original_max_position_embeddings"]
        if not isinstance(omp, int) or omp <= 0:
            raise UserError(f"{where}.original_max_position_embeddings: must be a positive integer, got {omp!r}")
    if p.get("factor") is not None:
        p["factor"] = float(p["factor"])
        if p["factor"] < 1.0:
            raise UserError(f"{where}.factor: must be >= 1 (it extends the context), got {p['factor']}")
    if rope_type == "llama3" and not p["high_freq_factor"] > p["low_freq_factor"]:
        raise UserError(f"{where}.high_freq_factor: must be > low_freq_factor ({p['low_freq_factor']})")
    if rope_type == "longrope":
        for key in ("short_factor", "long_factor"):
            vals = list(p[key])
            if len(vals) != head_dim // 2:
                raise UserError(f"{where}.{key}: needs head_dim/2 = {head_dim // 2} values, got {len(vals)}")
            p[key] = [float(v) for v in vals]
    return p
