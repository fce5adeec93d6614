"""Variable-length attention primitives: one API over torch's flash kernel, flash-attn 2 and
FlashAttention-4, plus an exact CPU stand-in that tests the plumbing without a GPU.

    ops.fwd(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal) -> (out, lse)
    ops.bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal) -> (dq, dk, dv)

    q:    (Nq, Hq, D)   tokens of every sequence, packed;   k, v: (Nk, Hkv, D), Hq % Hkv == 0
    cu_q: (n + 1,) int32 cumulative query lengths (cu_k for keys); max_q / max_k: host ints
    out:  (Nq, Hq, D) in q.dtype;  lse: (Hq, Nq) fp32 (the layout every flash kernel uses)
    causal: bottom-right aligned per sequence (query i of Lq sees keys j <= i + Lk - Lq)

`bwd` takes `out` and `lse` from outside: given the final (merged) output and log-sum-exp of a
larger attention, it returns this call's exact share of the gradients, which is what context
parallelism's blocks need. Every sequence given to these ops has at least one visible key per
query (the planner in varlen.py guarantees it), so no kernel's convention for empty rows matters.
"""
from __future__ import annotations

import abc
import functools
import inspect
from typing import Optional, Tuple

import torch

from longctx.attention.eager import EagerKernel

Tensor = torch.Tensor


class VarlenOps(abc.ABC):
    """The two primitives every implementation provides (see the module docstring)."""

    name = "base"

    @abc.abstractmethod
    def fwd(self, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int,
            scale: float, causal: bool) -> Tuple[Tensor, Tensor]: ...

    @abc.abstractmethod
    def bwd(self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_q: Tensor,
            cu_k: Tensor, max_q: int, max_k: int, scale: float, causal: bool) -> Tuple[Tensor, Tensor, Tensor]: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ReferenceVarlen(VarlenOps):
    """Exact fp32 math, one sequence at a time (EagerKernel's primitives): the CPU stand-in with
    the CUDA kernels' API, so the packing, cu_seqlens, GQA and LSE plumbing are tested anywhere."""

    name = "reference"

    def __init__(self) -> None:
        self._eager = EagerKernel()

    @staticmethod
    def _spans(cu: Tensor):
        b = cu.tolist()
        return list(zip(b[:-1], b[1:]))

    def fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
        out = torch.zeros_like(q)
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
        for (qa, qb), (ka, kb) in zip(self._spans(cu_q), self._spans(cu_k)):
            if qb == qa or kb == ka:
                continue
            qs, ks, vs = (x.transpose(0, 1)[None] for x in (q[qa:qb], k[ka:kb], v[ka:kb]))  # (1, H, L, D)
            o, seq_lse = self._eager._fwd(qs, ks, vs, scale, causal, None)
            out[qa:qb] = o[0].transpose(0, 1)
            lse[:, qa:qb] = seq_lse[0]
        return out, lse

    def bwd(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal):
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for (qa, qb), (ka, kb) in zip(self._spans(cu_q), self._spans(cu_k)):
            if qb == qa or kb == ka:
                continue
            t = lambda x: x.transpose(0, 1)[None]  # noqa: E731  (L, H, D) -> (1, H, L, D)
            gq, gk, gv = self._eager._bwd(t(dout[qa:qb]), t(q[qa:qb]), t(k[ka:kb]), t(v[ka:kb]), t(out[qa:qb]),
                                          lse[None, :, qa:qb], scale, causal, None)
            dq[qa:qb], dk[ka:kb], dv[ka:kb] = gq[0].transpose(0, 1), gk[0].transpose(0, 1), gv[0].transpose(0, 1)
        return dq, dk, dv


class TorchFlashVarlen(VarlenOps):
    """torch's own flash kernel with cu_seqlens (`aten._flash_attention_forward/backward`, what
    `torch.nn.attention.varlen.varlen_attn` calls): on every CUDA build of torch, no extra package."""

    name = "varlen"

    def fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=scale)
        return out, lse

    def bwd(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal):
        rng = torch.zeros(2, dtype=torch.uint64, device=q.device)  # no dropout: the state is unused
        unused = torch.empty(0, device=q.device)
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout.contiguous(), q, k, v, out.contiguous(), lse.contiguous(), cu_q, cu_k, max_q, max_k, 0.0, causal,
            rng, unused, scale=scale)
        return dq, dk, dv


def _call(fn, **kwargs):
    """Call a flash-attn internal with the keyword arguments its installed version accepts."""
    params = inspect.signature(fn).parameters
    if "window_size" in params and "window_size_left" not in params:  # flash-attn <= 2.6.x
        kwargs["window_size"] = (kwargs.pop("window_size_left", -1), kwargs.pop("window_size_right", -1))
    return fn(**{k: v for k, v in kwargs.items() if k in params})


class FlashAttnVarlen(VarlenOps):
    """flash-attn 2.x's `_flash_attn_varlen_forward/backward` (pip install flash-attn)."""

    name = "flash"

    def __init__(self) -> None:
        self._mod = flash_attn_module()
        if self._mod is None:
            raise RuntimeError("flash-attn does not import")

    def fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
        res = _call(self._mod._flash_attn_varlen_forward, q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                    max_seqlen_q=max_q, max_seqlen_k=max_k, dropout_p=0.0, softmax_scale=scale, causal=causal,
                    window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None,
                    return_softmax=False, block_table=None)
        return res[0], res[1]

    def bwd(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _call(self._mod._flash_attn_varlen_backward, dout=dout.contiguous(), q=q, k=k, v=v, out=out.contiguous(),
              softmax_lse=lse.contiguous(), dq=dq, dk=dk, dv=dv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
              max_seqlen_q=max_q, max_seqlen_k=max_k, dropout_p=0.0, softmax_scale=scale, causal=causal,
              window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None, deterministic=False,
              rng_state=None)
        return dq, dk, dv


FA4_TESTED = "4.0.0b40"  # the flash-attn-4 release whose API this file follows (scripts/gpu/gpu_wheels.sh pins it)


class FA4Varlen(VarlenOps):
    """FlashAttention-4 (`flash_attn.cute`, pip install flash-attn-4==FA4_TESTED): CuTe DSL kernels for
    SM90 (Hopper) and SM100 (Blackwell). Its `_flash_attn_fwd` returns (out, lse, p, row_max, o_lo) in
    4.0.0b40 (two values in earlier betas): the first two are ours either way."""

    name = "fa4"

    def __init__(self) -> None:
        self._mod = fa4_module()
        if self._mod is None:
            raise RuntimeError("flash-attn-4 (flash_attn.cute) does not import")

    def fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, scale, causal):
        res = _call(self._mod._flash_attn_fwd, q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                    max_seqlen_q=max_q, max_seqlen_k=max_k, softmax_scale=scale, causal=causal, return_lse=True)
        out, lse = res[0], res[1]
        return out, lse.float()

    def bwd(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal):
        grads = _call(self._mod._flash_attn_bwd, q=q, k=k, v=v, out=out.contiguous(), dout=dout.contiguous(),
                      lse=lse.contiguous(), softmax_scale=scale, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                      max_seqlen_q=max_q, max_seqlen_k=max_k, deterministic=False)
        dq, dk, dv = grads[:3]  # a fourth, dsink, only with a learnable sink
        return dq, dk, dv


@functools.lru_cache(maxsize=1)
def flash_attn_module():
    """flash-attn 2.x's interface module, or None (not installed, or a CUDA/ABI mismatch)."""
    try:
        from flash_attn import flash_attn_interface
    except Exception:
        return None
    return flash_attn_interface


@functools.lru_cache(maxsize=1)
def fa4_module():
    """FlashAttention-4's interface module (`flash_attn.cute.interface`), or None."""
    try:
        from flash_attn.cute import interface
    except Exception:
        return None
    return interface if hasattr(interface, "_flash_attn_fwd") and hasattr(interface, "_flash_attn_bwd") else None


def _cuda_major(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


def varlen_problem(name: str, device: Optional[torch.device | str]) -> Optional[str]:
    """Why varlen implementation `name` (varlen | flash | fa4) cannot run on `device`, or None."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return "no CUDA device"
    if name == "varlen":
        ok = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)()
        return None if ok else "this torch build has no flash attention kernel"
    if name == "flash":
        return None if flash_attn_module() is not None else "flash-attn does not import"
    if name == "fa4":
        if _cuda_major(device) not in (9, 10):
            return "FlashAttention-4 needs compute capability 9.x or 10.x"
        return None if fa4_module() is not None else "flash-attn-4 (flash_attn.cute) does not import"
    raise ValueError(f"unknown varlen implementation {name!r}")


def make_varlen_ops(name: str) -> VarlenOps:
    return {"varlen": TorchFlashVarlen, "flash": FlashAttnVarlen, "fa4": FA4Varlen,
            "reference": ReferenceVarlen}[name]()


def best_varlen(device: Optional[torch.device | str]) -> Optional[str]:
    """The varlen implementation `auto` uses on `device`: FlashAttention-4 where it runs, then
    flash-attn 2, then torch's own; None off CUDA."""
    for name in ("fa4", "flash", "varlen"):
        if varlen_problem(name, device) is None:
            return name
    return None
