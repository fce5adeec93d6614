"""What an adapter run (train.adapter) trains, counted for the planner: the LoRA factors it adds
(r x (in + out) per wrapped linear module) and the parameters that get gradients and optimizer
states (the factors and the trainable modules). Counted on the model built on the meta device."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class AdapterSpec:
    """train.adapter's fields that change memory (a Layout field: hashable)."""
    r: int
    target_modules: tuple
    trainable: tuple


@dataclass(frozen=True)
class AdapterCounts:
    added: int  # LoRA factors' parameters
    trained: int  # parameters with gradients and optimizer states (the factors included)
    head_trained: bool  # the vocabulary head among them


def adapter_spec(adapter) -> Optional[AdapterSpec]:
    if adapter is None:
        return None
    return AdapterSpec(int(adapter.r), tuple(adapter.target_modules), tuple(adapter.trainable))


_CACHE: dict[tuple, AdapterCounts] = {}  # the planner's advice estimates many layouts of one model


def adapter_counts(m, spec: AdapterSpec) -> AdapterCounts:
    """Counts of `spec` on the model of config `m` (native ModelConfig or AutoModelSpec)."""
    key = (repr(m), spec)
    if key not in _CACHE:
        _CACHE[key] = _counts(spec, m)
    return _CACHE[key]


def _counts(spec: AdapterSpec, m) -> AdapterCounts:
    from torch import nn  # torch and the model: only when an adapter run is planned

    from longctx.model.adapter import is_target, is_trainable

    model = _meta_model(m)
    head = getattr(model, "lm_head", None)
    added = sum(spec.r * (mod.in_features + mod.out_features) for name, mod in model.named_modules()
                if type(mod) is nn.Linear and mod is not head and is_target(name, spec.target_modules))
    trained_modules = [mod for name, mod in model.named_modules() if is_trainable(name, spec.trainable)]
    whole = {id(p): p.numel() for mod in trained_modules for p in mod.parameters()}
    head_trained = head is not None and any(mod is head for mod in trained_modules)
    return AdapterCounts(added=added, trained=added + sum(whole.values()), head_trained=head_trained)


def _meta_model(m):
    if hasattr(m, "hf"):  # AutoModelSpec
        from longctx.model.auto.model import build_auto_model

        return build_auto_model(m, device="meta")
    from longctx.model.llama import build_model

    return build_model(m, device="meta")
