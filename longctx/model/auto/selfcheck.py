"""The exactness self-check a model type not yet tested on the transformers path runs before it
trains (`model.allow_untested=true`): two packed documents through longctx's attention against
transformers' own eager attention on each document alone, with the model's real weights."""
from __future__ import annotations

import torch

from longctx.base.errors import UserError
from longctx.model.auto.attention import ATTENTION_NAME

LENGTHS = (12, 20)  # two documents in one row
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 2e-2}  # on log-probabilities


@torch.no_grad()
def self_check(model) -> str:
    """UserError unless the packed row's log-probabilities equal transformers' per document; the
    line that says what was checked otherwise."""
    device = model.output_weight.device
    dtype = model.output_weight.dtype
    vocab = model.output_weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, sum(LENGTHS)), generator=gen).to(device)  # (1, T)
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(LENGTHS)])[None].to(device)
    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None].to(device)
    ours = model(ids, position_ids=pos, segment_ids=seg).float().log_softmax(-1)  # (1, T, V)
    hf = model.hf
    hf.set_attn_implementation("eager")
    try:
        parts, start = [], 0
        for n in LENGTHS:
            parts.append(hf(input_ids=ids[:, start:start + n], use_cache=False).logits.float().log_softmax(-1))
            start += n
    finally:
        hf.set_attn_implementation(ATTENTION_NAME)
    err = (ours - torch.cat(parts, dim=1)).abs().max().item()
    tol = TOLERANCE.get(dtype, 1e-3)
    what = (f"self-check of untested model type {model.config.model_type!r}: two packed documents "
            f"against transformers' eager attention, max |d log p| {err:.2e} (tolerance {tol:g}, {dtype})")
    if not err <= tol:
        raise UserError(f"model.allow_untested: {what}: not exact; this model type cannot run on longctx's "
                        "transformers path")
    return what
