"""Checkpointed layer inputs offloaded to host memory or a per-rank file (`parallel.offload_activations`).

Under activation checkpointing the forward keeps, per checkpointed block, only the block's
input hidden state (B, T, d) (and the attention kernel's outputs, which stay on the device).
At long context these inputs are what is left of the activations: 32 layers x T x 4096 x 2
bytes for Llama-3-8B, 16 GiB at 64k tokens. With offload they leave the device after the
block's forward and come back when the block's backward recomputes it:

    forward   block i: torch's checkpoint saves its inputs through a saved-tensor hook; the
              hidden state goes to the store (a copy on a side stream into a pinned host buffer
              on CUDA; to the rank's file by a writer thread for `disk`), everything else
              (positions, RoPE tables) is kept as usual
    backward  block i's recompute unpacks its input: the store returns it (waiting for a
              prefetch already in flight) and starts bringing back block i-1's input, so the
              copy of the next block overlaps this block's backward

The bytes come back exactly as they left, so losses and gradients equal those without
offload. `host` on a CPU device copies into a host buffer (the data is in host memory already:
no saving, the code path is the same). `disk` writes to `<dir>/activations-rank{R}-...bin`; the
file is unlinked as soon as it is open, so the space is released when the process ends however
it ends, and a file a killed process left between create and unlink is removed by the next run
on this host (its owner no longer runs).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch.utils.checkpoint import checkpoint, noop_context_fn

from longctx.parallel.offload_stores import DiskStore, Handle, HostStore, Store

Tensor = torch.Tensor
MODES = ("none", "host", "disk")


def _identity(t: Tensor) -> tuple:
    """What tells a saved tensor is the block input, without holding it (autograd keeps the hooks
    as long as the saved tensor: a closure over the input itself would keep it on the device)."""
    return t.device, t.dtype, tuple(t.shape), t.stride(), t.data_ptr()


class ActivationOffload:
    """The checkpoint function of offloaded blocks (`checkpoint_fn` of torch's checkpoint_wrapper):
    torch's non-reentrant checkpoint with the block's hidden-state input (its first positional
    argument, or `hidden_states=`) packed into `store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def checkpoint_fn(self, module, *args, context_fn=noop_context_fn, **kwargs):
        hidden = args[0] if args else kwargs.get("hidden_states")
        if not (torch.is_grad_enabled() and isinstance(hidden, Tensor)):
            return checkpoint(module, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
        if not args:  # the checkpoint saves positional tensors only: pass the hidden state as one
            kwargs = dict(kwargs)
            del kwargs["hidden_states"]

            def call(h, *rest, **kw):
                return module(*rest, hidden_states=h, **kw)

            return self._run(call, hidden, (), kwargs, context_fn)
        return self._run(module, hidden, args[1:], kwargs, context_fn)

    def _run(self, fn, hidden: Tensor, rest: tuple, kwargs: dict, context_fn):
        store, key = self.store, _identity(hidden)

        def pack(t: Tensor):
            return store.put(t) if _identity(t) == key else t

        def unpack(saved):
            return store.get(saved) if isinstance(saved, Handle) else saved

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return checkpoint(fn, hidden, *rest, use_reentrant=False, context_fn=context_fn, **kwargs)

    def close(self) -> None:
        self.store.close()


def offload_for(mode: str, device: torch.device, directory: Optional[Path], rank: int) -> Optional[ActivationOffload]:
    """The offload of `parallel.offload_activations` (None for none); `directory`: disk's folder."""
    if mode == "none":
        return None
    if mode == "host":
        return ActivationOffload(HostStore(device))
    if mode == "disk":
        if directory is None:
            raise ValueError("disk activation offload needs a directory")
        return ActivationOffload(DiskStore(device, Path(directory), rank))
    raise ValueError(f"unknown activation offload mode {mode!r}; valid: {', '.join(MODES)}")
