"""Resuming with a changed config: more steps or more stages train them; nothing new is a notice."""
from helpers.train import TINY, metrics, run_train

BASE = [*TINY, "optim.schedule=constant", "checkpoint.every=2", "checkpoint.keep_last=3"]


def _ok(res):
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]


def test_extending_a_finished_run_trains_the_new_steps_exactly(tmp_path):
    short, long_ = tmp_path / "short", tmp_path / "long"
    _ok(run_train(1, [*BASE, f"out_dir={short}", "train.steps=4"]))
    _ok(run_train(1, [*BASE, f"out_dir={long_}", "train.steps=6"]))
    res = run_train(1, [*BASE, f"out_dir={short}", "train.steps=6", "checkpoint.resume=auto"])
    _ok(res)
    assert "extending stage 0 (main) from 4 to 6 steps" in res.stderr
    extended, reference = metrics(short), metrics(long_)
    assert [r["step"] for r in extended] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in extended] == [r["loss"] for r in reference]  # constant LR: one run's losses
    again = run_train(1, [*BASE, f"out_dir={short}", "train.steps=6", "checkpoint.resume=auto"])
    _ok(again)
    notice = [line for line in again.stderr.splitlines() if line.startswith("nothing to train")]
    assert len(notice) == 1 and "step_0000006" in notice[0] and "all 6 steps" in notice[0]
    assert len(metrics(short)) == 6


def test_adding_a_stage_to_a_finished_run_trains_it(tmp_path):
    out = tmp_path / "run"
    one = "stages=[{name: short, seq_len: 128, steps: 2}]"
    two = "stages=[{name: short, seq_len: 128, steps: 2}, {name: long, seq_len: 256, steps: 2}]"
    _ok(run_train(1, [*BASE, f"out_dir={out}", one]))
    res = run_train(1, [*BASE, f"out_dir={out}", two, "checkpoint.resume=auto"])
    _ok(res)
    assert "starting stage 1 (long)" in res.stderr
    records = metrics(out)
    assert [(r["step"], r["stage"], r["seq_len"]) for r in records] == [(1, 0, 128), (2, 0, 128), (3, 1, 256),
                                                                         (4, 1, 256)]
