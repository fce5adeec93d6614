"""DeepSpeed's universal checkpoint as the bridge between layouts: one folder of every
parameter's full fp32 master weight and Adam moments, which an engine of any world size and
ZeRO stage loads into its own partitions.

    to_universal(ckpt / "ds", folder, names)     # rank 0; folder/ds/zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt
    load_universal(engine, model, folder)        # collective: each rank takes its partitions

Writing: ZeRO 1-3 (and bf16 at ZeRO-1, DeepSpeed's BF16_Optimizer) partitions are converted by
DeepSpeed's own ds_to_universal; a ZeRO-0 checkpoint holds the whole optimizer in
mp_rank_00_model_states.pt (torch's AdamW, or DeepSpeed's FP16_UnfusedOptimizer with its fp32
copies in a bf16 run), written into the same files here. Loading: a ZeRO 1-3 engine loads the
folder with DeepSpeed's universal checkpoint loader; a ZeRO-0 engine (which DeepSpeed's loader
does not cover) takes the weights and moments here.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
from pathlib import Path
from typing import Iterable

import torch
from torch import nn

from longctx.base.errors import UserError
from longctx.checkpoint.safe_load import load_checkpoint_file
from longctx.parallel.checkpointing import model_key

TAG = "ds"  # the converted checkpoint's tag inside the universal folder (as in a training checkpoint)
STATES = ("fp32", "exp_avg", "exp_avg_sq")
ZERO0_STATES = "mp_rank_00_model_states.pt"  # ZeRO 0-2: the module (ZeRO-0: and the whole optimizer)
ZERO3_STATES = "zero_pp_rank_0_mp_rank_00_model_states.pt"  # ZeRO-3: the first rank's model states


def zero_stage_of(ds_dir: Path) -> int:
    """The ZeRO stage a DeepSpeed checkpoint directory was written at, from its file names
    (1 stands for 1 or 2: their files are alike)."""
    if any(ds_dir.glob("zero_pp_rank_*_mp_rank_*_model_states.pt")):
        return 3
    if any(ds_dir.glob("*zero_pp_rank_*_optim_states.pt")):
        return 1
    return 0


@contextlib.contextmanager
def _quiet():
    """DeepSpeed's converter prints its progress and bars; they stay off the console."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def to_universal(ds_dir: Path, folder: Path, names: list[str]) -> None:
    """Rank 0: the universal form of the checkpoint in `ds_dir` as folder/ds. `names`: the
    model's parameters in the optimizer's order (zero.optimizer_param_names), for ZeRO-0."""
    out = folder / TAG
    stage = zero_stage_of(ds_dir)
    if stage == 0:
        _zero0_to_universal(ds_dir, out, names)
    else:
        from deepspeed.checkpoint import ds_to_universal  # lazy: seconds to import

        # one worker: the converter's process pool would fork this training process
        args = argparse.Namespace(input_folder=str(ds_dir), output_folder=str(out), num_extract_workers=1,
                                  num_merge_workers=1, keep_temp_folder=False, strict=True,
                                  inject_missing_state=True)
        with _quiet():
            ds_to_universal.main(args)
    _for_every_stage(out, stage)


def _slim(model_states: dict) -> dict:
    """A model states file without the weights and optimizer, which DeepSpeed's universal loader
    does not read (every rank loads this file)."""
    return dict(model_states, module={}, optimizer=None)


def _for_every_stage(out: Path, source_stage: int) -> None:
    """What DeepSpeed's loaders of ZeRO 1-2 and of ZeRO-3 read differs: the model states file's
    name, the parameters' files shaped (1-2) or flat (3), and in zero/optimizer_state.pt the
    version (1-2) or the step in the base optimizer's state (3). The converter writes its
    source stage's; the other stage's is added here."""
    have, want = (ZERO3_STATES, ZERO0_STATES) if source_stage == 3 else (ZERO0_STATES, ZERO3_STATES)
    model_states = load_checkpoint_file(out / have)
    if model_states.get("module") or model_states.get("optimizer"):  # ZeRO 1-2: the converter's full copy
        model_states = _slim(model_states)
        torch.save(model_states, out / have)
    os.symlink(have, out / want)
    if source_stage == 3:  # the converter writes each parameter's files flat
        for shapes in model_states.get("param_shapes") or ():
            for name, shape in shapes.items():
                for key in STATES:
                    file = out / "zero" / name / f"{key}.pt"
                    value = load_checkpoint_file(file)
                    flat = value["param"] if isinstance(value, dict) else value
                    torch.save({"param": flat.view(shape), "cat_dim": 0}, file)
    path = out / "zero" / "optimizer_state.pt"
    state = load_checkpoint_file(path)
    if not state.get("ds_version"):
        state["ds_version"] = model_states["ds_version"]
    base = state.get("optimizer_state_dict")
    steps = sorted((out / "zero").glob("*/step.pt"))
    if isinstance(base, dict) and base.get("state"):
        step = base["state"][0]["step"]
    else:
        step = load_checkpoint_file(steps[0])
        state["optimizer_state_dict"] = {"state": {0: {"step": step}}, "param_groups": state["param_groups"]}
    torch.save(state, path)
    if not steps:  # ZeRO-3 keeps the step in optimizer_state.pt only; ZeRO 1-2 read it per parameter
        for folder in (out / "zero").iterdir():
            if folder.is_dir():
                torch.save(torch.as_tensor(step).clone(), folder / "step.pt")


def _save_state(out: Path, name: str, key: str, tensor: torch.Tensor) -> None:
    torch.save({"param": tensor.detach().float().contiguous(), "cat_dim": 0}, out / "zero" / name / f"{key}.pt")


def _zero0_to_universal(ds_dir: Path, out: Path, names: list[str]) -> None:
    path = ds_dir / ZERO0_STATES
    saved = load_checkpoint_file(path)
    opt = saved.get("optimizer") if isinstance(saved, dict) else None
    if not isinstance(opt, dict):
        raise UserError(f"checkpoint.resume: {path} holds no optimizer state")
    if "fp32_groups" in opt:  # bf16 at ZeRO-0: DeepSpeed's FP16_UnfusedOptimizer around torch's AdamW
        inner = opt["optimizer_state_dict"]
        masters = [t for group in opt["fp32_groups"] for t in group]
    else:
        inner, masters = opt, None
    order = [i for group in inner["param_groups"] for i in group["params"]]
    if len(order) != len(names):
        raise UserError(f"checkpoint.resume: {path} has optimizer state for {len(order)} parameters, "
                        f"the model has {len(names)}")
    for pos, (index, name) in enumerate(zip(order, names)):
        master = masters[pos] if masters is not None else saved["module"][name]
        (out / "zero" / name).mkdir(parents=True, exist_ok=True)
        _save_state(out, name, "fp32", master)
        state = inner["state"].get(index, {})
        for key in ("exp_avg", "exp_avg_sq"):
            _save_state(out, name, key, state.get(key, torch.zeros_like(master, dtype=torch.float32)))
        torch.save(torch.tensor(float(state.get("step", 0.0))), out / "zero" / name / "step.pt")
    groups = [{k: v for k, v in g.items() if k != "params"} | {"params": []} for g in inner["param_groups"]]
    torch.save({"ds_version": saved.get("ds_version"), "param_groups": groups}, out / "zero" / "optimizer_state.pt")
    torch.save(_slim(saved), out / ZERO0_STATES)


def load_universal(engine, model: nn.Module, folder: Path) -> None:
    """Collective: every rank's engine takes its share of the universal checkpoint in folder/ds."""
    if engine.zero_optimization_stage() == 0:
        _load_zero0(engine, model, folder / TAG / "zero")
        return
    base = engine.optimizer.optimizer
    # this run's hyperparameters (betas, eps, weight decay per group): DeepSpeed's loaders copy the
    # source's (ZeRO-3's its first group's into every group)
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in base.param_groups]
    config = engine._config  # DeepSpeed reads this flag at load time only (checkpoint.load_universal)
    config.load_universal_checkpoint = True
    try:
        with _quiet():
            load_path, _ = engine.load_checkpoint(str(folder), tag=TAG, load_optimizer_states=True,
                                                  load_lr_scheduler_states=False)
    finally:
        config.load_universal_checkpoint = False
    for group, own in zip(base.param_groups, hyper):
        for key in [k for k in group if k != "params" and k not in own]:
            del group[key]
        group.update(own)
    if load_path is None:
        raise UserError(f"checkpoint.resume: DeepSpeed could not load the universal checkpoint in {folder}")
    _own_steps(base)


def _own_steps(optimizer: torch.optim.Optimizer) -> None:
    """Each state's step in the form its optimizer keeps it, and its own object: the loaders give
    whatever the source optimizer saved (DeepSpeed's CPU Adam an int, torch's AdamW a tensor), and
    ZeRO-3's gives every sub-group the same tensor, which torch advances in place once per group."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # lazy: seconds to import

    for p, state in optimizer.state.items():  # (ZeRO-3's loader leaves its groups' params empty until the step)
        if "step" in state:
            step = float(state["step"])
            state["step"] = (int(step) if isinstance(optimizer, DeepSpeedCPUAdam)
                             else _step_tensor(step, optimizer.defaults, p.device))


def _masters(engine, model: nn.Module) -> Iterable[tuple[str, nn.Parameter, torch.Tensor, torch.optim.Optimizer, dict]]:
    """(name, model parameter, its fp32 master, the torch optimizer stepping it, its param group)
    of every parameter at ZeRO-0."""
    names = {id(p): model_key(n) for n, p in model.named_parameters()}
    opt = engine.optimizer
    if hasattr(opt, "fp32_groups"):  # bf16: fp32 copies stepped by the wrapped optimizer
        for low_group, fp32_group, group in zip(opt.fp16_groups, opt.fp32_groups, opt.optimizer.param_groups):
            for low, master in zip(low_group, fp32_group):
                yield names[id(low)], low, master, opt.optimizer, group
        return
    for group in opt.param_groups:
        for p in group["params"]:
            yield names[id(p)], p, p, opt, group


def _step_tensor(step: float, group: dict, device: torch.device) -> torch.Tensor:
    """The step as torch's AdamW keeps it (on the parameter's device for its fused and
    capturable kernels)."""
    if group.get("fused") or group.get("capturable"):
        return torch.tensor(step, dtype=torch.float32, device=device)
    return torch.tensor(step, dtype=torch.float32)


def _load_zero0(engine, model: nn.Module, zero: Path) -> None:
    for name, low, master, opt, group in _masters(engine, model):
        files = {key: load_checkpoint_file(zero / name / f"{key}.pt")["param"]
                 for key in STATES}
        step = float(load_checkpoint_file(zero / name / "step.pt"))
        with torch.no_grad():
            master.copy_(files["fp32"].view_as(master))
            if low is not master:
                low.copy_(files["fp32"].view_as(low))
        opt.state[master] = {"step": _step_tensor(step, group, master.device),
                             "exp_avg": files["exp_avg"].view_as(master).to(master.device).clone(),
                             "exp_avg_sq": files["exp_avg_sq"].view_as(master).to(master.device).clone()}
