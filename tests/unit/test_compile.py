"""parallel.compile=norms_mlp: compiled norms and MLPs give the eager model's loss and gradients
(the run without a C++ compiler is in tests/integration/test_compile_fallback.py)."""
import pytest
import torch

from helpers.attention import packed_ids
from helpers.model import tiny_model
from longctx.config import load_config, validate_config
from longctx.errors import UserError
from longctx.parallel.checkpointing import apply_activation_checkpointing, model_key
from longctx.parallel.compiled import compile_pointwise


def _loss_and_grads(model, ids, seg, labels):
    loss_sum, n = model(ids, segment_ids=seg, labels=labels, loss_chunk_size=32)
    loss = loss_sum / n
    loss.backward()
    return loss.item(), {model_key(k): p.grad.float().clone()
                         for k, p in model.named_parameters()}


# fp32: inductor may reorder the norm's reduction; bf16: it may skip an intermediate rounding
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing,tile", [("none", 0), ("full", 0), ("full", 40)])
def test_compiled_norms_and_mlp_match_eager(dtype, tol, checkpointing, tile):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (2, 48), generator=g)
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)
    seg = packed_ids(2, 48, [17, 30])
    results, keys = [], []
    for mode in ("none", "norms_mlp"):
        model = tiny_model("yarn", "gqa", seed=4).to(dtype).train()
        apply_activation_checkpointing(model, checkpointing)
        model.set_mlp_tiling(tile)  # 96 tokens per MLP call: tiles of 40, 40 and 16
        n = compile_pointwise(model, mode)
        assert n == (0 if mode == "none" else 3 * len(model.layers) + 1)
        keys.append(list(model.state_dict()))
        results.append(_loss_and_grads(model, ids, seg, labels))
    assert keys[0] == keys[1]  # checkpoints and exports see the same parameters
    (loss_e, grads_e), (loss_c, grads_c) = results
    assert abs(loss_e - loss_c) <= tol * max(1.0, abs(loss_e))
    for name, ge in grads_e.items():
        err = (grads_c[name] - ge).abs().max().item()
        assert err <= tol * max(1.0, ge.abs().max().item()), (name, err)


def test_compiled_model_trains_and_changes_with_sequence_length():
    """dynamic=True: a curriculum's stages (new sequence lengths) reuse the compiled modules."""
    model = tiny_model("default", "gqa", seed=1).train()
    compile_pointwise(model, "norms_mlp")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = last = None
    for step in range(24):
        T = (24, 40, 64)[step // 8]
        ids = torch.randint(0, 128, (2, T), generator=torch.Generator().manual_seed(step % 8))
        labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)
        loss_sum, n = model(ids, labels=labels)
        (loss_sum / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        first = first if first is not None else (loss_sum / n).item()
        last = (loss_sum / n).item()
    assert torch.isfinite(torch.tensor(last)) and last < first


@pytest.mark.parametrize("overrides, message", [
    (["parallel.compile=everything"], "parallel.compile: unknown 'everything'; valid: none, norms_mlp"),
    (["parallel.compile=norms_mlp", "parallel.zero_stage=3"],
     "parallel.compile: not supported with parallel.zero_stage=3"),
])
def test_compile_config_errors_name_the_field(overrides, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        validate_config(load_config(None, overrides), world_size=1)
