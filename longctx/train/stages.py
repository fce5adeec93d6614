"""Each stage's data: its loader (its data section, its own seed) and the check that its sources
are readable before the run directory is touched."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

from longctx.config import RunStage
from longctx.data import build_loader
from longctx.data.check import check_data
from longctx.data.loader import ModelInputs
from longctx.data.source_config import resolve_kind


def build_stage_loader(stage: RunStage, train_seed: int, tokenizer, *, dp_rank: int, dp_size: int,
                       collate: Optional[ModelInputs] = None):
    """The loader of a resolved stage: its data section (seq_len, sources, answer masks when
    answer tokens are weighted) and a seed of its own (train.seed + 1000 x the stage index)."""
    return build_loader(stage.data, tokenizer, dp_rank=dp_rank, dp_size=dp_size,
                        seed=train_seed + 1000 * stage.index, collate=collate)


def check_sources(stages: list[RunStage]) -> None:
    """check_data on each distinct data section of the stages, without 🤗 datasets' progress
    bars (a refusal is one line)."""
    sections = []
    for stage in stages:
        if stage.data not in sections:
            sections.append(stage.data)
    for data in sections:
        with _quiet_datasets(any(resolve_kind(src, i) != "synthetic" for i, src in enumerate(data.sources))):
            check_data(data)


@contextmanager
def _quiet_datasets(reads_files: bool):
    """🤗 datasets' progress bars off while a section that reads files is checked. Only such a
    section imports datasets (seconds to import, and not installed everywhere: a synthetic run
    never needs it)."""
    if not reads_files:
        yield
        return
    import datasets  # lazy: see the docstring

    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.enable_progress_bars()
