"""The correctness and summary helpers of benchmarks/bench_peers.py (pure functions, tiny tensors),
and the CPU machine-limit measurement in longctx.train.metrics."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from peer_checks import (GRAD_TOLERANCE, compare_grads, correctness_row, interleaved_order,  # noqa: E402
                         ratio_table, speed_summary)
from peer_contenders import build_order, make_batch, shifted_labels  # noqa: E402

from longctx.model import get_preset  # noqa: E402
from longctx.train.metrics import best_limits, cpu_limit_fraction, measure_cpu_limits, step_flops  # noqa: E402


def _grads(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"model.a": torch.randn(4, 3, generator=g), "lm_head.weight": torch.randn(5, 3, generator=g)}


def test_identical_gradients_are_correct():
    ref = _grads()
    row = correctness_row("x", 2.5, 2.5, {k: v.clone() for k, v in ref.items()}, ref)
    assert row["correct"] and row["max_grad_rel_err"] == 0.0 and row["missing"] == []


def test_a_scaled_gradient_is_reported_with_its_tensor():
    ref = _grads()
    grads = dict(ref, **{"lm_head.weight": ref["lm_head.weight"] * 2})  # what a missing average does
    cmp = compare_grads(grads, ref)
    assert cmp["worst_grad"] == "lm_head.weight" and cmp["max_grad_rel_err"] == pytest.approx(1.0)
    assert cmp["max_norm_rel_err"] == pytest.approx(1.0) and cmp["norm_ratio"] > 1.0
    assert not correctness_row("x", 2.5, 2.5, grads, ref)["correct"]


def test_missing_gradient_and_loss_mismatch_fail():
    ref = _grads()
    assert compare_grads({"model.a": ref["model.a"]}, ref)["missing"] == ["lm_head.weight"]
    assert not correctness_row("x", 2.5, 2.5, {"model.a": ref["model.a"]}, ref)["correct"]
    assert not correctness_row("x", 2.5 * (1 + 10 * GRAD_TOLERANCE), 2.5, ref, ref)["correct"]


def test_speed_summary_median_and_slowest():
    s = speed_summary([2.0, 1.0, 4.0], tokens=8)
    assert s["tokens_per_s_median"] == 4.0 and s["tokens_per_s_min"] == 2.0 and s["tokens_per_s_fastest"] == 8.0


def test_interleaving_alternates_order_and_alst_builds_last():
    assert interleaved_order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert interleaved_order(["a", "b", "c"], 1) == ["c", "b", "a"]
    assert build_order(["alst", "hf", "ring", "alst-tiled", "ours"]) == ["hf", "ring", "ours", "alst", "alst-tiled"]


def test_ratio_table_picks_best_of_each_side():
    rows = [{"seq_len": 8, "impl": "ring", "tokens_per_s_median": 30.0, "tokens_per_s_fastest": 30.0, "peak_rss_gb": 1.0},
            {"seq_len": 8, "impl": "ulysses", "tokens_per_s_median": 20.0, "tokens_per_s_fastest": 40.0,
             "peak_rss_gb": 0.8},
            {"seq_len": 8, "impl": "alst", "tokens_per_s_median": 10.0, "tokens_per_s_fastest": 20.0, "peak_rss_gb": 2.0},
            {"seq_len": 8, "impl": "alst-tiled", "error": "x"}]
    line = ratio_table(rows, ("ring", "ulysses"), ("alst", "alst-tiled")).splitlines()[-1]
    assert line == "| 8 | ring | alst | 3.00x | 2.00x | 0.40x |"


def test_batch_and_shifted_labels():
    b = make_batch(50, 6)
    assert b["input_ids"].shape == (1, 6) and torch.equal(b["labels"], b["input_ids"])
    y = shifted_labels(b["labels"])
    assert torch.equal(y[0, :-1], b["input_ids"][0, 1:]) and y[0, -1] == -100


def test_cpu_limits_and_fraction():
    cfg = get_preset("debug-tiny")
    limits = measure_cpu_limits(cfg, 256, 2, seconds=0.0)
    assert limits["gemm_flops_per_s"] > 0 and limits["attention_flops_per_s"] > 0
    gemm, attn = step_flops(cfg, 256, 2)
    frac = cpu_limit_fraction(limits, 1.0)
    assert frac["gemm_limit_s"] == pytest.approx(gemm / limits["gemm_flops_per_s"])
    assert frac["attention_limit_s"] == pytest.approx(attn / limits["attention_flops_per_s"])
    assert frac["cpu_mfu"] == pytest.approx(frac["gemm_limit_s"] + frac["attention_limit_s"])
    faster = dict(limits, ops=[dict(o, seconds=o["seconds"] / 2) for o in limits["ops"]])
    best = best_limits(limits, faster)  # each operation's best time across two measurements
    assert cpu_limit_fraction(best, 1.0)["cpu_mfu"] == pytest.approx(frac["cpu_mfu"] / 2)
    assert best["gemm_flops_per_s"] == pytest.approx(2 * limits["gemm_flops_per_s"])
    # the step FLOPs split of the documented MFU formula
    from longctx.train.metrics import flops_per_token

    assert (gemm + attn) * 2 == pytest.approx(flops_per_token(cfg, 256) * 256)  # one rank of two


@pytest.mark.parametrize("limit,cap,expected_probes", [
    (70000, 98304, [65536, 98304, 81920, 73728]),  # the cap is probed, then bisection
    (200000, 98304, [65536, 98304]),  # everything up to the cap fits
    (50000, 98304, [65536, 32768, 49152, 57344, 53248]),  # the start is over: bisection below it
])
def test_max_len_search_doubles_to_the_cap_then_bisects(limit, cap, expected_probes, monkeypatch):
    import bench_peers

    def fake_group(args, ckpt, world, job, timeout):
        T = job[2]
        return ([[{"peak_rss_gb": T / limit}]] * world, None) if T <= limit else (None, "over budget")

    monkeypatch.setattr(bench_peers, "run_group", fake_group)
    args = bench_peers.parse(["--max-len", "--budget-gb", "1", "--max-len-start", "65536", "--max-len-cap", str(cap)])
    found = bench_peers.max_len_search(args, "ckpt", "ulysses", lambda msg: None)
    assert [p["seq_len"] for p in found["probes"]] == expected_probes
    assert found["max_len"] == max([T for T in expected_probes if T <= limit], default=0)
