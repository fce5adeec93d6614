"""Memory a computation leaves held, measured on CPU: the bytes of every tensor storage its
operations created that is still alive when it returns (activations autograd keeps for the
backward, the outputs), counted by a dispatch mode that sees each operation's outputs."""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class HeldStorages(TorchDispatchMode):
    """Records the storage of every tensor an operation returns; `held_bytes()` sums those
    still alive (each storage once: views share theirs)."""

    def __init__(self):
        super().__init__()
        self.made: list[tuple[StorageWeakRef, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                storage = t.untyped_storage()
                self.made.append((StorageWeakRef(storage), storage.data_ptr(), storage.nbytes()))
        return out

    def held_bytes(self) -> int:
        return sum({ptr: n for ref, ptr, n in self.made if not ref.expired()}.values())


def held_bytes(fn, *args, **kwargs) -> int:
    """Bytes `fn(*args, **kwargs)` leaves held while its result is kept."""
    with HeldStorages() as mode:
        result = fn(*args, **kwargs)
    held = mode.held_bytes()
    del result
    return held
