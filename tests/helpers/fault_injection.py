"""`python tests/helpers/fault_injection.py train ...`: the real CLI with test-only faults injected.

Faults (read from this script's environment, never by longctx itself):
  LONGCTX_FAULT_NAN_LOSS_STEPS=2,3   the final norm's output turns NaN during these optimizer
                                     steps (1-based), so their loss and gradients are NaN
  LONGCTX_FAULT_RANK=1               only on this rank (default: every rank)
  LONGCTX_FAULT_NAN_WEIGHT_STEP=2    after this step's update, one weight becomes NaN
  LONGCTX_FAULT_SAVE_OSERROR=28      torch.save into the checkpoint of step LONGCTX_FAULT_SAVE_STEP
  LONGCTX_FAULT_SAVE_STEP=2          raises OSError(errno) on LONGCTX_FAULT_RANK (as a full disk
                                     would, midway through DeepSpeed's part of the save)
"""
from __future__ import annotations

import os
import sys

import torch

from longctx.commands import cli
from longctx.train import loop


def _steps(name: str) -> set[int]:
    return {int(s) for s in os.environ.get(name, "").split(",") if s}


def _this_rank() -> bool:
    wanted = os.environ.get("LONGCTX_FAULT_RANK")
    return wanted is None or int(wanted) == int(os.environ.get("RANK", "0"))


NAN_LOSS_STEPS = _steps("LONGCTX_FAULT_NAN_LOSS_STEPS")
NAN_WEIGHT_STEPS = _steps("LONGCTX_FAULT_NAN_WEIGHT_STEP")
SAVE_ERRNO = int(os.environ.get("LONGCTX_FAULT_SAVE_OSERROR", "0"))
SAVE_STEP = int(os.environ.get("LONGCTX_FAULT_SAVE_STEP", "1"))
current = {"step": 0}


def _install() -> None:
    build_model, step = loop.build_plain_model, loop.Trainer._step

    def build_model_with_hook(*args, **kwargs):
        model, weights = build_model(*args, **kwargs)

        def poison(module, args, output):
            return output * float("nan") if current["step"] in NAN_LOSS_STEPS and _this_rank() else output

        model.norm.register_forward_hook(poison)
        return model, weights

    def step_with_faults(self, run, batches, stage, state, *args):
        current["step"] = state.step + 1
        record = step(self, run, batches, stage, state, *args)
        if current["step"] in NAN_WEIGHT_STEPS and _this_rank():
            with torch.no_grad():
                self.model.norm.weight.data[0] = float("nan")
        return record

    loop.build_plain_model = build_model_with_hook
    loop.Trainer._step = step_with_faults
    if SAVE_ERRNO and _this_rank():
        real_save = torch.save

        def failing_save(obj, f, *args, **kwargs):
            if "checkpoints" in str(f) and current["step"] == SAVE_STEP:
                raise OSError(SAVE_ERRNO, os.strerror(SAVE_ERRNO), str(f))
            return real_save(obj, f, *args, **kwargs)

        torch.save = failing_save


if __name__ == "__main__":
    _install()
    sys.exit(cli.main(sys.argv[1:]))
