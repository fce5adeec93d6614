"""The `validation` section: held-out loss by position every `every` steps (longctx/train/validation.py).

The held-out set is disjoint from the training data by construction, checked here before
anything runs:
- the default (no `validation.sources`) exists only when every training source of every stage
  is synthetic: the same corpus settings under a corpus seed no training source uses. A
  synthetic document is a function of (corpus seed, index), so no training document is drawn;
- a synthetic validation source may not use a training source's corpus seed;
- a file validation source may not read a file any training source reads (same path or same
  SHA-256 content), a hub one not a training source's (dataset, config, split).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from longctx.base.errors import UserError
from longctx.config.probe import ProbeSection
from longctx.data.config import DataConfig, as_data_config
from longctx.data.source_config import SourceConfig, resolve_kind, source_label

SOURCES_FIELD = "validation.sources"
MAX_DEFAULT_BUCKETS = 8  # default buckets: powers of two, the first at seq_len / 2^7


@dataclass
class ValidationSection:
    every: int = 0  # steps between validations (and at each stage's end); 0: no validation at all
    rows: int = 8  # held-out rows per validation, at the stage's seq_len (the same rows every time)
    # ascending exclusive upper ends of the position buckets; positions past the last one form a
    # final bucket up to seq_len. null: powers of two up to the stage's seq_len (8 buckets at most)
    buckets: Optional[List[int]] = None
    # held-out documents, given like data.sources; null: the synthetic training corpus under a
    # seed of its own (only when all training data is synthetic)
    sources: Optional[List[SourceConfig]] = None
    seed: int = 0  # the held-out rows' order
    probe: ProbeSection = field(default_factory=ProbeSection)  # teacher-forced retrieval probe (config/probe.py)

    def validate(self) -> None:
        """The section's own fields (any machine, any world size)."""
        for name, minimum in (("every", 0), ("rows", 1), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise UserError(f"validation.{name}: must be an integer >= {minimum}, got {value!r}")
        if self.buckets is not None:
            edges = list(self.buckets)
            if not edges or any(not isinstance(e, int) or isinstance(e, bool) or e < 1 for e in edges):
                raise UserError(f"validation.buckets: must be null or a list of integer positions >= 1, got {edges}")
            if any(b <= a for a, b in zip(edges, edges[1:])):
                raise UserError(f"validation.buckets: must be strictly increasing, got {edges}")
        if self.sources is not None and not self.sources:
            raise UserError(f"{SOURCES_FIELD}: empty; give at least one source, or null for the default "
                            "(the synthetic training corpus under a held-out seed)")
        self.probe.validate(self.every)

    @property
    def enabled(self) -> bool:
        return self.every > 0


def bucket_ends(buckets: Optional[Sequence[int]], seq_len: int) -> List[int]:
    """The exclusive upper ends of the position buckets at `seq_len`, the last one seq_len."""
    if buckets is None:
        first = 1  # the smallest power of two with first x 2^7 >= seq_len: at most 8 buckets
        while first << (MAX_DEFAULT_BUCKETS - 1) < seq_len:
            first *= 2
        ends = []
        while first < seq_len:
            ends.append(first)
            first *= 2
    else:
        ends = [e for e in buckets if e < seq_len]
    return ends + [seq_len]


def bucket_labels(ends: Sequence[int]) -> List[str]:
    """'0-1024', '1024-2048', ...: each bucket's positions as [start, end)."""
    return [f"{a}-{b}" for a, b in zip([0, *ends[:-1]], ends)]


def check_buckets(section: ValidationSection, stages) -> None:
    """validation.buckets fit every stage's length (portable: no file)."""
    if section.buckets is None:
        return
    for stage in stages:
        if section.buckets[-1] > stage.seq_len:
            raise UserError(f"validation.buckets: {section.buckets[-1]} is beyond the length of stage {stage.index} "
                            f"({stage.field_names['seq_len']}={stage.seq_len}); give positions <= {stage.seq_len}")


def _synthetic_seeds(data: DataConfig) -> dict:
    """{corpus seed: its source's field name} of the synthetic sources of one stage's data."""
    return {src.synthetic.seed: i for i, src in enumerate(data.sources) if resolve_kind(src, i) == "synthetic"}


def heldout_data(section: ValidationSection, stage_data: DataConfig, training: Sequence[DataConfig]) -> DataConfig:
    """The data section that reads one stage's held-out rows: the stage's packing and tokenizer,
    the validation sources (or the default), one row per batch, a fixed order, no cache."""
    if section.sources is not None:
        sources = [dataclasses.replace(s) for s in as_data_config(
            dataclasses.replace(stage_data, sources=list(section.sources))).sources]
    else:
        used = {seed for data in training for seed in _synthetic_seeds(data)}
        sources = []
        for src in stage_data.sources:
            seed = src.synthetic.seed + 1
            while seed in used:
                seed += 1
            used.add(seed)
            sources.append(dataclasses.replace(src, synthetic=dataclasses.replace(src.synthetic, seed=seed)))
    return dataclasses.replace(stage_data, sources=sources, micro_batch_size=1, shuffle=True, seed=section.seed,
                               epochs=None, cache_dir=None, prefetch=0, allow_changed_sources=False)


def check_heldout(section: ValidationSection, stages, files: bool = True) -> None:
    """The held-out sources exist for every stage and share nothing with any training source."""
    training = [stage.data for stage in stages]
    if section.sources is None:
        for stage in stages:
            for i, src in enumerate(stage.data.sources):
                if resolve_kind(src, i) != "synthetic":
                    raise UserError(f"{SOURCES_FIELD}: required when training reads files or hub datasets "
                                    f"({source_label(i, stage.field_names['sources'])} is {src.path or src.hub_name});"
                                    " give held-out documents that are not in the training data")
        return
    data = as_data_config(dataclasses.replace(stages[0].data, sources=list(section.sources)))
    for stage in stages:
        for i, src in enumerate(data.sources):
            src.validate(i, stage.seq_len, files, SOURCES_FIELD)
    for i, src in enumerate(data.sources):
        _check_disjoint(src, i, training, files)


def _check_disjoint(src: SourceConfig, i: int, training: Sequence[DataConfig], files: bool) -> None:
    from longctx.data.fingerprint import file_digest, source_files  # hashing: only when files are checked

    name = source_label(i, SOURCES_FIELD)
    kind = resolve_kind(src, i, SOURCES_FIELD)
    for data in training:
        for j, train_src in enumerate(data.sources):
            train_kind = resolve_kind(train_src, j)
            where = f"training source {train_src.name or train_src.path or train_src.hub_name or j}"
            if kind == "synthetic" and train_kind == "synthetic" and src.synthetic.seed == train_src.synthetic.seed:
                raise UserError(f"{name}.synthetic.seed: {src.synthetic.seed} is the corpus seed of {where}: its "
                                "documents are training documents; use another seed")
            if kind == "hub" and train_kind == "hub" and (src.hub_name, src.hub_config, src.split) == (
                    train_src.hub_name, train_src.hub_config, train_src.split):
                raise UserError(f"{name}.hub_name: {src.hub_name} ({src.split}) is {where}; hold out another split")
            if not files or kind in ("synthetic", "hub") or train_kind in ("synthetic", "hub"):
                continue
            if not (src.path_exists() and train_src.path_exists()):
                continue
            mine = {os.path.realpath(f): f for f, _ in source_files(src, i)}
            theirs = [f for f, _ in source_files(train_src, j)]
            for f in theirs:
                if os.path.realpath(f) in mine:
                    raise UserError(f"{name}.path: {f} is read by {where}; held-out documents must not be trained on")
            digests = {file_digest(f): f for f in theirs}
            for f in mine.values():
                if file_digest(f) in digests:
                    raise UserError(f"{name}.path: {f} has the same content as {digests[file_digest(f)]}, read by "
                                    f"{where}; held-out documents must not be trained on")
