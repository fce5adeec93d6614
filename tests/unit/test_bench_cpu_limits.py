"""The peer benchmarks' CPU limit (benchmarks/benchlib/cpu_limits.py) is measured at the step's
own operations, so the step's fraction of it cannot exceed 1.

The invariant is checked against what a real (tiny) model executes, not against the formula
itself: a synthetic machine (a TorchDispatchMode) charges every GEMM and attention-kernel
call a time that depends on its exact shapes (some shapes much faster than others), and is
also the clock the limit measurement reads. The limit is then the step's fraction <= 1 only
if the measured operations are the very calls the model makes.
"""
from __future__ import annotations

import math

import pytest
import torch
from benchlib.cpu_limits import (
    attention_pair_fraction,
    cpu_limit_fraction,
    head_inputs,
    limit_ops,
    measure_cpu_limits,
    step_flops,
)
from torch.utils._python_dispatch import TorchDispatchMode

from longctx.model.config import ModelConfig
from longctx.model.llama import Transformer

aten = torch.ops.aten
GEMMS = {aten.mm.default, aten.addmm.default, aten.addmm_.default, aten.bmm.default}
ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu.default,
             aten._scaled_dot_product_flash_attention_for_cpu_backward.default}


def _shapes(args) -> tuple:
    return tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))


class Machine(TorchDispatchMode):
    """A clock that advances only by the GEMM and attention calls made under it: a call's time
    is its FLOPs at a rate that depends on its exact shapes (rate(kind, shapes) FLOP/s)."""

    def __init__(self, rate):
        super().__init__()
        self.rate, self.now = rate, 0.0

    def clock(self) -> float:
        return self.now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = _shapes(args)
        if func in GEMMS:
            a, b = shapes[-2], shapes[-1]  # (.., M, K) @ (.., K, N)
            flops = 2.0 * a[-2] * a[-1] * b[-1] * (a[0] if len(a) == 3 else 1)
            self.now += flops / self.rate("gemm", shapes)
        elif func in ATTENTION:
            q = shapes[0] if func is not aten._scaled_dot_product_flash_attention_for_cpu_backward.default \
                else shapes[1]
            B, H, T, D = q
            flops = 2.0 * B * H * T * T * D  # a forward's causal pairs; the backward twice it
            flops *= 2 if "backward" in str(func) else 1
            self.now += flops / self.rate("attention", shapes)
        return out


def shape_rate(kind: str, shapes: tuple) -> float:
    """Uneven and deterministic in the shapes; attention faster on longer calls (as the kernel)."""
    if kind == "gemm":
        return 1e9 * (1 + sum((i + 3) * (n % 97) for i, s in enumerate(shapes) for n in s) % 11)
    q, k = shapes[:2] if len(shapes[0]) == 4 else shapes[1:3]  # (B, Hq, T, D), (B, Hkv, S, D)
    return 1e8 * (1 + (3 * q[1] + 5 * k[1] + q[3]) % 5) * q[2] / (q[2] + 128)


def tiny(hq=9, hkv=3, hd=64, layers=2, vocab=300) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                       num_attention_heads=hq, num_key_value_heads=hkv, head_dim=hd, max_position_embeddings=8192)


def model_step(model, cfg, B, T, chunk, segment_ids=None) -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    loss, _ = model(ids, segment_ids=segment_ids, labels=ids, loss_chunk_size=chunk)
    loss.backward()


def measured_step(cfg, B, T, chunk, dtype, rate, segment_ids=None):
    """(limits, step seconds) on the synthetic machine."""
    torch.manual_seed(0)
    model = Transformer(cfg).to(dtype)
    machine = Machine(rate)
    with machine:
        limits = measure_cpu_limits(cfg, T, 1, dtype, seconds=0.0, micro_batch_size=B, loss_chunk_size=chunk,
                                    clock=machine.clock)
        start = machine.now
        model_step(model, cfg, B, T, chunk, segment_ids)
    return limits, machine.now - start


@pytest.mark.parametrize("cfg,T,cp,B,chunk", [
    (tiny(), 8192, 1, 1, 1024), (tiny(), 8192, 2, 2, 1000), (tiny(), 6144, 3, 1, 4096),
    (tiny(4, 4, 16), 2048, 1, 3, 333), (tiny(8, 2, 32, 3, 1000), 4096, 4, 2, 1024)])
def test_limit_ops_are_the_model_flops(cfg, T, cp, B, chunk):
    """Every model FLOP the fraction counts belongs to an operation timed at its own shape."""
    ops = limit_ops(cfg, T, cp, B, chunk)
    gemm, attn = step_flops(cfg, T, cp)
    assert sum(o.count * o.flops for o in ops if o.kind != "attention") == pytest.approx(B * gemm, rel=1e-12)
    assert sum(o.count * o.flops for o in ops if o.kind == "attention") == pytest.approx(B * attn, rel=1e-12)
    attention, = [o for o in ops if o.kind == "attention"]
    hq, hkv, t, d = attention.shape
    assert (t, d) == (T, cfg.head_dim) and hq * cfg.num_key_value_heads == hkv * cfg.num_attention_heads
    assert hkv * cp >= cfg.num_key_value_heads  # the rank's share of the heads, rounded up


@pytest.mark.parametrize("cfg,B,T,chunk,dtype", [
    (tiny(), 1, 384, 100, torch.float32), (tiny(), 2, 256, 1024, torch.bfloat16),
    (tiny(4, 4, 16, 1), 3, 192, 64, torch.float32)])
def test_cpu_mfu_of_the_step_is_at_most_one(cfg, B, T, chunk, dtype):
    """The step's timed calls are exactly the measured operations: the fraction is 1 when the
    step does nothing else, and <= 1 in general."""
    limits, step_s = measured_step(cfg, B, T, chunk, dtype, shape_rate)
    frac = cpu_limit_fraction(limits, step_s)
    assert frac["cpu_mfu"] == pytest.approx(1.0, rel=1e-9)
    assert cpu_limit_fraction(limits, step_s * 1.5)["cpu_mfu"] < 1.0
    assert frac["gemm_limit_s"] > 0 and frac["attention_limit_s"] > 0


def _lowest_exp_argument(h: torch.Tensor, w: torch.Tensor) -> float:
    """The softmax's smallest exp argument (logit - row max) over the head's rows."""
    logits = h.detach() @ w.detach().T  # (N, V)
    return float((logits - logits.max(dim=1, keepdim=True).values).min())


def test_the_head_limit_runs_on_logits_at_a_models_scale():
    """The head is timed on logits a model has: every exp argument of its softmax in float32's
    normal range. Unit-variance weights (logits of std sqrt(d)) push most of them below it,
    where the CPU's vectorized exp takes a slow path, and the limit exceeds the real step."""
    torch.manual_seed(0)
    shape = (256, 576, 49152, 256)  # SmolLM2's hidden size and vocabulary
    h, w, _ = head_inputs(shape, torch.float32)
    lowest_normal = math.log(torch.finfo(torch.float32).tiny)  # ~ -87.3
    assert _lowest_exp_argument(h, w) > lowest_normal
    model_head = Transformer(ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=9, num_key_value_heads=3)).output_weight
    assert float(w.std()) == pytest.approx(float(model_head.std()), rel=0.05)  # a model's head at initialisation
    assert _lowest_exp_argument(h, torch.randn_like(w)) < lowest_normal  # control: the unit-variance head


def test_document_masking_counts_the_pairs_the_kernel_runs():
    """Packed documents: the kernel runs sum(n^2) pairs. Counted as full causal rows (the model
    FLOPs convention) the fraction exceeds 1; counted as run it does not."""
    cfg, B, T = tiny(), 2, 512
    seg = torch.tensor([[0] * 100 + [1] * 60 + [2] * 352, [0] * 256 + [1] * 256])  # (B, T)
    limits, step_s = measured_step(cfg, B, T, 1024, torch.float32, shape_rate, segment_ids=seg)
    pairs = attention_pair_fraction(seg, T, T)
    assert pairs == pytest.approx((100**2 + 60**2 + 352**2 + 2 * 256**2) / (B * T**2))
    assert cpu_limit_fraction(limits, step_s, attention_fraction=pairs)["cpu_mfu"] <= 1.0
    assert cpu_limit_fraction(limits, step_s, attention_fraction=1.0)["cpu_mfu"] > 1.0


def test_trimmed_rows_default_to_the_quadratic_share():
    assert attention_pair_fraction(None, 256, 512) == pytest.approx(0.25)
    limits = {"ops": [{"kind": "attention", "count": 2, "seconds": 1.0}, {"kind": "linear", "count": 3,
                                                                          "seconds": 1.0}]}
    frac = cpu_limit_fraction(limits, 10.0, micro_batches=2, computed=0.5)
    assert (frac["attention_limit_s"], frac["gemm_limit_s"]) == (pytest.approx(1.0), pytest.approx(3.0))
