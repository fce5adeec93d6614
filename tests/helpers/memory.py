"""Memory a computation leaves held, measured on CPU: the bytes of every tensor storage its
operations created that is still alive when it returns (activations autograd keeps for the
backward, the outputs), or the most alive at once, counted by a dispatch mode that sees each
operation's outputs."""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class HeldStorages(TorchDispatchMode):
    """Records the storage of every tensor an operation creates (not views or in-place results of
    its inputs); `held_bytes()` sums those still alive (each once), `peak_bytes` the most alive
    at once after any operation."""

    def __init__(self):
        super().__init__()
        self.made: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and t.layout == torch.strided}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                storage = t.untyped_storage()
                if storage.data_ptr() not in inputs and storage.nbytes():
                    self.made[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        self.peak_bytes = max(self.peak_bytes, self.held_bytes())
        return out

    def held_bytes(self) -> int:
        return sum(n for ref, n in self.made.values() if not ref.expired())


def held_bytes(fn, *args, **kwargs) -> int:
    """Bytes `fn(*args, **kwargs)` leaves held while its result is kept."""
    with HeldStorages() as mode:
        result = fn(*args, **kwargs)
    held = mode.held_bytes()
    del result
    return held
