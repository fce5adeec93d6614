"""continue_from: where a resumed run with a changed config starts (more steps, more stages, a
shortened plan); the runs themselves are in tests/integration/test_resume_extend.py."""
from types import SimpleNamespace

from longctx.train.continuation import continue_from


def _stages(*steps):
    return [SimpleNamespace(name=f"s{i}", steps=n) for i, n in enumerate(steps)]


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
