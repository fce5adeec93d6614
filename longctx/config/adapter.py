"""train.adapter: train low-rank adapters (LoRA, through PEFT) and a few named modules, every
other weight frozen (longctx/model/adapter.py applies it; the checks that need the model's
modules are there too)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List

from longctx.base.errors import UserError

ADAPTER_TYPES = ("lora",)


@dataclass
class AdapterSection:
    type: str = "lora"
    r: int = 16  # the rank of each low-rank update
    alpha: float = 32.0  # the update is scaled by alpha / r (PEFT's lora_alpha)
    dropout: float = 0.0  # on each adapter's input (PEFT's lora_dropout); > 0 is random per rank
    # the linear modules wrapped, by name suffix as PEFT matches them (`q_proj` wraps every layer's)
    target_modules: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    # modules trained whole, by name suffix (PEFT's modules_to_save): [embed_tokens, norm] is
    # LongLoRA's choice, `norm` matching every RMSNorm (input_layernorm, ..., the final norm)
    trainable: List[str] = field(default_factory=list)

    def validate(self) -> None:
        if self.type not in ADAPTER_TYPES:
            raise UserError(f"train.adapter.type: unknown {self.type!r}; valid: {', '.join(ADAPTER_TYPES)}")
        if self.r < 1:
            raise UserError(f"train.adapter.r: the rank must be an integer >= 1, got {self.r}")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise UserError(f"train.adapter.alpha: must be a finite number > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise UserError(f"train.adapter.dropout: must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise UserError("train.adapter.target_modules: name at least one linear module (e.g. [q_proj, v_proj])")
        for name in ("target_modules", "trainable"):
            if any(not str(n) or "." in str(n) for n in getattr(self, name)):
                raise UserError(f"train.adapter.{name}: module names without dots (a suffix such as q_proj), "
                                f"got {list(getattr(self, name))}")
