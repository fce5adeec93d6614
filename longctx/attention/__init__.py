"""Local (single-device) attention kernels behind one signature; see core.py.

    sdpa_attention / eager_attention / flash_attention(q, k, v, *, causal, scale, segment_ids, kv_segment_ids)
    attention_with_lse(q, k, v, ..., backend="auto") -> (out, lse)   differentiable in q, k, v
    get_kernel(name) -> AttentionKernel   explicit forward (with LSE) / backward, for context parallelism
    get_attention(name) -> AttentionFn    name in auto | sdpa | flash | fa4 | varlen | flex | eager
"""
from longctx.base.lazy_exports import exported_names, lazy_exports

_EXPORTS = {
    "backends": ["BACKENDS", "check_backend_available"],
    "core": ["AttentionFn", "build_mask"],
    "eager": ["EagerKernel", "eager_attention"],
    "flash": ["flash_attention", "flash_available"],
    "function": ["KernelAttention", "kernel_attention"],
    "kernel": ["AttentionKernel", "plan_tiles", "resolve_scale"],
    "lse": ["merge_attention"],
    "sdpa": ["sdpa_attention"],
    "varlen": ["VarlenKernel", "make_varlen_attention"],
    "varlen_ops": ["ReferenceVarlen", "VarlenOps"],
    "select": ["attention_with_lse", "get_attention", "get_kernel", "resolve_backend"],
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = exported_names(_EXPORTS)
