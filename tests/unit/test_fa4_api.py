"""FlashAttention-4's calling convention as of the pinned release, on CPU: a stand-in module with
its signatures (`_flash_attn_fwd` returns out, lse, p, row_max, o_lo) over the exact reference,
so FA4Varlen's unpacking and keyword plumbing are checked without a GPU."""
import re
from pathlib import Path

import torch

from longctx.attention import varlen_ops
from longctx.attention.varlen_ops import FA4_TESTED, FA4Varlen, ReferenceVarlen

ROOT = Path(__file__).resolve().parents[2]


class FA4b40:
    """flash_attn.cute.interface of flash-attn-4 4.0.0b40, reduced to the arguments FA4Varlen passes."""

    def __init__(self):
        self.ref = ReferenceVarlen()

    def _flash_attn_fwd(self, q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                        max_seqlen_k=None, softmax_scale=None, causal=False, return_lse=False, out=None, lse=None):
        o, lse_ = self.ref.fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal)
        return o, lse_, None, None, None  # (out, lse, p, row_max, o_lo)

    def _flash_attn_bwd(self, q, k, v, out, dout, lse, softmax_scale=None, causal=False, cu_seqlens_q=None,
                        cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, deterministic=False):
        return self.ref.bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            softmax_scale, causal)


def test_fa4_five_value_forward_and_backward_unpack(monkeypatch):
    monkeypatch.setattr(varlen_ops, "fa4_module", lambda: FA4b40())
    torch.manual_seed(0)
    q, k, v = torch.randn(12, 4, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)  # (N, H, D), GQA 2
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    ops, ref = FA4Varlen(), ReferenceVarlen()
    out, lse = ops.fwd(q, k, v, cu, cu, 7, 7, 0.35, True)
    want_out, want_lse = ref.fwd(q, k, v, cu, cu, 7, 7, 0.35, True)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse) and lse.dtype == torch.float32
    dout = torch.randn_like(out)
    for got, want in zip(ops.bwd(dout, q, k, v, out, lse, cu, cu, 7, 7, 0.35, True),
                         ref.bwd(dout, q, k, v, out, lse, cu, cu, 7, 7, 0.35, True)):
        assert torch.equal(got, want)


def test_the_wheels_script_pins_the_tested_release():
    text = (ROOT / "scripts/gpu/gpu_wheels.sh").read_text()
    assert re.search(rf"\bflash-attn-4=={re.escape(FA4_TESTED)}\b", text)
