"""Data config: plain dataclasses the engine composes under the key `data`.

Everything here has a default, and the default needs nothing on disk: one built-in
synthetic retrieval corpus (see synthetic.py) read with the byte tokenizer. Each section's
`validate()` does its cheap checks (paths exist, weights, lengths) and raises a one-line
`UserError` naming the field.
"""
from __future__ import annotations

import dataclasses
import glob
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from longctx.base.errors import UserError
from longctx.data.filler import FILLER_KINDS
from longctx.data.peek import KIND_EXTS, list_files, peek_files
from longctx.data.templates import STYLES, min_document_chars
from longctx.data.tokenizer import check_tokenizer_spec, check_vocab, load_tokenizer

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
FINAL_PARTIAL = ("pad", "drop")
SYNTHETIC_TASKS = ("niah", "multivalue", "passkey", "recall")
DEFAULT_TASKS = {"niah": 0.6, "multivalue": 0.2, "passkey": 0.2}
# a task whose document does not fit the row falls back along this chain (longest first);
# recall documents shrink with the row, so recall has no fallback
FALLBACK_ORDER = ("multivalue", "niah", "passkey")


def fallback_chain(task: str) -> Tuple[str, ...]:
    """The task itself, then the shorter tasks it falls back to."""
    return FALLBACK_ORDER[FALLBACK_ORDER.index(task):] if task in FALLBACK_ORDER else (task,)


def _pos_int(value, name: str, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise UserError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def _probability(value, name: str) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 <= value <= 1):
        raise UserError(f"{name}: must be a probability in [0, 1], got {value!r}")


@dataclass
class SyntheticConfig:
    """The built-in retrieval corpus (format documented in docs/data.md).

    Document i is a pure function of (seed, i): the same corpus on every machine and rank.
    Lengths are in tokens of the loader's tokenizer (bytes for the byte tokenizer), BOS/EOS
    included, so `length_max: null` (= seq_len) makes every document fit one row.
    """

    num_docs: int = 20000  # documents per epoch
    seed: int = 1234  # corpus seed (independent of the training seed)
    length_min: Optional[int] = None  # null: length_min_ratio x seq_len
    # the shortest document as a fraction of seq_len when length_min is null; near 1 packs every
    # document full of needles (distractors fit only in long documents)
    length_min_ratio: float = 0.5
    length_max: Optional[int] = None  # null: seq_len
    num_keys: int = 4  # needles with distinct keys per niah/multivalue document (1 queried)
    num_values: int = 2  # values of the queried key in a multivalue document
    # questions per niah document: the first queries-1 distractor keys are asked (and answered)
    # before the final question, so one document holds several key-matching examples;
    # questions that do not fit the document's length are left out
    queries: int = 1
    # probability that a recall key has num_values values (asked as one list in text order):
    # the multivalue skill, "the next value of this key", drilled densely
    recall_multivalue: float = 0.0
    # probability that a niah/multivalue/passkey document puts each needle on a line of its own
    # (a newline before and after instead of a space), the way RULER's niah haystacks separate
    # their units; the text is otherwise the same document, character for character
    line_breaks: float = 0.0
    value_digits: int = 7
    distance_min: Optional[int] = None  # tokens between the queried needle and the question
    distance_max: Optional[int] = None  # null: anywhere in the document
    filler: str = "mixed"  # "noise" (RULER's repeated sentences) | "varied" | "mixed"
    style: str = "compact"  # "compact" (RULER's needles, the eval suite's compact question) | "ruler" | "short"
    # task mix; null means DEFAULT_TASKS (a null schema default: a config's `tasks` then
    # replaces the mix instead of being merged into it key by key)
    tasks: Optional[Dict[str, float]] = None

    def task_mix(self) -> Dict[str, float]:
        """{task: weight}: `tasks`, or DEFAULT_TASKS when unset."""
        return dict(self.tasks) if self.tasks else dict(DEFAULT_TASKS)

    def length_bounds(self, seq_len: int) -> Tuple[int, int]:
        """(length_min, length_max) in tokens for rows of seq_len, nulls resolved."""
        lo = self.length_min if self.length_min is not None else max(1, int(seq_len * self.length_min_ratio))
        hi = self.length_max if self.length_max is not None else seq_len
        return lo, hi

    def validate(self, name: str, seq_len: int) -> None:
        """`name`: where this section sits (e.g. data.sources[0].synthetic)."""
        for count in ("num_docs", "num_keys", "num_values", "queries", "value_digits"):
            _pos_int(getattr(self, count), f"{name}.{count}")
        _probability(self.recall_multivalue, f"{name}.recall_multivalue")
        _probability(self.line_breaks, f"{name}.line_breaks")
        if not (isinstance(self.length_min_ratio, (int, float)) and 0 < self.length_min_ratio <= 1):
            raise UserError(f"{name}.length_min_ratio: must be in (0, 1], got {self.length_min_ratio!r}")
        lo, hi = self.length_bounds(seq_len)
        if lo < 1 or hi < lo:
            raise UserError(f"{name}.length_min/length_max: need 1 <= length_min <= length_max, got {lo}..{hi}")
        if self.filler not in FILLER_KINDS:
            raise UserError(f"{name}.filler: {self.filler!r} is not one of {', '.join(FILLER_KINDS)}")
        if self.style not in STYLES:
            raise UserError(f"{name}.style: {self.style!r} is not one of {', '.join(STYLES)}")
        self._validate_tasks(name, hi)
        for which in ("distance_min", "distance_max"):
            v = getattr(self, which)
            if v is not None and (not isinstance(v, int) or v < 0):
                raise UserError(f"{name}.{which}: must be null or an integer >= 0, got {v!r}")
        if self.distance_min is not None and self.distance_max is not None:
            if self.distance_max < self.distance_min:
                raise UserError(f"{name}.distance_max: must be >= distance_min ({self.distance_min})")

    def _validate_tasks(self, name: str, length_max: int) -> None:
        """Known tasks, usable weights, and each task (or its fallback) fits length_max."""
        tasks = self.task_mix()
        bad = [t for t in tasks if t not in SYNTHETIC_TASKS]
        if bad:
            raise UserError(f"{name}.tasks: unknown task {bad[0]!r}; valid: {', '.join(SYNTHETIC_TASKS)}")
        total = sum(float(w) for w in tasks.values())
        if not tasks or any(float(w) < 0 for w in tasks.values()) or not total > 0:
            raise UserError(f"{name}.tasks: weights must be >= 0 and sum to a positive number")
        # a task too long for length_max falls back to a shorter one (multivalue → niah →
        # passkey); it is an error only when even the fallback does not fit
        need = {t: min_document_chars(self, t, self.style) + 2 for t in SYNTHETIC_TASKS}  # + BOS/EOS
        weighted = [t for t, w in tasks.items() if float(w) > 0]

        def failing(needs: dict) -> list:
            return [t for t in weighted if not any(needs[f] <= length_max for f in fallback_chain(t))]

        too_long = failing(need)
        if too_long:
            task = too_long[0]
            short = {t: min_document_chars(self, t, "short") + 2 for t in SYNTHETIC_TASKS}
            fixes = ["style 'short'"] if self.style != "short" and not failing(short) else []
            fixes.append(f"length_max >= {max(need[t] for t in too_long)}")
            kept = [t for t in weighted if t not in too_long]
            fitting = [t for t in SYNTHETIC_TASKS if need[t] <= length_max]
            if kept:
                fixes.append(f"{name}.tasks without {', '.join(map(repr, too_long))}")
            elif fitting:
                fixes.append(f"{name}.tasks of {', '.join(map(repr, fitting))} only")
            raise UserError(
                f"{name}.length_max: {length_max} tokens is too short for a {task!r} document in style "
                f"{self.style!r} (needs ~{need[task]}); use " + (" or ".join(fixes) if len(fixes) < 3 else
                                                                 ", ".join(fixes[:-1]) + ", or " + fixes[-1])
            )


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
        _pos_int(self.seq_len, "data.seq_len", 2)
        _pos_int(self.micro_batch_size, "data.micro_batch_size", 1)
        _pos_int(self.shuffle_window, "data.shuffle_window", 1)
        _pos_int(self.fit_lookahead, "data.fit_lookahead", 1)
        if not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise UserError(f"data.prefetch: must be an integer >= 0, got {self.prefetch!r}")
        if self.epochs is not None:
            _pos_int(self.epochs, "data.epochs", 1)
        if self.seed is not None:
            _pos_int(self.seed, "data.seed", 0)
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
