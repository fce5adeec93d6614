"""Adapters on a plain model (either path): PEFT's LoRA layers injected into the named linear
modules, a few modules trained whole, every other weight frozen (requires_grad False).

    check_adapter(adapter, meta_model)     the config's names against the model's modules (no work)
    apply_adapter(model, adapter, seed)    in place: LoRA injected, the rest frozen

Names follow PEFT's matching: a target is a module name suffix (`q_proj` wraps every
`...self_attn.q_proj`), a trainable entry a plain suffix of the module's name (`norm` matches
`input_layernorm`, `post_attention_layernorm`, the final `norm`), as PEFT's modules_to_save.
The trainable modules keep their own parameters (no copy, their names unchanged); the LoRA
layers add `<module>.base_layer.weight` (frozen), `<module>.lora_A.default.weight` (r, in) and
`<module>.lora_B.default.weight` (out, r), whose product times alpha / r adds to the module's output.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from longctx.base.errors import UserError

ADAPTER_NAME = "default"  # PEFT's name of a model's one adapter
LORA_MARKERS = (".lora_A.", ".lora_B.")


def is_target(name: str, targets: Iterable[str]) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def is_trainable(name: str, trainable: Iterable[str]) -> bool:
    return bool(name) and any(name.endswith(t) for t in trainable)


def _head(model: nn.Module):
    return getattr(model, "lm_head", None)


def linear_names(model: nn.Module) -> list[str]:
    """The distinct last names of the model's linear modules LoRA can wrap (not the vocabulary head)."""
    head = _head(model)
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m) is nn.Linear and m is not head})


def check_adapter(adapter, model: nn.Module) -> None:
    """UserError for a name in train.adapter the model (any device, meta included) cannot take."""
    linears = linear_names(model)
    listing = f"the model's linear modules: {', '.join(linears)}"
    head = _head(model)
    for target in adapter.target_modules:
        matched = [(n, m) for n, m in model.named_modules() if is_target(n, [target])]
        if not matched:
            raise UserError(f"train.adapter.target_modules: the model has no module {target!r}; {listing}")
        for name, module in matched:
            if module is head:
                raise UserError(f"train.adapter.target_modules: {target!r} is the vocabulary head, which the chunked "
                                f"loss reads as a weight (a LoRA layer there would never run); {listing}")
            if type(module) is not nn.Linear:
                raise UserError(f"train.adapter.target_modules: {name} is a {type(module).__name__}, which LoRA "
                                f"cannot wrap here (linear layers only); {listing}")
    names = [n for n, _ in model.named_modules()]
    for entry in adapter.trainable:
        if not any(is_trainable(n, [entry]) for n in names):
            raise UserError(f"train.adapter.trainable: no module of the model ends with {entry!r} "
                            f"(e.g. embed_tokens, norm, lm_head)")
    embed = getattr(model, "embed_tokens", None)
    tied = embed is not None and (head is None or head.weight is embed.weight)
    if tied and any(is_trainable(n, adapter.trainable) for n, m in model.named_modules() if m is embed):
        raise UserError("train.adapter.trainable: embed_tokens is tied to the vocabulary head (tie_word_embeddings); "
                        "a PEFT adapter saves the two apart, so train it only in a model with its own head")


def lora_config(adapter):
    """PEFT's LoraConfig of train.adapter (target_modules as names, modules_to_save the trainable ones)."""
    from peft import LoraConfig  # the adapters extra: only adapter runs import it

    return LoraConfig(r=int(adapter.r), lora_alpha=float(adapter.alpha), lora_dropout=float(adapter.dropout),
                      target_modules=list(adapter.target_modules), bias="none",
                      modules_to_save=list(adapter.trainable) or None)


def apply_adapter(model: nn.Module, adapter, seed: int) -> nn.Module:
    """Inject LoRA into `model` (in place), train only it and the trainable modules. The LoRA
    factors are initialised from `seed` alone (every rank the same): A as PEFT does, B zero."""
    from peft import inject_adapter_in_model

    check_adapter(adapter, model)
    config = lora_config(adapter)
    config.modules_to_save = None  # trained in place below, not copied
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    trained = {id(p) for n, m in model.named_modules() if is_trainable(n, adapter.trainable)
               for p in m.parameters()}
    for name, p in model.named_parameters():
        p.requires_grad_(is_lora_key(name) or id(p) in trained)
    return model


def is_lora_key(name: str) -> bool:
    return any(marker in name for marker in LORA_MARKERS)


def has_adapter(model: nn.Module) -> bool:
    return any(is_lora_key(n) for n, _ in model.named_parameters())


def trainable_count(model: nn.Module) -> int:
    """Trained parameters (unique tensors)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())
