"""The MFU's peak: a GPU by name, a CPU's GEMM rate measured once per environment and cached."""
import json

import pytest
import torch

from helpers.model import tiny_config
from longctx.train import mfu


def test_cpu_rate_is_measured_once_then_read_from_the_cache(tmp_path):
    path = tmp_path / "rates.json"
    first = mfu.cpu_gemm_rate(torch.float32, rates_file=path)
    cached = json.loads(path.read_text())
    (key, rates), = cached.items()
    assert f"{torch.get_num_threads()} threads" in key and rates == {"float32": first} and first > 0
    path.write_text(json.dumps({key: {"float32": 123.0}}))  # a run reads the cache, it does not measure
    assert mfu.cpu_gemm_rate(torch.float32, rates_file=path) == 123.0
    assert mfu.peak_flops_per_device(None, torch.float32, rates_file=path) == (123.0, "cpu-gemm")
    mfu.cpu_gemm_rate(torch.bfloat16, rates_file=path)  # another dtype joins the same entry
    assert set(json.loads(path.read_text())[key]) == {"float32", "bfloat16"}


@pytest.mark.parametrize("content", ["not json", json.dumps({"x": {"float32": -1}})])
def test_a_broken_or_foreign_cache_is_measured_again(tmp_path, content):
    path = tmp_path / "rates.json"
    path.write_text(content)
    assert mfu.cpu_gemm_rate(torch.float32, rates_file=path) > 0
    assert any(v.get("float32", 0) > 0 for v in json.loads(path.read_text()).values())


def test_measure_environment_fills_each_thread_count(tmp_path):
    path = tmp_path / "rates.json"
    before = torch.get_num_threads()
    out = mfu.measure_environment(dtypes=(torch.float32,), thread_counts=[1, 2], rates_file=path)
    assert set(out) == {"float32 @ 1", "float32 @ 2"} and torch.get_num_threads() == before
    assert sorted(k.rsplit("| ", 1)[1] for k in json.loads(path.read_text())) == ["1 threads", "2 threads"]


def test_configured_peak_wins_and_flops_per_token_by_hand():
    assert mfu.peak_flops_per_device(400.0, torch.bfloat16) == (400e12, "config")
    cfg = tiny_config("default", "gqa")
    d, f, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    n = L * (2 * d * H * D + 2 * d * Hkv * D + 3 * d * f) + V * d
    assert mfu.flops_per_token(cfg, 100) == 6 * n + 6 * L * H * D * 100
    assert mfu.flops_per_token(cfg, 100, causal=False) == 6 * n + 12 * L * H * D * 100
