"""benchmarks/profile_train_step.py on CPU with a tiny model: both sides profiled, kernels sorted
into kinds, the per-kind totals the sum of their kernels, bad arguments one line."""
import json

import profile_train_step as prof
import pytest


@pytest.mark.parametrize("name, kind", [
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("aten::mm", "gemm"),
    ("aten::cos", "rope"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "copies"),
    ("void at::native::reduce_kernel<512, 1>", "reductions"),
    ("ncclDevKernel_AllReduce_Sum_f32", "communication"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4>", "loss"),
    ("aten::embedding_dense_backward", "other"),
])
def test_kernels_sort_into_kinds(name, kind):
    assert prof.kind_of(name) == kind


def test_both_sides_on_cpu(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert prof.main(["--preset", "debug-tiny", "--seq-len", "128", "--rows", "3", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["kernels"]) == {"ours", "hf"}
    for impl, rows in data["kernels"].items():
        assert rows == sorted(rows, key=lambda r: -r["self_ms"]) and rows[0]["self_ms"] > 0
        total = sum(r["self_ms"] for r in rows)
        assert sum(data["by_kind"][impl].values()) == pytest.approx(total)
        assert data["by_kind"][impl]["gemm"] > 0 and data["by_kind"][impl]["attention"] > 0
    printed = capsys.readouterr().out
    assert printed.rstrip().splitlines()[-1].startswith("| total |")  # the comparison comes last


@pytest.mark.parametrize("argv", [["--seq-len", "1"], ["--impls", "ours,deepspeed"], ["--rows", "0"]])
def test_bad_arguments_are_one_line(argv, capsys):
    with pytest.raises(SystemExit) as e:
        prof.parse(argv)
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: ")
