"""An adapter run's weights in the ecosystem's two formats.

    merged_state_dict(state, adapter)      the model's own weights with each LoRA update folded
                                           in (what PEFT's merge_and_unload() gives): the HF export
    write_adapter_dir(state, adapter, config, path, base=...)
                                           a PEFT adapter directory: adapter_config.json,
                                           adapter_model.safetensors, and config.json (the run's
                                           architecture and RoPE, for the base model to load with)

`state` is the live model's state dict (own names: `...q_proj.base_layer.weight`,
`...q_proj.lora_A.default.weight`, the trainable modules' plain names). In the adapter file each
LoRA factor is `base_model.model.<transformers name>.lora_A.weight` and each trainable module's
weight `base_model.model.<transformers name>`, as PEFT saves its modules_to_save.

    base = AutoModelForCausalLM.from_pretrained(BASE, config=AutoConfig.from_pretrained(DIR))
    model = PeftModel.from_pretrained(base, DIR)        # the run's logits
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import save_file

from longctx.model.adapter import ADAPTER_NAME, is_trainable, lora_config
from longctx.model.auto.support import AutoModelSpec
from longctx.model.hf import to_hf_key
from longctx.model.hf_config import config_to_hf
from longctx.storage import atomic

Tensor = torch.Tensor
_A, _B = f".lora_A.{ADAPTER_NAME}.weight", f".lora_B.{ADAPTER_NAME}.weight"


def _modules_with_lora(state: dict[str, Tensor]) -> list[str]:
    return sorted(key[:-len(_A)] for key in state if key.endswith(_A))


def merged_state_dict(state: dict[str, Tensor], adapter) -> dict[str, Tensor]:
    """The plain model's weights: W + (B @ A) * alpha / r for every wrapped module (the update
    computed in fp32 and rounded to W's dtype, then added, as PEFT merges on CPU)."""
    scaling = float(adapter.alpha) / int(adapter.r)
    out: dict[str, Tensor] = {}
    wrapped = _modules_with_lora(state)
    for module in wrapped:
        w = state[f"{module}.base_layer.weight"]  # (out, in)
        delta = (state[module + _B].float() @ state[module + _A].float()) * scaling  # (out, r) @ (r, in)
        out[f"{module}.weight"] = w + delta.to(w.dtype)
    for key, value in state.items():
        if ".lora_" in key or key.endswith(".base_layer.weight"):
            continue
        out[key.replace(".base_layer.", ".")] = value  # a wrapped module's bias
    return out


def adapter_tensors(state: dict[str, Tensor], adapter, own_names: bool) -> dict[str, Tensor]:
    """adapter_model.safetensors' tensors (PEFT's names; `own_names`: the state's names are
    transformers' already, the transformers path)."""
    hf = (lambda k: k) if own_names else to_hf_key
    out = {}
    for module in _modules_with_lora(state):
        for suffix, saved in ((_A, ".lora_A.weight"), (_B, ".lora_B.weight")):
            out[f"base_model.model.{hf(module)}{saved}"] = state[module + suffix]
    for key, value in state.items():
        module = key.rsplit(".", 1)[0]
        if ".lora_" not in key and ".base_layer." not in key and is_trainable(module, adapter.trainable):
            out[f"base_model.model.{hf(key)}"] = value
    return {k: v.detach().to("cpu").contiguous() for k, v in out.items()}


def write_adapter_dir(state: dict[str, Tensor], adapter, config, path: str | os.PathLike, *,
                      base: Optional[str] = None) -> Path:
    """The PEFT adapter directory at `path`, built in a temporary sibling and swapped into place
    (an existing one is replaced whole: the run's own adapter/, or an export --out the command
    checked)."""
    target = Path(os.path.abspath(path))
    atomic.remove_stale(target.parent, atomic.note, name=target.name)
    tmp = atomic.make_temp_dir(target)
    try:
        tensors = adapter_tensors(state, adapter, isinstance(config, AutoModelSpec))
        dtype = next(iter(tensors.values())).dtype
        save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        peft_config = lora_config(adapter)
        peft_config.base_model_name_or_path = base
        peft_config.inference_mode = True
        peft_config.save_pretrained(str(tmp))
        (tmp / "config.json").write_text(json.dumps(config_to_hf(config, dtype), indent=2))
        atomic.swap_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
