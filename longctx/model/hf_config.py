"""config.json of a Hugging Face model directory (Llama, Mistral, Qwen2, Qwen3) <-> ModelConfig
(json only: reading a model's architecture, as config validation does, loads no torch)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from longctx.base.errors import UserError
from longctx.model.auto.support import AutoModelSpec, check_supported
from longctx.model.config import ModelConfig
from longctx.model.families import ARCHITECTURES, FAMILIES, Family
from longctx.model.rope_parameters import rope_fields_to_hf, rope_parameters_from_hf

if TYPE_CHECKING:
    import torch

SUPPORTED = ", ".join(f"{f.architecture} (model_type {name!r})" for name, f in FAMILIES.items())
# fields that keep their name in config.json, for every family; the family's class ignores the
# ones it fixes (families.py), so they are read only where the family leaves them free
_SAME_NAME_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                     "rms_norm_eps", "tie_word_embeddings", "attention_bias", "mlp_bias",
                     "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id")


def family_of(hf: dict, where: str) -> str:
    """The family a config.json names (its architectures, else its model_type)."""
    archs = hf.get("architectures") or []
    known = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
    if known:
        return known[0]
    model_type = hf.get("model_type")
    if not archs and model_type in FAMILIES:
        return model_type
    found = ", ".join(archs) if archs else f"model_type={model_type!r}"
    raise UserError(f"{where}: architecture {found} is not supported; valid: {SUPPORTED}")


def _window_from_hf(hf: dict, family: Family, layers: int) -> dict:
    """sliding_window and layer_types as transformers' config class resolves them: Qwen's
    use_sliding_window false turns the window off whatever number sliding_window holds; its
    layers slide from max_window_layers on unless layer_types says which."""
    if not family.windowed:
        return {}
    window = hf.get("sliding_window")
    if family.per_layer_window and not hf.get("use_sliding_window", False):
        window = None
    if window is None or not family.per_layer_window:
        return {"sliding_window": window}
    types = hf.get("layer_types")
    if types is None:
        first = hf.get("max_window_layers", layers)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    return {"sliding_window": window, "layer_types": list(types)}


def config_from_hf(hf: dict, where: str = "config.json", any_decoder: bool = False) -> "ModelConfig | AutoModelSpec":
    """A native family's ModelConfig; with `any_decoder`, another decoder's AutoModelSpec (what a
    checkpoint records of a transformers-path run: its type was already allowed when it trained)."""
    if any_decoder and not _is_native(hf) and hf.get("model_type") not in FAMILIES:
        return check_supported(hf, where, allow_untested=True)
    model_type = family_of(hf, where)
    family = FAMILIES[model_type]
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise UserError(f"{where}: hidden_act {act!r} is not supported; valid: 'silu'")
    kwargs = {k: hf[k] for k in _SAME_NAME_FIELDS if k in hf and hf[k] is not None and k not in family.fixed}
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        if key not in kwargs:
            raise UserError(f"{where}: missing required field {key!r}")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        # null is a value (no such token); left out: the family's class default (Llama's 1 / 2, Qwen's none)
        if key in hf or model_type.startswith("qwen"):
            kwargs[key] = hf.get(key)
        if isinstance(kwargs.get(key), list):
            kwargs[key] = kwargs[key][0]
    kwargs.update(_window_from_hf(hf, family, kwargs["num_hidden_layers"]))
    kwargs["rope_parameters"] = rope_parameters_from_hf(hf)
    try:
        return ModelConfig(model_type=model_type, **kwargs, field_path="")
    except UserError as e:
        raise UserError(f"{where}: {e}") from None


def _window_to_hf(cfg: ModelConfig, family: Family) -> dict:
    if not family.windowed:
        return {}
    if not family.per_layer_window:
        return {"sliding_window": cfg.sliding_window}
    layers = cfg.layer_types or ["sliding_attention"] * cfg.num_hidden_layers
    sliding = [i for i, t in enumerate(layers) if t == "sliding_attention"] if cfg.sliding_window else []
    return {"use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window,
            "max_window_layers": sliding[0] if sliding else cfg.num_hidden_layers,
            "layer_types": ["sliding_attention" if i in sliding else "full_attention"
                            for i in range(cfg.num_hidden_layers)]}


def config_to_hf(cfg: "ModelConfig | AutoModelSpec", dtype: "torch.dtype") -> dict:
    """The config.json of cfg's family, which transformers' Auto classes load as the same model
    (a transformers-path model: its own config.json with the run's RoPE and maximum length)."""
    if isinstance(cfg, AutoModelSpec):
        hf = {k: v for k, v in cfg.hf.items() if not k.startswith("_") and k != "attn_implementation"}
        hf["dtype"] = str(dtype).replace("torch.", "")
        hf["torch_dtype"] = hf["dtype"]
        return hf
    family = FAMILIES[cfg.model_type]
    hf = {"architectures": [family.architecture], "model_type": cfg.model_type, "hidden_act": "silu"}
    hf.update({k: getattr(cfg, k) for k in _SAME_NAME_FIELDS if k not in family.fixed})
    hf.update(_window_to_hf(cfg, family))
    hf.update(rope_fields_to_hf(cfg.rope_parameters, cfg.max_position_embeddings))
    hf["dtype"] = str(dtype).replace("torch.", "")
    hf["torch_dtype"] = hf["dtype"]  # the name before transformers 5
    hf["use_cache"] = True
    return hf


def read_model_config(path: str | os.PathLike, allow_untested: bool = False) -> "ModelConfig | AutoModelSpec":
    """The model a directory holds: a native family's ModelConfig, or the spec of a decoder the
    transformers path runs (model/auto/support.py; refused in one line when it cannot be exact)."""
    hf, cfg_file = _read_json(Path(path))
    if _is_native(hf):
        return config_from_hf(hf, where=str(cfg_file))
    return check_supported(hf, str(cfg_file), allow_untested)


def read_checkpoint_or_model_config(path: str | os.PathLike) -> "ModelConfig | AutoModelSpec":
    """read_model_config for loading a model to export or evaluate: a checkpoint's model/ (beside its
    trainer_state.json) was allowed to train, so an untested type passes; any other directory is checked."""
    return read_model_config(path, allow_untested=(Path(path).parent / "trainer_state.json").is_file())


def _is_native(hf: dict) -> bool:
    archs = hf.get("architectures") or []
    return any(a in ARCHITECTURES for a in archs) or (not archs and hf.get("model_type") in FAMILIES)


def _read_json(path: Path) -> tuple[dict, Path]:
    if not path.is_dir():
        raise UserError(f"{path}: model directory does not exist")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise UserError(f"{cfg_file}: missing (a Hugging Face model directory needs config.json)")
    try:
        return json.loads(cfg_file.read_text()), cfg_file
    except json.JSONDecodeError as e:
        raise UserError(f"{cfg_file}: invalid JSON ({e})") from None


def read_hf_config(path: str | os.PathLike) -> ModelConfig:
    """A native family's ModelConfig from the directory's config.json (any other decoder: one error)."""
    hf, cfg_file = _read_json(Path(path))
    return config_from_hf(hf, where=str(cfg_file))
