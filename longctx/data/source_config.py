"""One data source's section (`data.sources[i]`): its kind, path or hub name, fields, length
limits and upsampling, what its kind resolves to, and its own checks (a file source's first
record is peeked at)."""
from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass, field
from typing import List, Optional

from longctx.base.errors import UserError
from longctx.data.peek import KIND_EXTS, list_files, peek_files
from longctx.data.synthetic_config import SyntheticConfig

# kinds a source may have; "auto" infers from path / hub_name.
FILE_KINDS = ("json", "jsonl", "parquet", "text", "arrow", "csv")
SOURCE_KINDS = ("auto", "synthetic", "hub", "disk") + FILE_KINDS
EXT_TO_KIND = {
    ".jsonl": "json", ".json": "json", ".jsonl.gz": "json", ".json.gz": "json",
    ".parquet": "parquet", ".txt": "text", ".txt.gz": "text", ".arrow": "arrow",
    ".csv": "csv",
}
SAMPLE_BY = ("line", "paragraph", "document")
PACKING_MODES = ("carry", "pad", "fit")


@dataclass
class UpsampleBucket:
    """Documents with min_tokens <= length < max_tokens are repeated `factor` times per
    epoch (fractional part: a seeded coin flip per document). factor 0 drops them."""

    min_tokens: int = 0
    max_tokens: Optional[int] = None  # null: no upper bound
    factor: float = 1.0

    def validate(self, name: str) -> None:
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise UserError(f"{name}.min_tokens: must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.max_tokens <= self.min_tokens:
            raise UserError(f"{name}.max_tokens: must be null or > min_tokens ({self.min_tokens})")
        if not math.isfinite(float(self.factor)) or float(self.factor) < 0:
            raise UserError(f"{name}.factor: must be a finite number >= 0, got {self.factor!r}")


def source_label(i: int, sources_field: str = "data.sources") -> str:
    """Source i's field path in the list `sources_field` (a stage's own: stages[1].sources)."""
    return f"{sources_field}[{i}]"


def has_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


@dataclass
class SourceConfig:
    """One data source. `kind: auto` infers it: no path and no hub_name → synthetic; a
    hub_name → hub; a directory written by `Dataset.save_to_disk` → disk; otherwise the file
    extension (.jsonl/.json/.parquet/.txt/.arrow/.csv) or, for a directory, 🤗 datasets'
    own format inference."""

    name: str = ""  # label used in logs, stats and the cache directory name
    kind: str = "auto"
    path: Optional[str] = None  # file, directory or glob
    hub_name: Optional[str] = None  # e.g. "emozilla/pg19"
    hub_config: Optional[str] = None  # the dataset's config / subset name
    split: str = "train"
    text_field: str = "text"
    sample_by: str = "document"  # text files only: "line" | "paragraph" | "document"
    weight: float = 1.0  # mixture weight (rows drawn ∝ weight)
    min_tokens: int = 0  # drop documents shorter than this (BOS/EOS included)
    max_tokens: Optional[int] = None  # drop documents longer than this
    upsample: List[UpsampleBucket] = field(default_factory=list)
    streaming: Optional[bool] = None  # null: DataConfig.streaming
    packing: Optional[str] = None  # null: DataConfig.packing
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def validate(self, i: int, seq_len: int, files: bool = True, sources_field: str = "data.sources") -> None:
        """Source `i` of the list `sources_field` names (its label in errors); file sources are peeked
        at (files=False, a dry run: a path that does not exist yet is left to training)."""
        name = source_label(i, sources_field)
        if self.kind not in SOURCE_KINDS:
            raise UserError(f"{name}.kind: {self.kind!r} is not one of {', '.join(SOURCE_KINDS)}")
        try:
            w = float(self.weight)
        except (TypeError, ValueError):
            raise UserError(f"{name}.weight: must be a number >= 0, got {self.weight!r}") from None
        if not math.isfinite(w) or w < 0:
            raise UserError(f"{name}.weight: must be a finite number >= 0, got {self.weight!r}")
        kind = self.kind
        if kind == "auto":
            kind = "hub" if self.hub_name else ("synthetic" if not self.path else "file")
        if kind == "hub":
            if not self.hub_name:
                raise UserError(f"{name}.hub_name: required for kind 'hub' (e.g. 'emozilla/pg19')")
        elif kind == "synthetic":
            self.synthetic.validate(f"{name}.synthetic", seq_len)
        elif files or self.path_exists():
            self._validate_files(i, sources_field)
        if not self.text_field:
            raise UserError(f"{name}.text_field: must name the column holding the text")
        if self.sample_by not in SAMPLE_BY:
            raise UserError(f"{name}.sample_by: {self.sample_by!r} is not one of {', '.join(SAMPLE_BY)}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise UserError(f"{name}.min_tokens: must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int)
                                            or self.max_tokens < max(1, self.min_tokens)):
            raise UserError(f"{name}.max_tokens: must be null or an integer >= min_tokens ({self.min_tokens}), "
                            f"got {self.max_tokens!r}")
        if self.packing is not None and self.packing not in PACKING_MODES:
            raise UserError(f"{name}.packing: {self.packing!r} is not one of null, {', '.join(PACKING_MODES)}")
        for j, bucket in enumerate(self.upsample):
            bucket.validate(f"{name}.upsample[{j}]")

    def path_exists(self) -> bool:
        """The path (or a match of the glob) exists; True for sources without a path."""
        if not self.path:
            return True
        path = os.path.expanduser(self.path)
        return bool(glob.glob(path, recursive=True)) if has_glob(path) else os.path.exists(path)

    def _validate_files(self, i: int, sources_field: str) -> None:
        """The path exists (or the glob matches), its format is known, its first record parses."""
        name = source_label(i, sources_field)
        if not self.path:
            raise UserError(f"{name}.path: required for kind {self.kind!r}")
        if not self.path_exists():
            missing = f"no file matches {self.path}" if has_glob(self.path) else f"{self.path} does not exist"
            raise UserError(f"{name}.path: {missing}")
        try:
            kind = resolve_kind(self, i, sources_field)
        except UserError:
            if has_glob(self.path):
                return  # a glob without a known extension: the loader infers the format per file
            raise
        if kind in KIND_EXTS:
            peek_files(list_files(self.path, kind), kind, self.text_field, name, self.path)


def resolve_kind(src: SourceConfig, i: int = 0, sources_field: str = "data.sources") -> str:
    """The concrete kind of a source (never "auto")."""
    kind = src.kind
    if kind == "jsonl":
        return "json"
    if kind != "auto":
        return kind
    if src.hub_name:
        return "hub"
    if not src.path:
        return "synthetic"
    path = os.path.expanduser(src.path)
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "state.json")) and os.path.exists(
            os.path.join(path, "dataset_info.json")
        ):
            return "disk"
        return "dir"
    lower = path.lower()
    for ext, k in EXT_TO_KIND.items():
        if lower.endswith(ext):
            return k
    raise UserError(
        f"{source_label(i, sources_field)}.path: cannot infer the format of {src.path}; set kind to one of "
        f"{', '.join(FILE_KINDS)}"
    )

