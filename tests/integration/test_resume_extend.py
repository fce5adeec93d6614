"""Resuming with a changed config: more steps or more stages train them; nothing new is a notice."""
from types import SimpleNamespace

from longctx.train.continuation import continue_from
from helpers.train import TINY, metrics, run_train

BASE = [*TINY, "optim.schedule=constant", "checkpoint.every=2", "checkpoint.keep_last=3"]


def _stages(*steps):
    return [SimpleNamespace(name=f"s{i}", steps=n) for i, n in enumerate(steps)]


def _ok(res):
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]


def test_continue_from_each_case():
    finished = {"stage": 1, "stage_step": 0, "stage_steps": [4], "data_stage": 0, "step": 4}
    more = continue_from(finished, _stages(6))
    assert (more.stage, more.stage_step, more.loader_belongs) == (0, 4, True) and "from 4 to 6" in more.note
    added = continue_from(finished, _stages(4, 3))
    assert (added.stage, added.stage_step, added.loader_belongs) == (1, 0, False) and "starting stage 1" in added.note
    assert continue_from(finished, _stages(4)).stage == 1  # nothing left
    assert continue_from(finished, _stages(3)).stage == 1  # shortened: still nothing left
    mid = {"stage": 0, "stage_step": 2, "stage_steps": [4], "data_stage": 0, "step": 2}
    resumed = continue_from(mid, _stages(9))
    assert (resumed.stage, resumed.stage_step, resumed.loader_belongs, resumed.note) == (0, 2, True, None)
    past = continue_from(mid, _stages(2, 5))
    assert (past.stage, past.stage_step, past.loader_belongs) == (1, 0, False) and "moving on" in past.note
    boundary = {"stage": 1, "stage_step": 0, "stage_steps": [4, 4], "data_stage": 0, "step": 4}
    assert continue_from(boundary, _stages(4, 4)) == continue_from(boundary, _stages(9, 4))  # no going back
    legacy = {"stage": 1, "stage_step": 0, "step": 4}  # written before stage_steps was recorded
    assert continue_from(legacy, _stages(6)).stage == 1


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
