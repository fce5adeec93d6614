"""Held-out loss by position while training runs (the `validation` section).

Each stage has a fixed held-out set: the first `validation.rows` rows of the held-out sources
(config/validation.py: disjoint from the training data), packed like training rows at the
stage's seq_len, read in the same order every time. Every validation runs them through the
training's own layout (the engine: dp x cp, any cp impl, any ZeRO stage, activation
checkpointing) under no_grad:

- dp rank r takes rows r, r + dp, ...; ranks with fewer rows run blank rows (every label
  ignored), so every rank runs the same number of forwards (ZeRO-3 gathers and cp exchanges
  inside a forward are collectives);
- each cp rank scores its zigzag shard; buckets come from the global position ids it holds;
- per bucket, (loss sum, label count) are summed over the world in one all-reduce: the
  numbers are one process's on the same rows.

A stage's rows are built at its first validation, by every rank, in the watchdog's slow phase
(`slow_phase`): tokenizing held-out files or Hub rows may take minutes, and one rank may finish
long after another. The ranks agree on the outcome before leaving the phase, so the first
forward's collectives, held to the short timeout, never wait on a peer still building, and a
failure to build is every rank's one error line.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Callable, ContextManager, Optional, Sequence

import torch

from longctx.base.errors import UserError
from longctx.base.labels import IGNORE_INDEX
from longctx.checkpoint.continuation import continue_from
from longctx.checkpoint.store import read_trainer_state, run_phase
from longctx.config.validation import SOURCES_FIELD, ValidationSection, bucket_ends, heldout_data
from longctx.data import build_loader
from longctx.data.config import DataConfig
from longctx.data.fingerprint import changed_sources, fingerprint_sources
from longctx.data.loader import ModelInputs
from longctx.data.source_config import source_label
from longctx.parallel.sharding import shard_batch
from longctx.train.positions import means_by_position, split_sums
from longctx.train.probe import ProbeItem, build_items, run_probe
from longctx.train.step import all_reduce_sum

log = logging.getLogger("longctx.train")

ROW_KEYS = ("input_ids", "labels", "position_ids", "segment_ids")


@dataclasses.dataclass(frozen=True)
class HeldOutSet:
    """One stage's held-out rows, each a (1, T) dict of model inputs at the stage's length."""
    stage: int
    seq_len: int
    ends: tuple  # the position buckets' exclusive upper ends
    rows: list


def heldout_rows(data: DataConfig, tokenizer, rows: int, document_masking: bool) -> list[dict]:
    """The first `rows` rows of `data` (heldout_data's section), whole rows (no tail cut)."""
    collate = ModelInputs(document_masking, trim_multiple=data.seq_len)  # full rows: cp divides them
    batches = iter(build_loader(data, tokenizer, dp_rank=0, dp_size=1, seed=data.seed, collate=collate))
    return [{k: v for k, v in next(batches).items() if k in ROW_KEYS} for _ in range(rows)]


def rank_batches(rows: list[dict], dp_rank: int, dp_size: int, batch_size: int) -> list[dict]:
    """This dp rank's rows (r, r + dp, ...) in batches of `batch_size`, filled up with blank
    rows to ceil(rows / dp): the same number of batches of the same sizes on every rank."""
    per_rank = -(-len(rows) // dp_size)
    mine = rows[dp_rank::dp_size]
    blank = dict(rows[0], labels=torch.full_like(rows[0]["labels"], IGNORE_INDEX))
    mine = mine + [blank] * (per_rank - len(mine))
    return [{k: torch.cat([row[k] for row in mine[i:i + batch_size]]) for k in mine[0]}
            for i in range(0, per_rank, batch_size)]


@torch.no_grad()
def heldout_sums(forward: Callable, batches: list[dict], loss_buckets: torch.Tensor, *, cp_rank: int,
                 cp_size: int, device: torch.device, loss_chunk_size: int,
                 stop: Optional[Callable[[], bool]] = None) -> Optional[torch.Tensor]:
    """This rank's (2, K) float64 loss and label-count sums by position bucket over `batches`
    (each cut to its cp shard here); `forward` is the engine or the model. None when `stop`
    (collective, asked between batches: every rank runs the same batches) agreed to stop."""
    total = torch.zeros(2, loss_buckets.numel(), dtype=torch.float64, device=device)  # (2, K)
    for k, batch in enumerate(batches):
        if k > 0 and stop is not None and stop():
            return None
        inputs = {k: v.to(device) for k, v in batch.items()}  # (B, T)
        if cp_size > 1:
            inputs = shard_batch(inputs, cp_rank, cp_size)  # (B, T / cp), global position ids
        _, _, by_bucket = forward(inputs["input_ids"], position_ids=inputs["position_ids"],
                                  segment_ids=inputs.get("segment_ids"), labels=inputs["labels"],
                                  loss_chunk_size=loss_chunk_size, loss_buckets=loss_buckets)
        total += by_bucket.to(torch.float64)
    return total


def validation_record(flat: list, ends: tuple) -> dict:
    """val_loss (token-weighted mean), val_loss_by_position, val_tokens from world sums."""
    sums, counts = split_sums(flat, len(ends))
    tokens = sum(counts)
    return {"val_loss": sum(sums) / tokens if tokens > 0 else None,
            "val_loss_by_position": means_by_position(sums, counts, ends), "val_tokens": int(round(tokens))}


class Validator:
    """The trainer's validations: builds each stage's held-out set once, runs it, returns the row."""

    def __init__(self, section: ValidationSection, stages, *, loss_chunk_size: int, originals: Sequence[int],
                 multiples: Sequence[int]):
        """originals: each stage's original model context (the probe's default length);
        multiples: each stage's row length multiple (config.run_plan.trim_multiple)."""
        self.section, self.stages = section, stages
        self.loss_chunk_size = loss_chunk_size
        self.originals, self.multiples = list(originals), list(multiples)
        self._sets: dict[int, HeldOutSet] = {}
        self._probes: dict[int, list] = {}

    def due(self, step: int, stage_done: bool) -> bool:
        return self.section.enabled and (step % self.section.every == 0 or stage_done)

    def data(self, si: int) -> DataConfig:
        """Stage si's held-out data section (its identity is in every checkpoint of the stage)."""
        return heldout_data(self.section, self.stages[si].data, [s.data for s in self.stages])

    def heldout(self, si: int, tokenizer) -> HeldOutSet:
        if si not in self._sets:
            stage = self.stages[si]
            rows = heldout_rows(self.data(si), tokenizer, self.section.rows, stage.data.document_masking)
            self._sets[si] = HeldOutSet(si, stage.seq_len, tuple(bucket_ends(self.section.buckets, stage.seq_len)),
                                        rows)
        return self._sets[si]

    def prepare(self, si: int, tokenizer, slow_phase: Callable[[str], ContextManager]) -> None:
        """Collective: stage si's held-out set built (once) inside `slow_phase("validation rows")`,
        every rank agreeing on the outcome before the phase ends; a failure on any rank is every
        rank's UserError (the first failing rank's line)."""
        if si in self._sets:
            return  # every rank built it at the same validation
        with slow_phase("validation rows"):
            problem = run_phase(lambda: self.heldout(si, tokenizer))
        if problem:
            raise UserError(problem.split(": ", 1)[1])  # the line itself, without "rank r: "

    def probe_items(self, si: int, tokenizer) -> list[ProbeItem]:
        """Stage si's probe rows (empty without a probe), built once."""
        probe = self.section.probe
        if si not in self._probes:
            stage = self.stages[si]
            self._probes[si] = build_items(probe, probe.stage_lengths(stage.seq_len, self.originals[si]), tokenizer,
                                           seq_len=stage.seq_len, multiple=self.multiples[si]) if probe.enabled else []
        return self._probes[si]

    def run(self, engine, mesh, device: torch.device, si: int, step: int, tokenizer,
            stop: Optional[Callable[[], bool]] = None,
            slow_phase: Callable[[str], ContextManager] = lambda phase: contextlib.nullcontext()) -> Optional[dict]:
        """Collective: one validation of stage si at `step`; the row validation.jsonl gets, or
        None when `stop` (asked between its forwards) agreed to stop: nothing of it is kept.
        `slow_phase`: the watchdog's, for building the rows (prepare)."""
        t0 = time.perf_counter()
        self.prepare(si, tokenizer, slow_phase)
        held = self.heldout(si, tokenizer)
        batches = rank_batches(held.rows, mesh.dp_rank, mesh.dp_size, self.stages[si].data.micro_batch_size)
        ends = torch.tensor(held.ends, dtype=torch.long, device=device)
        local = heldout_sums(engine, batches, ends, cp_rank=mesh.cp_rank, cp_size=mesh.cp_size, device=device,
                             loss_chunk_size=self.loss_chunk_size, stop=stop)
        if local is None:
            return None
        record = validation_record(all_reduce_sum(local.flatten()), held.ends)
        items = self.probe_items(si, tokenizer)
        if items:
            if stop is not None and stop():
                return None
            t1 = time.perf_counter()
            pad = getattr(tokenizer, "pad_id", None)
            scored = run_probe(engine, items, mesh, device, 0 if pad is None else pad, stop)
            if scored is None:
                return None
            record.update(probe=scored[0], probe_token_accuracy=scored[1], probe_samples=self.section.probe.samples,
                          probe_time_s=time.perf_counter() - t1)
        return {"step": step, "stage": si, "seq_len": held.seq_len, **record, "val_rows": len(held.rows),
                "val_time_s": time.perf_counter() - t0}

    def fingerprints(self, si: int) -> Optional[list]:
        return fingerprint_sources(self.data(si)) if self.section.enabled else None


def check_resumed_heldout(resume_from: Optional[Path], stages, validator: Validator, allow_changed: bool) -> None:
    """The resumed stage's held-out sources against what its checkpoint recorded: a change would
    make the validation rows before and after the resume measure different documents, so it
    stops the run (UserError on every rank) unless data.allow_changed_sources (a warning)."""
    if resume_from is None or not validator.section.enabled:
        return
    saved = read_trainer_state(resume_from)
    recorded = saved.get("validation_sources")
    continuation = continue_from(saved, stages)
    if recorded is None or continuation.stage != saved.get("data_stage"):
        return  # the checkpoint had no validation, or the run continues with another stage's set
    current = validator.fingerprints(continuation.stage)
    if len(recorded) != len(current):
        changes = {0: f"{len(recorded)} held-out sources in the checkpoint, {len(current)} now"}
    else:
        changes = changed_sources(recorded, current)
    if not changes:
        return
    i, what = next(iter(changes.items()))
    line = f"{source_label(i, SOURCES_FIELD)} changed since the checkpoint: {what}"
    if not allow_changed:
        raise UserError(f"{line}; validation rows before and after the resume would score different documents: "
                        "resume with the held-out data the checkpoint recorded, or set "
                        "data.allow_changed_sources=true to continue")
    log.warning("%s; continuing (data.allow_changed_sources=true): later validation rows score the new set", line)
