"""The names `longctx eval --dtype` takes, torch-free: EvalConfig checks them before torch loads."""
from __future__ import annotations

from typing import Optional

from longctx.base.errors import UserError

TORCH_NAMES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
               "fp16": "float16", "float16": "float16"}


def check_dtype_name(name: Optional[str]) -> None:
    if name is not None and name != "auto" and name not in TORCH_NAMES:
        raise UserError(f"eval.dtype: {name!r} is not a dtype; valid: auto, {', '.join(TORCH_NAMES)}")
