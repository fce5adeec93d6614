"""continue_from: where a resumed run with a changed config starts (more steps, more stages, a
shortened plan); the runs themselves are in tests/integration/test_resume_extend.py."""
from types import SimpleNamespace

import pytest

from longctx.checkpoint.continuation import continue_from

FINISHED = {"stage": 1, "stage_step": 0, "stage_steps": [4], "data_stage": 0, "step": 4}  # a 4-step run done
MID = {"stage": 0, "stage_step": 2, "stage_steps": [4], "data_stage": 0, "step": 2}  # stopped at step 2 of 4
BOUNDARY = {"stage": 1, "stage_step": 0, "stage_steps": [4, 4], "data_stage": 0, "step": 4}
LEGACY = {"stage": 1, "stage_step": 0, "step": 4}  # written before stage_steps was recorded


def _stages(*steps):
    return [SimpleNamespace(name=f"s{i}", steps=n) for i, n in enumerate(steps)]


@pytest.mark.parametrize("state, steps, stage, stage_step, loader_belongs, note", [
    (FINISHED, (6,), 0, 4, True, "from 4 to 6"),  # more steps: the same stage goes on
    (FINISHED, (4, 3), 1, 0, False, "starting stage 1"),  # a stage added
    (MID, (9,), 0, 2, True, None),  # an interrupted run resumes where it stopped, silently
    (MID, (2, 5), 1, 0, False, "moving on"),  # its stage shortened below where it stopped
], ids=["more-steps", "stage-added", "mid-stage", "stage-shortened-past"])
def test_continue_from_starts_where_the_plan_says(state, steps, stage, stage_step, loader_belongs, note):
    start = continue_from(state, _stages(*steps))
    assert (start.stage, start.stage_step, start.loader_belongs) == (stage, stage_step, loader_belongs)
    assert start.note is None if note is None else note in start.note


@pytest.mark.parametrize("state, steps", [(FINISHED, (4,)), (FINISHED, (3,)), (LEGACY, (6,))],
                         ids=["same-plan", "shortened", "legacy-state"])
def test_continue_from_a_finished_plan_has_nothing_left(state, steps):
    assert continue_from(state, _stages(*steps)).stage == 1


def test_continue_from_never_goes_back_into_a_finished_stage():
    assert continue_from(BOUNDARY, _stages(4, 4)) == continue_from(BOUNDARY, _stages(9, 4))
