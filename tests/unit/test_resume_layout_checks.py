"""The checks of a resume on another layout: what a checkpoint records or implies of its layout,
and the one-line refusals (model shape, global batch)."""
import pytest
import torch

from longctx.base.errors import UserError
from longctx.checkpoint.layout import Layout, check_global_batch, check_model_shape, engine_native, saved_layout
from longctx.data.loader import STATE_VERSION
from longctx.model.config import get_preset
from longctx.model.hf import config_to_hf


def _state(dp_rank, dp_size, rows):
    return {"data": {"version": STATE_VERSION, "dp_rank": dp_rank, "dp_size": dp_size, "seed": 0, "seq_len": 64,
                     "cached": True, "rows": rows}, "rng": None}


def test_an_older_checkpoint_s_layout_is_read_from_its_files_and_loader_states(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").touch()
    trainer_state = {"world_size": 4, "cp_size": 2, "dp_size": 2, "stage": 0, "stage_step": 5, "data_stage": 0}
    states = [_state(r // 2, 2, 30) for r in range(4)]  # 30 rows per dp rank in 5 steps
    saved = saved_layout(trainer_state, tmp_path, states, current_zero=2)
    assert saved == Layout(4, 2, 2, 2, False, 6)  # ZeRO 1 and 2 files are alike: this run's stage
    assert saved.global_batch == 12
    assert saved_layout(trainer_state, tmp_path, states, current_zero=3).zero_stage == 1
    recorded = dict(trainer_state, zero_stage=3, offload_optimizer=True, micro_batch_size=1, grad_accum=4)
    assert saved_layout(recorded, tmp_path, current_zero=0) == Layout(4, 2, 2, 3, True, 4)


def test_deepspeed_loads_its_own_files_only_for_the_same_partitions():
    base = Layout(2, 1, 2, 2, False, 4)
    assert engine_native(base, Layout(2, 2, 1, 2, False, 8))  # cp <-> dp: the same ZeRO partitions
    assert not engine_native(base, Layout(1, 1, 1, 2, False, 8))
    assert not engine_native(base, Layout(2, 1, 2, 2, True, 4))
    assert engine_native(Layout(4, 1, 4, 0, False, 1), Layout(1, 1, 1, 0, False, 4))  # ZeRO-0: one file


def test_another_model_shape_is_one_line_naming_the_field(tmp_path):
    config = get_preset("debug-tiny")
    trainer_state = {"model_config": config_to_hf(config, torch.float32)}
    check_model_shape(tmp_path, trainer_state, config)  # the same shape passes
    wider = get_preset("debug-tiny")
    wider.num_key_value_heads = 4
    with pytest.raises(UserError, match=r"holds a model with num_key_value_heads=2; this run's model has "
                                        r"num_key_value_heads=4"):
        check_model_shape(tmp_path, trainer_state, wider)


@pytest.mark.parametrize("micro, accum, dp, fix", [
    (2, 1, 1, "set train.grad_accum=4 to keep it"),
    (3, 2, 2, "set data.micro_batch_size=2 to keep it"),
    (3, 1, 3, "8 rows do not split over 3 data-parallel ranks"),
])
def test_another_global_batch_on_another_dp_size_says_what_keeps_it(tmp_path, micro, accum, dp, fix):
    saved = Layout(4, 1, 4, 1, False, 2)  # 8 rows per step
    with pytest.raises(UserError, match=f"global batch of 8 rows per step .*: {fix}$"):
        check_global_batch(tmp_path, saved, Layout(dp, 1, dp, 1, False, micro * accum), micro_batch_size=micro,
                           grad_accum=accum)
    check_global_batch(tmp_path, saved, Layout(4, 1, 4, 1, False, micro * accum), micro_batch_size=micro,
                       grad_accum=accum)  # the same dp size: not checked
