"""The torch floor in pyproject.toml is at least the newest release that anything longctx needs
from torch first appeared in, and each of those things is in the torch installed here.

The floor is 2.6: the checkpoint safe path (longctx/checkpoint/safe_load.py) reads every torch
file with `torch.load(weights_only=True)` inside `torch.serialization.safe_globals` (new in 2.5;
on 2.4 every checkpoint would be refused), and before 2.6 that unpickler could still be made to
run code (CVE-2025-32434), which is the one thing the safe path promises it never does.
transformers and accelerate ask for 2.6 too.
"""
import importlib
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

# what longctx uses unconditionally -> the first torch release that has it (or that makes it safe)
NEEDS = {
    "torch.load weights_only unpickler without CVE-2025-32434 (checkpoint/safe_load.py)": ((2, 6), None),
    "torch.serialization.safe_globals (checkpoint/safe_load.py)": ((2, 5), "torch.serialization.safe_globals"),
    "torch.nn.attention.flex_attention (attention/flex.py)":
        ((2, 5), "torch.nn.attention.flex_attention.flex_attention"),
    "torch.library.custom_op (parallel/cp.py)": ((2, 4), "torch.library.custom_op"),
    "torch.uint64 (attention/varlen_ops.py)": ((2, 3), "torch.uint64"),
    "torch.compiler.is_compiling": ((2, 3), "torch.compiler.is_compiling"),
    "torch.load(mmap=True) (checkpoint/safe_load.py: the pickle-only check)": ((2, 1), None),
}


def _floor() -> tuple[int, int]:
    found = re.search(r'^\s*"torch\s*>=\s*(\d+)\.(\d+)', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert found, "pyproject.toml: the torch dependency has no >= floor"
    return int(found.group(1)), int(found.group(2))


def _resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def test_the_floor_covers_every_release_longctx_needs():
    floor = _floor()
    newer = {what: v for what, (v, _) in NEEDS.items() if v > floor}
    assert not newer, f"pyproject's torch>={floor[0]}.{floor[1]} is below what these need: {newer}"
    assert floor == max(v for v, _ in NEEDS.values()), "the floor is higher than anything listed needs: say why here"


def test_what_the_floor_is_for_is_in_the_installed_torch():
    installed = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    assert installed >= _floor()
    for what, (_, path) in NEEDS.items():
        if path is not None:
            assert _resolve(path) is not None, what
