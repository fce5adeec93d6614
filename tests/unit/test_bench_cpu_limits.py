"""cpu_mfu is a fraction of a limit measured at the step's own operations, so it cannot exceed 1.

The invariant is checked against what a real (tiny) model executes, not against the formula
itself: a synthetic machine (a TorchDispatchMode) charges every GEMM and attention-kernel
call a time that depends on its exact shapes (some shapes much faster than others), and is
also the clock the limit measurement reads. The limit is then the step's fraction <= 1 only
if the measured operations are the very calls the model makes. The old limit (one GEMM rate
at the MLP's shape, the attention at another head count) exceeds 1 on the same machine.
"""
from __future__ import annotations

import json
import math
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.cpu_limits import FakeMachine, step
from longctx.model.config import ModelConfig
from longctx.model.llama import Transformer
from longctx.train import stage_limits
from longctx.train.metrics import (
    _attention_run,
    _best_time,
    _linear_run,
    attention_pair_fraction,
    cpu_limit_fraction,
    head_inputs,
    limit_ops,
    measure_cpu_limits,
    step_flops,
    strict_json_record,
)

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


def old_fraction(cfg, T, step_s, machine, dtype, threads=2) -> float:
    """The former limit: every GEMM at the MLP up projection's rate, the attention at
    min(H, threads) heads with as many kv heads, over the step time."""
    gemm, attn = step_flops(cfg, T)
    mlp = _best_time(_linear_run((1, T, cfg.hidden_size, cfg.intermediate_size), dtype), 0.0, 1, machine.clock)
    gemm_rate = 6.0 * T * cfg.hidden_size * cfg.intermediate_size / mlp
    h = min(cfg.num_attention_heads, threads)
    att = _best_time(_attention_run((h, h, T, cfg.head_dim), dtype), 0.0, 1, machine.clock)
    attn_rate = 6.0 * h * cfg.head_dim * T**2 / att
    return (gemm / gemm_rate + attn / attn_rate) / step_s


def test_control_the_old_limit_exceeds_one():
    """On a machine where the vocabulary head's GEMMs and the GQA kernel are faster than the
    MLP's GEMM and the MHA kernel, a limit measured at those other shapes reads above 1."""
    cfg, T = tiny(vocab=2048), 256

    def rate(kind, shapes):
        if kind == "gemm":
            return 1e10 if any(cfg.vocab_size in s for s in shapes) else 1e9
        return 1e9 if shapes[0][1] != shapes[1][1] else 1e8  # GQA (q heads != kv heads) faster
    limits, step_s = measured_step(cfg, 1, T, 1024, torch.float32, rate)
    machine = Machine(rate)
    with machine, torch.enable_grad():
        old = old_fraction(cfg, T, step_s, machine, torch.float32)
    assert cpu_limit_fraction(limits, step_s)["cpu_mfu"] == pytest.approx(1.0, rel=1e-9)
    assert old > 1.0


# ------------------------------------------------------------ re-measuring a stage's limits
@pytest.fixture
def machine(monkeypatch):
    """A fake machine whose measurements the test sets (FakeMachine) in place of measure_cpu_limits."""
    def make(op_seconds, cost=0.0):
        fake = FakeMachine(op_seconds, cost)
        monkeypatch.setattr(stage_limits, "measure_cpu_limits", fake.measure)
        return fake
    return make


def test_a_step_that_beats_a_loaded_measurement_remeasures_once(machine):
    """Measured loaded (1 s per op: a 2 s limit), quiet later (0.2 s): a 1.5 s step beats the
    first limit, so the limits are measured again, with the stage's own arguments, once."""
    fake = machine([1.0, 0.2], cost=0.01)
    limits = fake.limits()
    record = limits.fraction_for(step(1.5))
    assert len(fake.calls) == 2 and fake.calls[0] == fake.calls[1]
    assert fake.calls[0]["seconds"] == stage_limits.LIMIT_SECONDS
    assert record["cpu_mfu"] == pytest.approx(0.4 / 1.5) and not record["cpu_limits_stale"]
    assert record["cpu_limit_measurements"] == 2 and record["gemm_limit_s"] == pytest.approx(0.2)
    assert limits.fraction_for(step(1.5))["cpu_limit_measurements"] == 2  # below 1 now: no more


def test_a_step_below_its_limit_measures_nothing_more(machine):
    fake = machine([1.0, 0.2])
    record = fake.limits().fraction_for(step(2.5))
    assert len(fake.calls) == 1 and record["cpu_mfu"] == pytest.approx(0.8) and not record["cpu_limits_stale"]


def test_limits_still_beaten_after_a_remeasure_log_null(machine):
    """Every measurement loaded: cpu_mfu is null (strict JSON) and flagged, never above 1; the
    limit times stay."""
    fake = machine([1.0], cost=0.01)
    record = fake.limits().fraction_for(step(1.5))
    assert len(fake.calls) == 2
    assert record["cpu_mfu"] is None and record["cpu_limits_stale"] is True
    assert record["gemm_limit_s"] == pytest.approx(1.0) and record["attention_limit_s"] == pytest.approx(1.0)
    line = json.loads(json.dumps(strict_json_record(record), allow_nan=False))
    assert line["cpu_mfu"] is None and line["cpu_limit_measurements"] == 2


def test_millisecond_steps_never_spend_seconds_remeasuring(machine):
    """A measurement of 2 s against 10 ms steps: 1000 steps (10 s) allow none (5% of 10 s < 2 s)."""
    fake = machine([1.0], cost=2.0)
    limits = fake.limits()
    records = [limits.fraction_for(step(0.01)) for _ in range(1000)]
    assert len(fake.calls) == 1
    assert all(r["cpu_mfu"] is None and r["cpu_limits_stale"] for r in records)


def test_remeasures_stay_within_their_share_of_the_step_time(machine):
    """1 s measurements, 4.1 s steps that always beat the 10 s limit: the n-th re-measure once
    the stage's step time reaches 20 n s (5%), at steps 5, 10, 15 and 20."""
    fake = machine([5.0], cost=1.0)
    limits = fake.limits()
    counts = [limits.fraction_for(step(4.1))["cpu_limit_measurements"] for _ in range(20)]
    assert counts == [1] * 4 + [2] * 5 + [3] * 5 + [4] * 5 + [5]
    assert len(fake.calls) == 5


def test_logged_cpu_mfu_is_never_above_one(machine):
    """Random measurements, costs and step times: each step's cpu_mfu is a number <= 1 or null
    and flagged stale, and the re-measures never take more than their share of the step time."""
    rng = random.Random(0)
    seen = {"null": 0, "remeasured": 0, "number": 0}
    for _ in range(200):
        fake = machine([rng.uniform(0.01, 2.0) for _ in range(rng.randint(1, 6))], cost=rng.uniform(0.0, 0.5))
        limits = fake.limits()
        step_s = 0.0
        for _ in range(rng.randint(1, 40)):
            elapsed = rng.uniform(0.005, 6.0)
            step_s += elapsed
            record = limits.fraction_for(step(elapsed))
            assert (record["cpu_mfu"] is None) == record["cpu_limits_stale"]
            assert record["cpu_mfu"] is None or 0.0 < record["cpu_mfu"] <= 1.0
            assert record["cpu_limit_measurements"] == len(fake.calls)
            assert (len(fake.calls) - 1) * fake.cost <= stage_limits.REMEASURE_BUDGET * step_s + 1e-9
            seen["null" if record["cpu_mfu"] is None else "number"] += 1
        seen["remeasured"] += len(fake.calls) > 1
    assert min(seen.values()) >= 20, seen  # every case exercised
