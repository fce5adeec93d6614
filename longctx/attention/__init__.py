"""Local (single-device) attention kernels behind one signature; see core.py."""
from longctx.attention.core import AttentionFn, build_mask
from longctx.attention.sdpa import sdpa_attention

__all__ = ["AttentionFn", "build_mask", "sdpa_attention"]
