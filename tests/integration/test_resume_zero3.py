"""Resuming a ZeRO-3 run with full activation checkpointing (the CPU yarn recipe's layout, and
what a preempted SLURM job does): the resumed steps train, with the uninterrupted run's losses."""
import shutil

from helpers.train import TINY, metrics, run_train

ARGS = [*TINY, "optim.schedule=constant", "train.steps=4", "parallel.zero_stage=3",
        "parallel.activation_checkpointing=full", "checkpoint.every=2", "checkpoint.keep_last=3"]


def test_resume_of_a_zero3_run_with_full_checkpointing_continues_exactly(tmp_path):
    reference = tmp_path / "reference"
    res = run_train(1, [*ARGS, f"out_dir={reference}"])
    assert res.returncode == 0, res.stderr[-3000:]
    resumed = tmp_path / "resumed"  # as if stopped after step 2
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "step_0000002", resumed / "checkpoints" / "step_0000002")
    res = run_train(1, [*ARGS, f"out_dir={resumed}", "checkpoint.resume=auto"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert [r["step"] for r in metrics(resumed)] == [3, 4]
    # same data order, same fp32 partitions restored: the same arithmetic as the uninterrupted run
    assert [r["loss"] for r in metrics(resumed)] == [r["loss"] for r in metrics(reference)][2:]
