"""The correctness and summary helpers of benchmarks/bench_peers.py (pure functions, tiny tensors),
and the CPU machine-limit measurement in benchlib.cpu_limits. benchmarks/ is on pytest's
pythonpath (pyproject.toml): `benchlib` and the scripts import by name."""
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from benchlib.cpu_limits import best_limits, cpu_limit_fraction, measure_cpu_limits, step_flops
from benchlib.peer_checks import GRAD_TOLERANCE, compare_grads, correctness_row, ratio_table, speed_summary
from benchlib.peer_contenders import build_order, make_batch, shifted_labels

from longctx.model import get_preset
from longctx.train.mfu import flops_per_token


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


def test_alst_builds_last():
    assert build_order(["alst", "hf", "ring", "alst-tiled", "ours"]) == ["hf", "ring", "ours", "alst", "alst-tiled"]


def test_ratio_table_picks_best_of_each_side():
    rows = [{"seq_len": 8, "impl": "ring", "tokens_per_s_median": 30.0, "tokens_per_s_fastest": 30.0,
             "peak_rss_gb": 1.0},
            {"seq_len": 8, "impl": "ulysses", "tokens_per_s_median": 20.0, "tokens_per_s_fastest": 40.0,
             "peak_rss_gb": 0.8},
            {"seq_len": 8, "impl": "alst", "tokens_per_s_median": 10.0, "tokens_per_s_fastest": 20.0,
             "peak_rss_gb": 2.0},
            {"seq_len": 8, "impl": "alst-tiled", "error": "x"}]
    line = ratio_table(rows, ("ring", "ulysses"), ("alst", "alst-tiled")).splitlines()[-1]
    assert line == "| 8 | ring | alst | 3.00x | 2.00x | 0.40x |"


def test_batch_and_shifted_labels():
    b = make_batch(50, 6)
    assert b["input_ids"].shape == (1, 6) and torch.equal(b["labels"], b["input_ids"])
    y = shifted_labels(b["labels"])
    assert torch.equal(y[0, :-1], b["input_ids"][0, 1:]) and y[0, -1] == -100


# two operations at their best times: a linear layer (4 calls of 1e6 FLOPs, 0.01 s each) and
# the attention kernel (2 calls of 3e6 FLOPs, 0.05 s each)
_LINEAR = {"kind": "linear", "shape": [1, 8, 4, 4], "count": 4, "flops": 1e6, "seconds": 0.01}
_ATTENTION = {"kind": "attention", "shape": [4, 2, 8, 16], "count": 2, "flops": 3e6, "seconds": 0.05}


def test_cpu_limit_fraction_by_hand():
    limits = {"ops": [_LINEAR, _ATTENTION]}
    frac = cpu_limit_fraction(limits, 1.0)
    assert frac["gemm_limit_s"] == pytest.approx(0.04)  # 4 calls x 0.01 s
    assert frac["attention_limit_s"] == pytest.approx(0.1)  # 2 calls x 0.05 s
    assert frac["cpu_mfu"] == pytest.approx(0.14)  # (0.04 + 0.1) s of limit in a 1 s step
    # 3 micro-batches cut to half their columns in 2 s: GEMMs scale with the columns (3 x 0.5 x 0.04 =
    # 0.06 s), attention with its causal pairs (3 x 0.5^2 x 0.1 = 0.075 s); (0.06 + 0.075) / 2 = 0.0675
    frac = cpu_limit_fraction(limits, 2.0, micro_batches=3, computed=0.5)
    assert (frac["gemm_limit_s"], frac["attention_limit_s"]) == (pytest.approx(0.06), pytest.approx(0.075))
    assert frac["cpu_mfu"] == pytest.approx(0.0675)
    # a measured pair share replaces 0.5^2: 3 x 0.1 x 0.1 = 0.03 s
    assert cpu_limit_fraction(limits, 2.0, micro_batches=3, computed=0.5,
                              attention_fraction=0.1)["attention_limit_s"] == pytest.approx(0.03)


def test_best_limits_keeps_each_operations_best_time():
    old = {"ops": [_LINEAR, _ATTENTION]}
    new = {"ops": [dict(_LINEAR, seconds=0.02), dict(_ATTENTION, seconds=0.025)]}
    best = best_limits(old, new)
    assert [o["seconds"] for o in best["ops"]] == [0.01, 0.025]
    assert best["gemm_flops_per_s"] == pytest.approx(1e8)  # 4 x 1e6 FLOPs in 4 x 0.01 s
    assert best["attention_flops_per_s"] == pytest.approx(1.2e8)  # 2 x 3e6 FLOPs in 2 x 0.025 s
    assert best_limits(None, new) is new  # the first measurement


def test_step_flops_by_hand_and_the_measured_limits():
    cfg = get_preset("debug-tiny")  # d 64, f 160, 2 layers, 4 q heads / 2 kv heads of 16, vocab 512, untied
    gemm, attn = step_flops(cfg, 256, 2)
    # matmul parameters: 2 layers x (q 64x64 + k, v 64x32 each + o 64x64 + gate, up, down 64x160 each)
    # = 2 x 43008 = 86016, + head 512 x 64 = 32768 -> 118784; 6 FLOPs each per token, 256 tokens, 2 ranks
    assert gemm == 6 * 118784 * 256 / 2 == 91_226_112
    # causal attention: 6 x 2 layers x 4 heads x 16 dims x 256^2 pairs, over 2 ranks
    assert attn == 6 * 2 * 4 * 16 * 256**2 / 2 == 25_165_824
    # the same total as the documented MFU formula (per token, for one rank of two)
    assert (gemm + attn) * 2 == pytest.approx(flops_per_token(cfg, 256) * 256)
    limits = measure_cpu_limits(cfg, 256, 2, seconds=0.0)  # every operation timed once
    assert all(op["seconds"] > 0 for op in limits["ops"])
    assert limits["gemm_flops_per_s"] > 0 and limits["attention_flops_per_s"] > 0


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


# ------------------------------------------------------------------ --init-from DIR
def _hf_dir(tmp_path, layers=2):
    from longctx.model import build_model
    from longctx.model.config import ModelConfig
    from longctx.model.hf import save_pretrained

    cfg = ModelConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=layers,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e5}, tie_word_embeddings=True)
    path = tmp_path / "src"
    save_pretrained(build_model(cfg, seed=3), path, dtype=torch.float32)
    return str(path), cfg


def test_init_from_takes_the_directorys_shape_and_weights(tmp_path):
    import bench_peers
    from benchlib import model as bench_model

    from longctx.model.hf import load_pretrained, read_hf_config

    src, cfg = _hf_dir(tmp_path)
    args = bench_peers.parse(["--init-from", src, "--lengths", "2048", "--layers", "1"])
    assert args.vocab == 97
    out = str(tmp_path / "ckpt")
    written = bench_model.write_checkpoint(args, out, args.max_position)
    stored = read_hf_config(out)
    assert stored == written and stored.num_hidden_layers == 1 and stored.max_position_embeddings == 4096
    assert (stored.num_attention_heads, stored.num_key_value_heads, stored.rope_parameters["rope_theta"]) == (6, 2, 1e5)
    a, b = load_pretrained(src).state_dict(), load_pretrained(out).state_dict()
    assert set(b) == {k for k in a if not k.startswith("layers.1.")}
    assert all(torch.equal(a[k], b[k]) for k in b)
    args = bench_peers.parse(["--init-from", src, "--random-weights"])
    bench_model.write_checkpoint(args, str(tmp_path / "shape"), args.max_position)
    c = load_pretrained(tmp_path / "shape").state_dict()
    assert {k: v.shape for k, v in c.items()} == {k: v.shape for k, v in a.items()}
    assert not torch.equal(c["embed_tokens.weight"], a["embed_tokens.weight"])
    assert bench_model.model_source(args) == f"shape:{src}"


@pytest.mark.parametrize("argv,msg", [
    (["--init-from", "/nonexistent/dir"], "error: --init-from: /nonexistent/dir: model directory does not exist"),
    (["--layers", "9"], "error: --layers: 9 is not in 0..4"),
    (["--random-weights"], "error: --random-weights: only with --init-from DIR"),
])
def test_bad_init_from_is_one_error_line(argv, msg, capsys):
    import bench_peers

    with pytest.raises(SystemExit) as e:
        bench_peers.parse(argv)
    assert e.value.code == 2 and capsys.readouterr().err.strip().startswith(msg)


def test_init_from_without_weights_names_the_option(tmp_path, capsys):
    import bench_train

    (tmp_path / "cfg").mkdir()
    src, _ = _hf_dir(tmp_path)
    (tmp_path / "cfg" / "config.json").write_text((Path(src) / "config.json").read_text())
    with pytest.raises(SystemExit) as e:
        bench_train.parse(["--init-from", str(tmp_path / "cfg")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error: --init-from:") and "--random-weights" in err
    assert bench_train.parse(["--init-from", str(tmp_path / "cfg"), "--random-weights"]).random_weights


def test_bench_train_sides_load_the_same_weights(tmp_path):
    """ours and transformers from one --init-from checkpoint: the same first loss."""
    import bench_train
    from benchlib import model as bench_model

    src, _ = _hf_dir(tmp_path)
    args = bench_train.parse(["--init-from", src, "--seq-lens", "64"])
    ckpt = str(tmp_path / "ckpt")
    bench_model.write_checkpoint(args, ckpt, 64)
    sides = {impl: bench_train.TrainStep(impl, 64, ckpt=ckpt) for impl in ("ours", "hf")}
    for side in sides.values():
        side.step()
    ours, hf = (sides[impl].summary() for impl in ("ours", "hf"))
    assert ours["layers"] == hf["layers"] == 2
    assert ours["loss"] == pytest.approx(hf["loss"], rel=2e-2)  # bf16


def test_thread_policy_is_one_stated_setting(capsys):
    import bench_peers

    args = bench_peers.parse(["--threads-per-rank", "2", "--world", "3"])
    policy = bench_peers.thread_policy(args)
    assert policy["threads_per_rank"] == 2 and policy["processes"] == 3
    assert policy["env"] == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    assert "2 threads" in policy["one_process_contenders"] and "2 threads" in policy["machine_limits"]
    assert bench_peers.parse([]).threads_per_rank == 1
    with pytest.raises(SystemExit) as e:
        bench_peers.parse(["--threads-per-rank", "0"])
    assert e.value.code == 2 and "--threads-per-rank: 0; valid: an integer >= 1" in capsys.readouterr().err


def test_dtype_is_a_stated_setting_and_the_report_records_the_machine(capsys):
    import bench_peers
    import torch
    from benchlib.machine import machine_facts, package_versions

    assert bench_peers.parse([]).dtype is torch.bfloat16
    args = bench_peers.parse(["--dtype", "float32"])
    assert args.dtype is torch.float32 and args.dtype_name == "float32"
    with pytest.raises(SystemExit) as e:
        bench_peers.parse(["--dtype", "fp8"])
    assert e.value.code == 2 and "--dtype" in capsys.readouterr().err
    threads = torch.get_num_threads()
    facts = machine_facts(n=64, seconds=0.01)
    assert torch.get_num_threads() == threads  # measured at one thread, then restored
    assert set(facts["gemm_gflops_1_thread"]) == {"float32", "bfloat16"}
    assert all(rate > 0 for rate in facts["gemm_gflops_1_thread"].values())
    assert facts["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability() and facts["cpu"]
    assert set(facts["cpu_flags"]) <= {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert facts["versions"]["torch"] == version("torch") and "deepspeed" in facts["versions"]
    assert package_versions(("no-such-package-longctx",)) == {"no-such-package-longctx": None}
