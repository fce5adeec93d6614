"""Resuming a checkpoint on another layout: world size, cp / dp split, ZeRO stage or optimizer
offload may differ from the run that wrote it; the model's shape and the global batch may not.

    check_resume(ckpt, trainer_state, ...)          # before the engine: model shape, global batch kept
    saved = saved_layout(trainer_state, ckpt, current_zero=...)   # as the checkpoint records it
    engine_native(saved, current)                   # DeepSpeed loads its own files as they are
    states = read_rank_states(ckpt, saved.world_size)
    loader_state(states, ...)                       # this rank's loader, resharded to the new dp
    rng_for(states, rank)                           # the RNG kept

What is kept across a layout change:
- weights, fp32 masters, Adam moments and step: exact (DeepSpeed's universal checkpoint,
  checkpoint/universal.py), unless DeepSpeed loads the files natively (same world size, ZeRO stage
  and offload; or ZeRO-0 at both ends, whose files do not depend on the world size);
- the data order: each new dp rank gets the state its loader would hold after the rows the
  run has trained on, as in an uninterrupted run at the new layout. With data.cache_dir it is
  computed from the saved states (data/reshard.py); without, the new rank's loader replays
  those rows once (tokenizing and packing them again), since packed documents are per rank;
- RNG states: rank r takes those of the old rank r mod the old world size (training draws no
  random numbers; they are kept for what might).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from longctx.base.errors import UserError
from longctx.checkpoint.model import RECORD_CONFIG
from longctx.checkpoint.safe_load import load_checkpoint_file
from longctx.checkpoint.universal import zero_stage_of
from longctx.data.cache import PackedCache, cache_path
from longctx.data.reshard import CachedSource, by_dp_rank, reshard_cached, rows_consumed, rows_per_rank
from longctx.model.config import ModelConfig
from longctx.model.hf_config import config_from_hf

# the fields that change the tensors' shapes or their number: a checkpoint resumes only into these
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias",
                "qkv_bias", "qk_norm")


@dataclass(frozen=True)
class Layout:
    """How a run is spread: its ranks, their cp x dp split, the ZeRO partitioning, and the rows
    each dp rank trains per step (micro-batch x grad_accum); None: not recorded."""

    world_size: int
    cp_size: int
    dp_size: int
    zero_stage: int
    offload_optimizer: bool
    rows_per_step: Optional[int]  # per dp rank

    def placement(self) -> tuple:
        """What makes two layouts the same for a resume (rows per step aside)."""
        return self.world_size, self.cp_size, self.dp_size, self.zero_stage, self.offload_optimizer

    @property
    def global_batch(self) -> Optional[int]:
        return None if self.rows_per_step is None else self.rows_per_step * self.dp_size

    def describe(self) -> str:
        offload = ", optimizer offload" if self.offload_optimizer else ""
        return f"world {self.world_size} (cp {self.cp_size} x dp {self.dp_size}), ZeRO-{self.zero_stage}{offload}"


def engine_record(engine) -> dict:
    """What a checkpoint's trainer_state.json records of the engine, for a resume on another layout."""
    return {"zero_stage": int(engine.zero_optimization_stage()), "offload_optimizer": bool(engine.zero_cpu_offload()),
            "micro_batch_size": int(engine.train_micro_batch_size_per_gpu()),
            "grad_accum": int(engine.gradient_accumulation_steps())}


def saved_layout(trainer_state: dict, ckpt: Path, rank_states: Optional[list] = None, *,
                 current_zero: int) -> Layout:
    """The layout a checkpoint was written at. Checkpoints from before the engine was recorded:
    the ZeRO stage from the file names (those of 1 and 2 are alike: `current_zero` when it is
    one of them), the rows per step from `rank_states`' loaders when the checkpoint is inside a
    stage."""
    world = int(trainer_state["world_size"])
    cp = int(trainer_state.get("cp_size", 1))
    dp = int(trainer_state.get("dp_size", world // cp))
    zero = trainer_state.get("zero_stage")
    if zero is None:
        zero = zero_stage_of(ckpt / "ds")
        zero = current_zero if zero == 1 and current_zero in (1, 2) else zero
    rows = None
    if "micro_batch_size" in trainer_state and "grad_accum" in trainer_state:
        rows = int(trainer_state["micro_batch_size"]) * int(trainer_state["grad_accum"])
    elif (rank_states and trainer_state.get("stage_step", 0) > 0
          and trainer_state.get("data_stage") == trainer_state.get("stage")):
        old = by_dp_rank([s["data"] for s in rank_states])
        rows = rows_consumed(old) // (len(old) * int(trainer_state["stage_step"]))
    return Layout(world, cp, dp, int(zero), bool(trainer_state.get("offload_optimizer", False)), rows)


def engine_native(saved: Layout, current: Layout) -> bool:
    """DeepSpeed loads the checkpoint's own files: the same partitions (world size, ZeRO stage,
    offload), or ZeRO-0 at both ends (whole model and optimizer in one file)."""
    if saved.zero_stage == 0 and current.zero_stage == 0:
        return True
    return (saved.world_size, saved.zero_stage, saved.offload_optimizer) == (
        current.world_size, current.zero_stage, current.offload_optimizer)


def check_model_shape(ckpt: Path, trainer_state: dict, config: ModelConfig) -> None:
    """UserError naming the first shape field whose value differs between the checkpoint's model
    and this run's (a checkpoint without the record is checked by DeepSpeed's load)."""
    recorded = trainer_state.get(RECORD_CONFIG)
    if not isinstance(recorded, dict):
        return
    saved = config_from_hf(recorded, where=f"{ckpt / 'trainer_state.json'} ({RECORD_CONFIG})", any_decoder=True)
    for field in SHAPE_FIELDS:
        if getattr(saved, field, None) != getattr(config, field, None):
            raise UserError(f"checkpoint.resume: {ckpt} holds a model with {field}={getattr(saved, field)}; this run's "
                            f"model has {field}={getattr(config, field)} (a checkpoint resumes only into a model of "
                            "its shape: resume with that model, or start a new run in another out_dir)")


def check_global_batch(ckpt: Path, saved: Layout, current: Layout, *, micro_batch_size: int, grad_accum: int) -> None:
    """UserError when a resume on another dp size changes the rows per optimizer step, with the
    grad_accum (or micro-batch size) that keeps them."""
    if saved.dp_size == current.dp_size or saved.global_batch is None or saved.global_batch == current.global_batch:
        return
    want, dp = saved.global_batch, current.dp_size
    if want % (micro_batch_size * dp) == 0:
        fix = f"set train.grad_accum={want // (micro_batch_size * dp)} to keep it"
    elif want % (grad_accum * dp) == 0:
        fix = f"set data.micro_batch_size={want // (grad_accum * dp)} to keep it"
    else:
        fix = f"{want} rows do not split over {dp} data-parallel ranks"
    raise UserError(f"checkpoint.resume: {ckpt} was trained with a global batch of {want} rows per step "
                    f"({saved.dp_size} data-parallel ranks x {saved.rows_per_step}); "
                    f"this run's is {current.global_batch} "
                    f"({dp} x {micro_batch_size} micro-batch x {grad_accum} grad_accum): {fix}")


def check_resume(ckpt: Path, trainer_state: dict, *, model_config: ModelConfig, world_size: int, stage,
                 grad_accum: int, loader_continues: bool) -> None:
    """Before the engine is built: the checkpoint's model shape, and, when the stage's loader
    continues on another dp size, its global batch (UserError, one line)."""
    check_model_shape(ckpt, trainer_state, model_config)
    if not loader_continues:
        return
    cp, micro = stage.parallel.cp_size, stage.data.micro_batch_size
    current = Layout(world_size, cp, world_size // cp, 0, False, micro * grad_accum)
    saved = saved_layout(trainer_state, ckpt, current_zero=0)
    if saved.dp_size == current.dp_size:
        return
    if saved.rows_per_step is None:
        saved = saved_layout(trainer_state, ckpt, read_rank_states(ckpt, saved.world_size), current_zero=0)
    check_global_batch(ckpt, saved, current, micro_batch_size=micro, grad_accum=grad_accum)


def read_rank_states(ckpt: Path, world_size: int) -> list[dict]:
    """Every saved rank's state (data loader, RNG), in rank order."""
    states = []
    for rank in range(world_size):
        states.append(load_checkpoint_file(ckpt / f"rank_{rank:05d}.pt"))
    return states


def rng_for(states: list[dict], rank: int) -> dict:
    """The RNG states rank `rank` continues with: those of the old rank rank mod old world size."""
    return states[rank % len(states)]["rng"]


def loader_state(states: list[dict], *, dp_rank: int, dp_size: int, micro_batch_size: int,
                 fresh_loader: Callable[[], object]) -> tuple[dict, Optional[str]]:
    """The loader state of dp rank `dp_rank` of `dp_size` after the rows the saved ranks trained
    on, and a line for the console when the rows were replayed. `fresh_loader()`: this rank's
    loader of the stage, as a fresh run builds it (its caches built if they are not)."""
    old = by_dp_rank([s["data"] for s in states])
    if old[0]["dp_size"] == dp_size:
        return old[dp_rank], None
    loader = fresh_loader()
    rows = rows_per_rank(rows_consumed(old), dp_size)
    if old[0].get("cached"):
        cfg = loader.cfg
        sources = [CachedSource(PackedCache(cache_path(src, i, cfg, loader.tokenizer)).n_real, src.weight)
                   for i, src in enumerate(cfg.sources)]
        return reshard_cached(old, dp_rank=dp_rank, dp_size=dp_size, sources=sources, shuffle=cfg.shuffle,
                              epochs=cfg.epochs), None
    note = (f"data: {old[0]['dp_size']} -> {dp_size} data-parallel ranks without data.cache_dir: each loader replays "
            f"the {rows} rows its rank would have trained on so far (data.cache_dir makes this instant)")
    return replay(loader, rows, micro_batch_size), note


def replay(loader, rows: int, micro_batch_size: int) -> dict:
    """`loader`'s state after it handed out `rows` rows (whole micro-batches), fresh as it is."""
    if rows % micro_batch_size:
        raise UserError(f"data loader state: {rows} rows per rank are not whole micro-batches of {micro_batch_size}; "
                        "resume with the global batch the checkpoint was trained with")
    batches = iter(loader)
    try:
        for _ in range(rows // micro_batch_size):
            next(batches)
    except StopIteration:  # finite data that ended: the loader's state says so
        pass
    finally:
        batches.close()
    return loader.state_dict()
