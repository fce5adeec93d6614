"""The training step reads the host a fixed number of times per optimizer step, not once per
micro-batch, and runs a fixed number of collectives: the real trainer, with a hook counting the
scalar device -> host copies made inside train_step (item(), float(), bool() of a tensor) and
its torch.distributed collective calls (tests/helpers/process_hooks.py). The loss by position
rides in the loss's all-reduce: it adds neither.
On a GPU each such read waits for the queued kernels, so a read per micro-batch stalls it.
Document masking is off: the CPU attention kernel plans its tiles on the host (the CUDA path
plans once per batch, cached), and this test is about the step's own numbers. `tolist()` does
not pass the dispatcher and is not counted; the step's two per-step reads use it."""
import subprocess

from helpers.process_hooks import counted_syncs_env
from helpers.train import TINY, env, train_cmd

# one process, ZeRO-0: as many as before the loss by position existed (measured with this test on
# the commit before it, a69494c)
STEP_COLLECTIVES = 4


def _reads(tmp_path, grad_accum: int) -> tuple[list[int], list[int]]:
    run = tmp_path / f"ga{grad_accum}"
    run.mkdir()
    e = env()
    log = counted_syncs_env(run, e)
    overrides = [f"out_dir={run / 'out'}", *TINY, "train.steps=3", f"train.grad_accum={grad_accum}",
                 "data.document_masking=false", "checkpoint.every=0"]
    res = subprocess.run(train_cmd(1, overrides), capture_output=True, text=True, timeout=600, env=e)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = [line.split() for line in log.read_text().splitlines()]
    assert [int(ga) for ga, _, _ in rows] == [grad_accum] * 3
    return [int(n) for _, n, _ in rows], [int(c) for _, _, c in rows]


def test_host_reads_and_collectives_per_step_do_not_grow_with_micro_batches(tmp_path):
    (one, one_coll), (four, four_coll) = _reads(tmp_path, 1), _reads(tmp_path, 4)
    assert len(set(one)) == 1 and len(set(four)) == 1, (one, four)  # the same every step
    assert four[0] == one[0], f"{four[0]} host reads with 4 micro-batches, {one[0]} with 1"
    assert one[0] <= 4, one  # the loss scale's weight, the loss, the gradient norm: a few per step
    assert len(set(one_coll)) == 1 and len(set(four_coll)) == 1, (one_coll, four_coll)
    # the label weight's all-reduce, the loss's (which carries the loss by position), DeepSpeed's at
    # the accumulation boundary: per step, whatever the micro-batches
    assert four_coll[0] == one_coll[0] == STEP_COLLECTIVES, (one_coll, four_coll)
