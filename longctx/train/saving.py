"""The run's checkpoints as the trainer writes them: what each records besides the engine (the
trainer state, the data sources' and the held-out rows' fingerprints, a validation a signal left
pending), never from non-finite weights, and the HF export beside them."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

from longctx.checkpoint.adapter_record import RECORD, adapter_config_record
from longctx.checkpoint.peft_export import merged_state_dict, write_adapter_dir
from longctx.checkpoint.state import TrainerState, TrainState
from longctx.checkpoint.store import rng_state, run_phase, save_checkpoint
from longctx.config import CheckpointSection, RunStage
from longctx.data.fingerprint import fingerprint_sources
from longctx.data.hf_tokenizer import TokenizerFiles
from longctx.model.hf import save_hf_weights
from longctx.parallel.zero import full_state_dict
from longctx.train.nonfinite import NonFiniteStop, weights_finite
from longctx.train.validation import Validator


class RunCheckpoints:
    """Writes this rank's part of each checkpoint of the run in `out`; `last` is the newest one
    that counts (the one resumed from until the run writes its own)."""

    def __init__(self, out: Path, section: CheckpointSection, stages: list[RunStage], validator: Validator, *,
                 tokenizer: str, world: int, rank: int, dtype, adapter=None, base: Optional[str] = None,
                 seed: int = 0):
        self.out, self.section, self.stages, self.validator = out, section, stages, validator
        self.tokenizer, self.world, self.rank, self.dtype = tokenizer, world, rank, dtype
        # train.adapter and the base it trains (model.init_from, else the preset's init from train.seed)
        self.adapter, self.base, self.seed = adapter, base, seed
        self.base_sha256: Optional[str] = None  # the frozen base (adapter_record.base_hash), set by the trainer
        self.last: Optional[Path] = None
        self._source_fingerprints: dict[int, list] = {}

    def fingerprints(self, si: int) -> list:
        """Stage si's data source fingerprints, as taken when its loader was built."""
        if si not in self._source_fingerprints:
            self._source_fingerprints[si] = fingerprint_sources(self.stages[si].data)
        return self._source_fingerprints[si]

    def write_hf(self, engine, model, path: Path) -> Optional[str]:
        """Collective: rank 0 writes the HF export; returns the agreed failure, or None. An
        adapter run's export is the merged model, with the PEFT adapter in adapter/ beside it."""
        state = full_state_dict(engine, model)  # collective under ZeRO-3

        def write() -> None:
            if self.rank != 0:
                return
            weights = state
            if self.adapter is not None:
                write_adapter_dir(state, self.adapter, model.config, path.parent / "adapter", base=self.base)
                weights = merged_state_dict(state, self.adapter)
            save_hf_weights(weights, model.config, path, tokenizer=TokenizerFiles(self.tokenizer))

        return run_phase(write)

    def save(self, engine, model, state: TrainState, loader_state: dict, *, data_stage: int, cp: int,
             pending: Optional[tuple] = None) -> None:
        """Collective: checkpoint `state.step` (the loader's position in stage `data_stage`, which
        ran at cp size `cp`; `pending`: the (stage, step) of a validation a signal stopped)."""
        if not weights_finite(model):
            kept = f"last checkpoint: {self.last}" if self.last else "no checkpoint written yet"
            raise NonFiniteStop(f"train: non-finite weights at step {state.step}; not checkpointed ({kept})",
                                state.step)
        trainer_state = TrainerState.of(state, world_size=self.world, cp_size=cp,
                                        stage_steps=[s.steps for s in self.stages], data_stage=data_stage,
                                        data_sources=self.fingerprints(data_stage), model=model.config,
                                        dtype=self.dtype, tokenizer=self.tokenizer)
        rank_state = {"data": loader_state, "rng": rng_state()}
        recorded = dict(trainer_state.state_dict(), validation_sources=self.validator.fingerprints(data_stage),
                        validation_pending=list(pending) if pending else None)
        if self.adapter is not None:
            recorded[RECORD] = dict(adapter_config_record(self.adapter), base_sha256=self.base_sha256, base=self.base,
                                    seed=self.seed)
        hf_writer = functools.partial(self.write_hf, engine, model) if self.section.save_hf else None
        self.last = save_checkpoint(self.out, state.step, engine=engine, trainer_state=recorded,
                                    rank_state=rank_state, keep_last=self.section.keep_last, hf_writer=hf_writer)
