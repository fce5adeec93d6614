"""Reading a checkpoint's torch files without running code from them.

A torch file is a pickle, and unpickling can call any function the file names (`os.system`
included). A checkpoint may come from someone else -- a teammate's run directory, an intermediate
checkpoint published to continue from -- and its MANIFEST.json guards against corruption, not
against a file written to attack. So every torch file longctx reads from a checkpoint goes through
torch's `weights_only` unpickler, which builds tensors, numbers, strings and containers and, here,
exactly the other types longctx and DeepSpeed write (ALLOWED); DeepSpeed's own loaders, which
unpickle freely, open a file only after `check_files` has read it this way.

The check reads a file's pickle only: its tensors become meta tensors over the file mapped into
memory, so no tensor byte is read (a resume reads each optimizer partition once, in DeepSpeed's
load). Code could only hide in the pickle; tensor bytes are data the unpickler never runs.

    state = load_checkpoint_file(path)      # the object, or one UserError naming the file
    check_files(paths)                       # the same check for files another library opens next
"""
from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any, Iterable

import torch

from longctx.base.errors import UserError


def _numpy_types() -> list:
    import numpy as np

    # RNG states (np.random.get_state()) and a loader's arrays: ndarrays of standard dtypes
    core = getattr(np, "_core", None) or np.core
    dtypes = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
              np.float16, np.float32, np.float64)
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, *(type(np.dtype(t)) for t in dtypes)]


def _deepspeed_types() -> list:
    """What DeepSpeed's ZeRO optimizer states hold besides tensors (its loss scaler, stage enum
    and the fragment addresses of flat partitions); none without DeepSpeed."""
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:
        return []
    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def allowed_types() -> list:
    """The types beyond torch's own defaults that a longctx or DeepSpeed checkpoint holds."""
    return _numpy_types() + _deepspeed_types()


_GLOBAL = re.compile(r"(?:GLOBAL|global)\s+([\w.]+)|got <class '([\w.]+)'>")


def _cause(text: str) -> str:
    """The unpickler's own reason inside torch's explanation (e.g. "Unsupported operand 105")."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    inner = [line for line in lines if not line.startswith(("Weights only load failed", "Please file an issue",
                                                             "Check the documentation"))]
    return (inner or lines or [""])[0]


def _refusal(path: Path, error: BaseException) -> UserError:
    text = str(error).strip()
    found = _GLOBAL.search(text)
    if found:
        what = f"it names {found.group(1) or found.group(2)}, which no longctx or DeepSpeed checkpoint holds"
    else:
        what = f"it is not a torch file longctx can read ({_cause(text) or type(error).__name__})"
    return UserError(f"{path}: refused: {what}; a checkpoint file is read only as tensors and plain data, never "
                     "run (docs/checkpoints.md, 'What a checkpoint is trusted with')")


def load_checkpoint_file(path: str | Path, map_location: Any = "cpu") -> Any:
    """The object in torch file `path`, read by torch's weights_only unpickler with ALLOWED added;
    anything else (a global not on the list, a file that is not a torch file) is one UserError
    naming the file, and nothing from it runs."""
    return _safe_load(Path(path), map_location=map_location, mmap=False)


def check_file(path: str | Path) -> None:
    """Read the pickle of torch file `path` as load_checkpoint_file does, without its tensor data:
    the storages are mapped (mmap) and placed on the meta device, so none of their bytes is read
    (older torch releases read a meta storage's bytes unless the file is mapped). A file in torch's
    old, unzipped format cannot be mapped and is read whole."""
    path = Path(path)
    try:
        zipped = zipfile.is_zipfile(path)
    except OSError as e:
        raise UserError(f"{path}: unreadable ({e.strerror or e})") from None
    _safe_load(path, map_location="meta", mmap=zipped)


def _safe_load(path: Path, *, map_location: Any, mmap: bool) -> Any:
    try:
        with torch.serialization.safe_globals(allowed_types()):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except OSError as e:
        raise UserError(f"{path}: unreadable ({e.strerror or e})") from None
    except Exception as e:  # noqa: BLE001 -- UnpicklingError, RuntimeError, BadZipFile, ... all mean: refuse
        raise _refusal(path, e) from None


def check_files(paths: Iterable[str | Path]) -> None:
    """check_file on each file before a library that unpickles freely opens it; the first refusal
    is a UserError naming the file."""
    for path in paths:
        check_file(path)
