"""flash-attn (2.x / 3.x) backend: CUDA only, imported lazily, never required.

Install with `pip install longctx[gpu]`. Causal masking in flash-attn >= 2.1 is bottom-right
aligned like ours, GQA is native (K/V at kv-head count), and the kernel returns the fp32
log-sum-exp that context parallelism merges.

* `flash_attention` (local attention for the model): packed documents go through
  `flash_attn_varlen_func` with cu_seqlens built from the segment ids (each contiguous run of
  one id is a document).
* `FlashKernel` (block kernel for context parallelism): unmasked tiles call flash-attn's
  forward/backward directly; the (tile x tile) tiles straddling a document boundary use the
  exact fp32 math of EagerKernel (logged once), since flash-attn has no arbitrary masks.
"""
from __future__ import annotations

import functools
import inspect
import logging
from typing import Optional

import torch

from longctx.attention.eager import EagerKernel
from longctx.attention.kernel import AttentionKernel, resolve_scale
from longctx.attention.sdpa import sdpa_attention

log = logging.getLogger(__name__)
Tensor = torch.Tensor


@functools.lru_cache(maxsize=1)
def _flash_module():
    """The flash_attn module, or None when it is not installed (or broken)."""
    try:
        import flash_attn  # noqa: F401
        from flash_attn import flash_attn_interface
    except Exception:  # ImportError, or a CUDA/ABI mismatch raising something else
        return None
    return flash_attn_interface


def flash_available(device: Optional[torch.device] = None) -> bool:
    """True when flash-attn imports and the (given or default) device is CUDA."""
    if device is not None and torch.device(device).type != "cuda":
        return False
    return torch.cuda.is_available() and _flash_module() is not None


def _require():
    mod = _flash_module()
    if mod is None:
        raise RuntimeError("attention backend 'flash' needs flash-attn on CUDA: pip install 'longctx[gpu]'")
    return mod


def _call(fn, **kwargs):
    """Call a flash-attn internal with the keyword arguments its installed version accepts."""
    params = inspect.signature(fn).parameters
    if "window_size" in params and "window_size_left" not in params:  # flash-attn <= 2.6.x
        kwargs["window_size"] = (kwargs.pop("window_size_left", -1), kwargs.pop("window_size_right", -1))
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def cu_seqlens_from_segment_ids(segment_ids: Tensor) -> Optional[tuple[Tensor, int]]:
    """(B, T) document ids -> (cu_seqlens int32 (num_sequences + 1,), longest sequence) for
    flash-attn's varlen kernels. The B rows are flattened into one B*T token stream; a sequence
    starts at every row start and wherever the id changes. None when an id re-appears after
    another document in its row (not representable as contiguous runs)."""
    B, T = segment_ids.shape
    change = torch.ones(B, T, dtype=torch.bool, device=segment_ids.device)
    change[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    starts = change.flatten().nonzero().flatten()
    run_ids = segment_ids.flatten()[starts]
    rows = starts // T
    key = rows * (int(segment_ids.max()) - int(segment_ids.min()) + 1) + (run_ids - segment_ids.min())
    if key.unique().numel() != key.numel():
        return None
    cu = torch.cat([starts, starts.new_tensor([B * T])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def flash_attention(
    q: Tensor,  # (B, Hq, T, D)
    k: Tensor,  # (B, Hkv, S, D)
    v: Tensor,
    *,
    causal: bool = True,
    scale: Optional[float] = None,
    segment_ids: Optional[Tensor] = None,
    kv_segment_ids: Optional[Tensor] = None,
) -> Tensor:
    mod = _require()
    scale = resolve_scale(scale, q.shape[-1])
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (B, T, H, D)
    if segment_ids is None:
        out = mod.flash_attn_func(qt, kt, vt, softmax_scale=scale, causal=causal)
        return out.transpose(1, 2)
    same_ids = kv_segment_ids is None or kv_segment_ids is segment_ids or torch.equal(kv_segment_ids, segment_ids)
    cu = cu_seqlens_from_segment_ids(segment_ids) if (same_ids and q.shape[2] == k.shape[2]) else None
    if cu is None:
        return sdpa_attention(q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                              kv_segment_ids=kv_segment_ids)
    cu_seqlens, max_len = cu
    B, T = segment_ids.shape
    out = mod.flash_attn_varlen_func(
        qt.reshape(B * T, *qt.shape[2:]), kt.reshape(B * T, *kt.shape[2:]), vt.reshape(B * T, *vt.shape[2:]),
        cu_seqlens, cu_seqlens, max_len, max_len, softmax_scale=scale, causal=causal)
    return out.view(B, T, *out.shape[1:]).transpose(1, 2)


class FlashKernel(AttentionKernel):
    name = "flash"

    def __init__(self) -> None:
        self._mod = _require()
        self._fallback = EagerKernel()
        self._warned = False

    def _masked(self) -> None:
        if not self._warned:
            log.warning("flash kernel: blocks with a document mask use fp32 math (flash-attn has no masks)")
            self._warned = True

    def _fwd(self, q, k, v, scale, is_causal, mask):
        if mask is not None:
            self._masked()
            return self._fallback._fwd(q, k, v, scale, is_causal, mask)
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # (B, T, H, D)
        res = _call(self._mod._flash_attn_forward, q=qt, k=kt, v=vt, dropout_p=0.0, softmax_scale=scale,
                    causal=is_causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
                    alibi_slopes=None, return_softmax=False)
        out = res[0]
        lse = next(t for t in res[1:] if isinstance(t, Tensor) and t.dtype == torch.float32 and t.dim() == 3)
        return out.transpose(1, 2), lse  # (B, H, T, D), (B, H, T)

    def _bwd(self, dout, q, k, v, out, lse, scale, is_causal, mask):
        if mask is not None:
            self._masked()
            return self._fallback._bwd(dout, q, k, v, out, lse, scale, is_causal, mask)
        qt, kt, vt, ot, dot = (x.transpose(1, 2).contiguous() for x in (q, k, v, out, dout))
        dq, dk, dv = torch.empty_like(qt), torch.empty_like(kt), torch.empty_like(vt)
        _call(self._mod._flash_attn_backward, dout=dot, q=qt, k=kt, v=vt, out=ot, softmax_lse=lse.contiguous(),
              dq=dq, dk=dk, dv=dv, dropout_p=0.0, softmax_scale=scale, causal=is_causal, window_size_left=-1,
              window_size_right=-1, softcap=0.0, alibi_slopes=None, deterministic=False, rng_state=None)
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
