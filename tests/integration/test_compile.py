"""parallel.compile=norms_mlp: compiled norms and MLPs give the eager model's loss and gradients
(the run without a C++ compiler is in tests/integration/test_compile_fallback.py)."""
import pytest
import torch
from torch._dynamo.utils import counters

from helpers.attention import packed_ids
from helpers.model import tiny_model
from longctx.base.errors import UserError
from longctx.config import load_config, validate_config
from longctx.parallel.checkpointing import apply_activation_checkpointing, model_key
from longctx.parallel.compiled import compile_pointwise


def _compiled_modules(model) -> set[str]:
    """Names of the modules compiled in place (nn.Module.compile sets _compiled_call_impl)."""
    return {model_key(name) for name, m in model.named_modules() if getattr(m, "_compiled_call_impl", None)}


def _pointwise_modules_of_the_architecture(num_layers: int) -> set[str]:
    """What norms_mlp compiles, written from the Llama block: a pre-attention RMSNorm, a
    pre-MLP RMSNorm and the SwiGLU MLP per block, and the final RMSNorm before the head."""
    per_block = ("input_layernorm", "post_attention_layernorm", "mlp")
    return {f"layers.{i}.{part}" for i in range(num_layers) for part in per_block} | {"norm"}


def _graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far; every recompile adds one."""
    return counters["stats"]["unique_graphs"]


def _train_step(model, opt, T: int, seed: int) -> float:
    ids = torch.randint(0, 128, (2, T), generator=torch.Generator().manual_seed(seed))
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)
    loss_sum, n = model(ids, labels=labels)
    (loss_sum / n).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return (loss_sum / n).item()


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
        expected = set() if mode == "none" else _pointwise_modules_of_the_architecture(model.config.num_hidden_layers)
        assert n == len(expected) and _compiled_modules(model) == expected
        keys.append(list(model.state_dict()))
        results.append(_loss_and_grads(model, ids, seg, labels))
    assert keys[0] == keys[1]  # checkpoints and exports see the same parameters
    (loss_e, grads_e), (loss_c, grads_c) = results
    assert abs(loss_e - loss_c) <= tol * max(1.0, abs(loss_e))
    for name, ge in grads_e.items():
        err = (grads_c[name] - ge).abs().max().item()
        assert err <= tol * max(1.0, ge.abs().max().item()), (name, err)


def test_new_sequence_lengths_reuse_the_compiled_graphs():
    """dynamic=True: a curriculum's stages (new sequence lengths) reuse the graphs (the norm's
    token blocks would specialize each graph on the token count: compiled, it runs one block)."""
    torch._dynamo.reset()
    model = tiny_model("default", "gqa", seed=1).train()
    compile_pointwise(model, "norms_mlp")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    _train_step(model, opt, 24, seed=0)
    after_first = _graphs_compiled()
    for T in (40, 64):
        _train_step(model, opt, T, seed=T)
    assert _graphs_compiled() == after_first


def test_compiled_model_trains_and_compiles_nothing_at_a_length_it_has_run():
    """Three stages of 8 steps (24, 40, 64 tokens): after each stage's first step, its other steps
    (the same shapes) compile no graph, and the model learns."""
    torch._dynamo.reset()  # fresh caches: earlier tests' graphs neither serve this model nor fill the recompile limit
    model = tiny_model("default", "gqa", seed=1).train()
    compile_pointwise(model, "norms_mlp")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = _graphs_compiled()
    losses, graphs = [], []
    for step in range(24):
        losses.append(_train_step(model, opt, (24, 40, 64)[step // 8], seed=step % 8))
        graphs.append(_graphs_compiled())
    assert graphs[0] > before  # the first step compiled: the counter sees this model's graphs
    for first in (0, 8, 16):
        assert graphs[first + 7] == graphs[first], first
    assert torch.isfinite(torch.tensor(losses[-1])) and losses[-1] < losses[0]


@pytest.mark.parametrize("overrides, message", [
    (["parallel.compile=everything"], "parallel.compile: unknown 'everything'; valid: none, norms_mlp"),
    (["parallel.compile=norms_mlp", "parallel.zero_stage=3"],
     "parallel.compile: not supported with parallel.zero_stage=3"),
])
def test_compile_config_errors_name_the_field(overrides, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        validate_config(load_config(None, overrides), world_size=1)
