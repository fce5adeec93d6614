"""The start-up line that names a 16-bit dtype slower than float32 on this CPU."""
import pytest
import torch

from longctx.train import cpu_dtype


@pytest.fixture
def rates(monkeypatch):
    """A fake CPU: GEMM FLOP/s per dtype, and the dtypes read."""
    table, calls = {}, []

    def fake(dtype):
        calls.append(dtype)
        return table[dtype]
    monkeypatch.setattr(cpu_dtype, "cpu_gemm_rate", fake)
    return table, calls


def test_a_bf16_path_far_slower_than_fp32_is_named_with_both_rates(rates):
    table, _ = rates
    table.update({torch.float32: 48e9, torch.bfloat16: 1.6e9})
    note = cpu_dtype.slow_dtype_note(torch.bfloat16, torch.device("cpu"))
    assert note.startswith("train.dtype bfloat16: this CPU (")
    assert "at 1.6 GFLOP/s against 48.0 in float32 (30x slower)" in note
    assert note.endswith("train.dtype=float32 runs faster here")


@pytest.mark.parametrize("half", [24.1e9, 48e9, 96e9])  # within 2x of fp32, as fast, faster
def test_no_note_where_the_16_bit_dtype_keeps_up(rates, half):
    table, _ = rates
    table.update({torch.float32: 48e9, torch.bfloat16: half})
    assert cpu_dtype.slow_dtype_note(torch.bfloat16, torch.device("cpu")) is None


def test_float32_runs_and_other_devices_measure_nothing(rates):
    _, calls = rates
    assert cpu_dtype.slow_dtype_note(torch.float32, torch.device("cpu")) is None
    assert cpu_dtype.slow_dtype_note(torch.bfloat16, torch.device("cuda")) is None
    assert calls == []


def test_the_real_measurement_gives_a_line_or_none():
    note = cpu_dtype.slow_dtype_note(torch.bfloat16, torch.device("cpu"))
    assert note is None or "x slower" in note


@pytest.mark.parametrize("half, want", [(1.6e9, "float32"), (30e9, "bfloat16"), (96e9, "bfloat16")])
def test_auto_dtype_is_bf16_unless_its_gemms_lag_float32(rates, monkeypatch, half, want):
    table, _ = rates
    table.update({torch.float32: 48e9, torch.bfloat16: half})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    dtype, why = cpu_dtype.auto_dtype()
    assert dtype == want
    assert ("30x slower" in why) == (want == "float32")
