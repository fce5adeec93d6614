"""Data config: plain dataclasses the engine composes under the key `data`.

Everything here has a default, and the default needs nothing on disk: one built-in
synthetic retrieval corpus (see synthetic.py) read with the byte tokenizer. Each section's
`validate()` does its cheap checks (paths exist, weights, lengths) and raises a one-line
`UserError` naming the field. This file holds the top section, `DataConfig`, and how a config
is read into it; a source's section is source_config.py's, the synthetic corpus's
synthetic_config.py's.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import DictConfig, OmegaConf

from longctx.base.errors import UserError
from longctx.data.field_checks import check_int
from longctx.data.source_config import PACKING_MODES, SourceConfig, UpsampleBucket
from longctx.data.synthetic_config import SyntheticConfig
from longctx.data.tokenizer import check_tokenizer_spec, check_vocab, load_tokenizer

FINAL_PARTIAL = ("pad", "drop")


def _default_sources() -> List[SourceConfig]:
    # "pad": a retrieval document split across two rows would ask about a fact it cannot see.
    return [SourceConfig(name="synthetic", kind="synthetic", packing="pad")]


@dataclass
class DataConfig:
    tokenizer: str = "byte"  # "byte" | path to tokenizer.json | HF tokenizer directory
    sources: List[SourceConfig] = field(default_factory=_default_sources)
    seq_len: int = 256
    micro_batch_size: int = 8
    document_masking: bool = True  # segment ids keep packed documents from attending to each other
    cross_document_labels: bool = False  # the last token of a document predicts the next one's first
    add_bos: Optional[bool] = None  # null: as the tokenizer does (prepends_bos: never for Qwen's, which has none)
    add_eos: bool = True
    # "carry": split documents at row ends | "pad": start a new row instead | "fit": as pad, but
    # first fill the row with the longest of the next fit_lookahead documents that fits
    packing: str = "carry"
    fit_lookahead: int = 16
    final_partial: str = "pad"  # finite epochs only: last partial row "pad"ded (labels -100) or "drop"ped
    epochs: Optional[int] = None  # null: repeat forever (the trainer counts steps)
    shuffle: bool = True
    shuffle_window: int = 512  # documents tokenized and shuffled together (per rank)
    seed: Optional[int] = None  # null: the seed given to build_loader (the training seed)
    streaming: bool = False  # stream files instead of loading them (corpora larger than memory)
    cache_dir: Optional[str] = None  # tokenized+packed rows are written here once and reused
    # how long a cache build by a process on another host is waited for (its liveness cannot be
    # checked from here; a builder on this host is waited for while it lives, taken over once dead)
    cache_wait_s: float = 7200.0
    hf_cache_dir: Optional[str] = None  # 🤗 datasets' own cache (null: its default)
    emit_answer_mask: bool = False  # add `answer_mask` (labels[t] is an answer token) to batches
    prefetch: int = 2  # batches prepared ahead in a background thread (0: none)
    progress: bool = True  # progress while a cache is built (longctx/reporting/progress.py: a bar, or lines in a log)
    # resume even though a source's files changed since the checkpoint (a warning; that source
    # restarts its order from the beginning, the others continue where they were)
    allow_changed_sources: bool = False

    def validate(self, model_vocab_size: Optional[int] = None, files: bool = True,
                 sources_field: str = "data.sources") -> None:
        """With `model_vocab_size` the tokenizer is loaded (fast) and its vocab checked too;
        files=False (a dry run) leaves source paths that do not exist yet to training;
        `sources_field` names the sources in errors (a stage's own: stages[1].sources)."""
        check_int(self.seq_len, "data.seq_len", 2)
        check_int(self.micro_batch_size, "data.micro_batch_size", 1)
        check_int(self.shuffle_window, "data.shuffle_window", 1)
        check_int(self.fit_lookahead, "data.fit_lookahead", 1)
        if not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise UserError(f"data.prefetch: must be an integer >= 0, got {self.prefetch!r}")
        if self.epochs is not None:
            check_int(self.epochs, "data.epochs", 1)
        if self.seed is not None:
            check_int(self.seed, "data.seed", 0)
        wait = self.cache_wait_s
        if not (isinstance(wait, (int, float)) and math.isfinite(wait) and wait > 0):
            raise UserError(f"data.cache_wait_s: must be a finite number of seconds > 0, got {wait!r}")
        if not isinstance(self.allow_changed_sources, bool):
            raise UserError(f"data.allow_changed_sources: must be true or false, got {self.allow_changed_sources!r}")
        if self.packing not in PACKING_MODES:
            raise UserError(f"data.packing: {self.packing!r} is not one of {', '.join(PACKING_MODES)}")
        if self.final_partial not in FINAL_PARTIAL:
            raise UserError(f"data.final_partial: {self.final_partial!r} is not one of {', '.join(FINAL_PARTIAL)}")
        if not self.sources:
            raise UserError(f"{sources_field}: empty; give at least one source (or omit it for the synthetic "
                            "default)")
        for i, src in enumerate(self.sources):
            src.validate(i, self.seq_len, files, sources_field)
        weights = [float(src.weight) for src in self.sources]
        if not sum(weights) > 0:
            raise UserError(f"{sources_field}[*].weight: mixture weights must sum to a positive number, got {weights}")
        check_tokenizer_spec(self.tokenizer)
        if model_vocab_size is not None:
            check_vocab(load_tokenizer(self.tokenizer), model_vocab_size)


def validate_data_config(cfg: DataConfig, model_vocab_size: Optional[int] = None, files: bool = True,
                         sources_field: str = "data.sources") -> None:
    """`cfg.validate(...)`: the entry point of the trainer's config check and the loader."""
    cfg.validate(model_vocab_size, files, sources_field)


def _dc(cls, value, name: str):
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        try:
            return cls(**value)
        except TypeError as e:
            raise UserError(f"{name}: {e}") from None
    raise UserError(f"{name}: expected a mapping, got {type(value).__name__}")


def _normalized(cfg: DataConfig) -> DataConfig:
    """Nested plain dicts (sources, upsample buckets, synthetic) → their dataclasses."""
    sources = []
    for i, src in enumerate(cfg.sources):
        src = _dc(SourceConfig, src, f"data.sources[{i}]")
        src = dataclasses.replace(
            src,
            upsample=[_dc(UpsampleBucket, b, f"data.sources[{i}].upsample[{j}]") for j, b in enumerate(src.upsample)],
            synthetic=_dc(SyntheticConfig, src.synthetic, f"data.sources[{i}].synthetic"),
        )
        sources.append(src)
    return dataclasses.replace(cfg, sources=sources)


def as_data_config(cfg) -> DataConfig:
    """A DataConfig from a DataConfig, an omegaconf DictConfig or a plain dict."""
    if isinstance(cfg, DataConfig):
        return _normalized(cfg)
    if isinstance(cfg, DictConfig):
        obj = OmegaConf.to_object(cfg)
        if isinstance(obj, DataConfig):
            return _normalized(obj)
        cfg = obj
    if isinstance(cfg, dict):
        try:
            merged = OmegaConf.merge(OmegaConf.structured(DataConfig), cfg)
        except Exception as e:  # omegaconf's ValidationError / ConfigKeyError
            raise UserError(f"data: {str(e).splitlines()[0]}") from None
        return _normalized(OmegaConf.to_object(merged))
    raise TypeError(f"expected a DataConfig, got {type(cfg).__name__}")
