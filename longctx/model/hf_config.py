"""config.json of a Hugging Face Llama directory <-> ModelConfig (json only: reading a model's
architecture, as config validation does, loads no torch)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from longctx.errors import UserError
from longctx.model.config import ModelConfig
from longctx.model.rope_parameters import rope_parameters_from_hf

if TYPE_CHECKING:
    import torch

LLAMA_ARCHITECTURES = {"LlamaForCausalLM"}
_SAME_NAME_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                     "rms_norm_eps", "tie_word_embeddings", "attention_bias", "mlp_bias",
                     "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id")


def config_from_hf(hf: dict, where: str = "config.json") -> ModelConfig:
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    if (archs and not set(archs) & LLAMA_ARCHITECTURES) or (not archs and model_type != "llama"):
        found = ", ".join(archs) if archs else f"model_type={model_type!r}"
        raise UserError(f"{where}: architecture {found} is not supported; valid: LlamaForCausalLM (model_type 'llama')")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise UserError(f"{where}: hidden_act {act!r} is not supported; valid: 'silu'")
    kwargs = {k: hf[k] for k in _SAME_NAME_FIELDS if k in hf and hf[k] is not None}
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        if key not in kwargs:
            raise UserError(f"{where}: missing required field {key!r}")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(kwargs.get(key), list):
            kwargs[key] = kwargs[key][0]
    kwargs["rope_parameters"] = rope_parameters_from_hf(hf)
    try:
        return ModelConfig(**kwargs, field_path="")
    except UserError as e:
        raise UserError(f"{where}: {e}") from None


def config_to_hf(cfg: ModelConfig, dtype: "torch.dtype") -> dict:
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu"}
    hf.update({k: getattr(cfg, k) for k in _SAME_NAME_FIELDS})
    rope = dict(cfg.rope_parameters)
    hf["rope_parameters"] = rope
    # Older transformers (< 5) read these two instead of rope_parameters.
    hf["rope_theta"] = rope["rope_theta"]
    legacy = {k: v for k, v in rope.items() if k != "rope_theta"}
    hf["rope_scaling"] = None if rope["rope_type"] == "default" else {**legacy, "type": rope["rope_type"]}
    hf["dtype"] = str(dtype).replace("torch.", "")
    hf["torch_dtype"] = hf["dtype"]  # the name before transformers 5
    hf["use_cache"] = True
    return hf


def read_hf_config(path: str | os.PathLike) -> ModelConfig:
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: model directory does not exist")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise UserError(f"{cfg_file}: missing (a Hugging Face model directory needs config.json)")
    try:
        hf = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{cfg_file}: invalid JSON ({e})") from None
    return config_from_hf(hf, where=str(cfg_file))
