"""Rotary position embeddings: the whole family, computed in fp32.

Field names and semantics follow transformers' `rope_parameters` (and the legacy
`rope_scaling` dict of old config.json files is accepted), so an HF config maps 1:1:

    default   rope_theta (any theta: ABF is just a larger theta)
    linear    factor                        positions divided by factor
    dynamic   factor                        NTK base grows with the longest position seen
    yarn      factor, original_max_position_embeddings, beta_fast=32, beta_slow=1,
              attention_factor | mscale/mscale_all_dim, truncate=True
    llama3    factor, low_freq_factor, high_freq_factor, original_max_position_embeddings
    longrope  short_factor, long_factor (head_dim/2 each), original_max_position_embeddings,
              factor, attention_factor

The fields' checks and defaults (torch-free, for config validation) are rope_parameters.py's.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn

from longctx.model.rope_parameters import longrope_attention_factor


def _base_inv_freq(base: Any, dim: int) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # (dim/2,)
    return 1.0 / (base ** exponents)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def compute_inv_freq(p: dict, head_dim: int, max_position_embeddings: int,
                     seq_len: Optional[int] = None) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim/2,) fp32 on CPU, attention scaling applied to cos/sin)."""
    with torch.device("cpu"):  # also when the model is being built under a meta-device context
        return _compute_inv_freq(p, head_dim, max_position_embeddings, seq_len)


def _compute_inv_freq(p: dict, head_dim: int, max_position_embeddings: int,
                      seq_len: Optional[int]) -> tuple[torch.Tensor, float]:
    rope_type, base, dim = p["rope_type"], p["rope_theta"], head_dim
    if rope_type == "default":
        return _base_inv_freq(base, dim), 1.0
    if rope_type == "linear":
        return _base_inv_freq(base, dim) / p["factor"], 1.0
    if rope_type == "dynamic":
        factor = p["factor"]
        length = max(seq_len or max_position_embeddings, max_position_embeddings)
        grown = base * ((factor * length / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
        return _base_inv_freq(grown, dim), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(p, dim)
    if rope_type == "llama3":
        return _llama3_inv_freq(p, dim), 1.0
    if rope_type == "longrope":
        return _longrope_inv_freq(p, dim, max_position_embeddings, seq_len)
    raise AssertionError(rope_type)


def _yarn_inv_freq(p: dict, dim: int) -> tuple[torch.Tensor, float]:
    base, factor = p["rope_theta"], p["factor"]
    original = p["original_max_position_embeddings"]
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def dim_of_rotations(rotations: float) -> float:
        # The dimension whose wavelength completes `rotations` turns over the original context.
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of_rotations(beta_fast), dim_of_rotations(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # (dim/2,)
    keep = 1 - ramp  # 1 = extrapolate (high frequency, unchanged), 0 = interpolate
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
    return inv_freq, float(attention_factor)


def _llama3_inv_freq(p: dict, dim: int) -> torch.Tensor:
    inv_freq = _base_inv_freq(p["rope_theta"], dim)
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    original = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen, high_freq_wavelen = original / low, original / high
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _longrope_inv_freq(p: dict, dim: int, max_position_embeddings: int,
                       seq_len: Optional[int]) -> tuple[torch.Tensor, float]:
    attention_factor = longrope_attention_factor(p, max_position_embeddings)
    use_long = seq_len is not None and seq_len > p["original_max_position_embeddings"]
    ext = torch.tensor(p["long_factor"] if use_long else p["short_factor"], dtype=torch.float32)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext * p["rope_theta"] ** exponents), attention_factor


class RotaryEmbedding(nn.Module):
    """position_ids (B, T) -> cos, sin (B, T, head_dim) in fp32.

    `dynamic` and `longrope` depend on the longest position in the call, as in transformers:
    dynamic keeps the largest base it has grown to (so a KV cache stays consistent while
    decoding) and falls back to the original frequencies for short inputs.
    """

    def __init__(self, rope_parameters: dict, head_dim: int, max_position_embeddings: int):
        super().__init__()
        self.params = rope_parameters
        self.head_dim = head_dim
        self.max_position_embeddings = max_position_embeddings
        # Plain tensors, not buffers: always computed on CPU in fp32 (tiny), so building the
        # model on the meta device and casting it to bf16 never touch them.
        self.original_inv_freq, self.attention_scaling = compute_inv_freq(
            rope_parameters, head_dim, max_position_embeddings)
        self.inv_freq = self.original_inv_freq
        self.max_seq_len_cached = max_position_embeddings
        self._device_cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _update_for_length(self, seq_len: int) -> None:
        rope_type = self.params["rope_type"]
        if rope_type == "dynamic":
            if seq_len > self.max_seq_len_cached:
                self.inv_freq, self.attention_scaling = compute_inv_freq(
                    self.params, self.head_dim, self.max_position_embeddings, seq_len)
                self.max_seq_len_cached = seq_len
            if seq_len < self.max_position_embeddings < self.max_seq_len_cached:
                self.inv_freq = self.original_inv_freq
                self.max_seq_len_cached = self.max_position_embeddings
        elif rope_type == "longrope":
            self.inv_freq, self.attention_scaling = compute_inv_freq(
                self.params, self.head_dim, self.max_position_embeddings, seq_len)

    def _inv_freq_on(self, device: torch.device) -> torch.Tensor:
        cached = self._device_cache.get(device)
        if cached is None or cached[0] is not self.inv_freq:
            cached = (self.inv_freq, self.inv_freq.to(device))
            self._device_cache[device] = cached
        return cached[1]

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.params["rope_type"] in ("dynamic", "longrope"):
            self._update_for_length(int(position_ids.max()) + 1)
        inv_freq = self._inv_freq_on(position_ids.device)  # (D/2,)
        freqs = position_ids[..., None].float() * inv_freq  # (B, T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, D)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


class _Rotate(torch.autograd.Function):
    """x * cos + rotate_half(x) * sin, computed per half in fp32 and written straight into an
    output of x's dtype. Bit-identical to `rotate_reference` (same products and sums), and
    cheaper (benchmarks/bench_kernels.py measures it): no concatenated rotate_half copy, no fp32
    output tensor, and autograd keeps only cos/sin (not fp32 copies of x)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        xf = x.float()
        x1, x2 = xf[..., :h], xf[..., h:]  # (B, H, T, D/2) each
        c, s = cos[:, None], sin[:, None]  # (B, 1, T, D)
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        torch.sub(x1 * c[..., :h], x2 * s[..., :h], out=y[..., :h])  # x1 cos - x2 sin
        torch.add(x2 * c[..., h:], x1 * s[..., h:], out=y[..., h:])  # x2 cos + x1 sin
        ctx.save_for_backward(cos, sin)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        h = grad.shape[-1] // 2
        gf = grad.float()
        g1, g2 = gf[..., :h], gf[..., h:]
        c, s = cos[:, None], sin[:, None]
        gx = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
        # the transposed rotation: rotate_half's adjoint maps (u1, u2) -> (u2, -u1)
        torch.add(g1 * c[..., :h], g2 * s[..., h:], out=gx[..., :h])
        torch.sub(g2 * c[..., h:], g1 * s[..., :h], out=gx[..., h:])
        return gx, None, None


def rotate_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The textbook x * cos + rotate_half(x) * sin in fp32, differentiated by autograd."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D) rotated by cos/sin (B, T, D); math in fp32, result in x's dtype."""
    if cos.requires_grad or sin.requires_grad:  # differentiable frequencies: plain autograd math
        return rotate_reference(x, cos, sin)
    return _Rotate.apply(x, cos, sin)
