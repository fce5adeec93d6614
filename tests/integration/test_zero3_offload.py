"""(heavy) ZeRO-3 with optimizer and parameters offloaded to the CPU trains through the real trainer."""
import pytest

from helpers.train import TINY, metrics, run_train


# compiles DeepSpeed's CPU Adam (minutes on a fresh machine); ZeRO-3 itself is covered by the default tests
@pytest.mark.heavy
def test_zero3_with_cpu_offload(tmp_path):
    out = tmp_path / "run"
    res = run_train(1, [f"out_dir={out}", *TINY, "train.steps=3", "parallel.zero_stage=3",
                        "parallel.offload_optimizer=true", "parallel.offload_params=true"], timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    assert [r["step"] for r in metrics(out)] == [1, 2, 3]
