"""Data config: plain dataclasses the engine composes under the key `data`.

Everything here has a default, and the default needs nothing on disk: one built-in
synthetic retrieval corpus (see synthetic.py) read with the byte tokenizer.
`validate_data_config` does the cheap checks (paths exist, weights, lengths) and raises a
one-line `UserError` naming the field.
"""
from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from longctx.data.peek import KIND_EXTS, list_files, peek_files
from longctx.errors import UserError

# kinds a source may have; "auto" infers from path / hub_name.
FILE_KINDS = ("json", "jsonl", "parquet", "text", "arrow", "csv")
SOURCE_KINDS = ("auto", "synthetic", "hub", "disk") + FILE_KINDS
PACKING_MODES = ("carry", "pad", "fit")
FINAL_PARTIAL = ("pad", "drop")
SYNTHETIC_TASKS = ("niah", "multivalue", "passkey", "recall")
# a task whose document does not fit the row falls back along this chain (longest first);
# recall documents shrink with the row, so recall has no fallback
FALLBACK_ORDER = ("multivalue", "niah", "passkey")


def fallback_chain(task: str) -> Tuple[str, ...]:
    """The task itself, then the shorter tasks it falls back to."""
    return FALLBACK_ORDER[FALLBACK_ORDER.index(task):] if task in FALLBACK_ORDER else (task,)
EXT_TO_KIND = {
    ".jsonl": "json", ".json": "json", ".jsonl.gz": "json", ".json.gz": "json",
    ".parquet": "parquet", ".txt": "text", ".txt.gz": "text", ".arrow": "arrow",
    ".csv": "csv",
}


DEFAULT_TASKS = {"niah": 0.6, "multivalue": 0.2, "passkey": 0.2}


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
    # probability that a niah document puts its answered questions inside the text, each at a
    # random point after its needle, instead of as a block before the final question: a block
    # teaches "the nearest key-value statement (the previous answer) is never the one asked",
    # and an extended model then avoids a needle right before the question
    inline_queries: float = 0.0
    # probability that a distractor key shares a word (the adjective or the noun, evenly) with
    # the queried key: hard negatives, so that matching only part of the key does not pay
    hard_keys: float = 0.0
    # probability that a recall key has num_values values (asked as one list in text order):
    # the multivalue skill, "the next value of this key", drilled densely
    recall_multivalue: float = 0.0
    # probability that a niah/multivalue/passkey document puts each needle on a line of its own
    # (a newline before and after instead of a space), the way RULER's niah haystacks separate
    # their units; the text is otherwise the same document, character for character
    line_breaks: float = 0.0
    # the answer mask also covers the separator after each answered value ("," or "."): the
    # token that decides whether a list goes on or the answer ends (a model trained on value
    # digits only answers multivalue's plural question with one value and a ".")
    answer_separators: bool = False
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


@dataclass
class UpsampleBucket:
    """Documents with min_tokens <= length < max_tokens are repeated `factor` times per
    epoch (fractional part: a seeded coin flip per document). factor 0 drops them."""

    min_tokens: int = 0
    max_tokens: Optional[int] = None  # null: no upper bound
    factor: float = 1.0


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
    add_bos: bool = True
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
    cache_wait_s: float = 7200.0  # how long other ranks wait for the rank building the cache
    hf_cache_dir: Optional[str] = None  # 🤗 datasets' own cache (null: its default)
    emit_answer_mask: bool = False  # add `answer_mask` (labels[t] is an answer token) to batches
    prefetch: int = 2  # batches prepared ahead in a background thread (0: none)
    progress: bool = True  # tqdm bar while a cache is built


# --------------------------------------------------------------------------- validation


def source_label(i: int) -> str:
    return f"data.sources[{i}]"


def has_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def resolve_kind(src: SourceConfig, i: int = 0) -> str:
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
        f"{source_label(i)}.path: cannot infer the format of {src.path}; set kind to one of "
        f"{', '.join(FILE_KINDS)}"
    )


def _check_path(src: SourceConfig, i: int) -> None:
    path = os.path.expanduser(src.path)
    if has_glob(path):
        if not glob.glob(path, recursive=True):
            raise UserError(f"{source_label(i)}.path: no file matches {src.path}")
    elif not os.path.exists(path):
        raise UserError(f"{source_label(i)}.path: {src.path} does not exist")


def _peek(src: SourceConfig, i: int) -> None:
    """The first record of a file source: non-empty, parses, has text_field (peek.py)."""
    try:
        kind = resolve_kind(src, i)
    except UserError:
        if has_glob(src.path):
            return  # a glob without a known extension: the loader infers the format per file
        raise
    if kind in KIND_EXTS:
        peek_files(list_files(src.path, kind), kind, src.text_field, source_label(i), src.path)


def _pos_int(value, name: str, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise UserError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def _probability(value, name: str) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 <= value <= 1):
        raise UserError(f"{name}: must be a probability in [0, 1], got {value!r}")


def validate_synthetic(syn: SyntheticConfig, name: str, seq_len: int) -> None:
    _pos_int(syn.num_docs, f"{name}.num_docs")
    _pos_int(syn.num_keys, f"{name}.num_keys")
    _pos_int(syn.num_values, f"{name}.num_values")
    _pos_int(syn.queries, f"{name}.queries")
    _pos_int(syn.value_digits, f"{name}.value_digits")
    _probability(syn.hard_keys, f"{name}.hard_keys")
    _probability(syn.recall_multivalue, f"{name}.recall_multivalue")
    _probability(syn.line_breaks, f"{name}.line_breaks")
    _probability(syn.inline_queries, f"{name}.inline_queries")
    if not (isinstance(syn.length_min_ratio, (int, float)) and 0 < syn.length_min_ratio <= 1):
        raise UserError(f"{name}.length_min_ratio: must be in (0, 1], got {syn.length_min_ratio!r}")
    lo, hi = syn.length_bounds(seq_len)
    if lo < 1 or hi < lo:
        raise UserError(f"{name}.length_min/length_max: need 1 <= length_min <= length_max, got {lo}..{hi}")
    if syn.filler not in ("noise", "varied", "mixed"):
        raise UserError(f"{name}.filler: {syn.filler!r} is not one of noise, varied, mixed")
    if syn.style not in ("ruler", "compact", "short"):
        raise UserError(f"{name}.style: {syn.style!r} is not one of ruler, compact, short")
    tasks = syn.task_mix()
    bad = [t for t in tasks if t not in SYNTHETIC_TASKS]
    if bad:
        raise UserError(f"{name}.tasks: unknown task {bad[0]!r}; valid: {', '.join(SYNTHETIC_TASKS)}")
    total = sum(float(w) for w in tasks.values())
    if not tasks or any(float(w) < 0 for w in tasks.values()) or not total > 0:
        raise UserError(f"{name}.tasks: weights must be >= 0 and sum to a positive number")
    from longctx.data.synthetic import min_document_chars

    # a task too long for length_max falls back to a shorter one (multivalue → niah →
    # passkey); it is an error only when even the fallback does not fit
    fits = {t: min_document_chars(syn, t, syn.style) + 2 <= hi for t in SYNTHETIC_TASKS}
    for task, w in tasks.items():
        if float(w) > 0 and not any(fits[t] for t in fallback_chain(task)):
            need = min_document_chars(syn, task, syn.style) + 2  # BOS/EOS
            fixes = ("style 'short', " if syn.style != "short" and task != "recall" else "") + f"length_max >= {need}, or {name}.tasks without {task!r}"
            raise UserError(
                f"{name}.length_max: {hi} tokens is too short for a {task!r} document in style "
                f"{syn.style!r} (needs ~{need}); use {fixes}"
            )
    for which in ("distance_min", "distance_max"):
        v = getattr(syn, which)
        if v is not None and (not isinstance(v, int) or v < 0):
            raise UserError(f"{name}.{which}: must be null or an integer >= 0, got {v!r}")
    if syn.distance_min is not None and syn.distance_max is not None:
        if syn.distance_max < syn.distance_min:
            raise UserError(f"{name}.distance_max: must be >= distance_min ({syn.distance_min})")


def validate_data_config(cfg: DataConfig, model_vocab_size: Optional[int] = None) -> None:
    """Cheap checks of a DataConfig; raises UserError with one line naming the field.

    With `model_vocab_size` the tokenizer is loaded (fast) and its vocab checked too."""
    _pos_int(cfg.seq_len, "data.seq_len", 2)
    _pos_int(cfg.micro_batch_size, "data.micro_batch_size", 1)
    _pos_int(cfg.shuffle_window, "data.shuffle_window", 1)
    _pos_int(cfg.fit_lookahead, "data.fit_lookahead", 1)
    if not isinstance(cfg.prefetch, int) or cfg.prefetch < 0:
        raise UserError(f"data.prefetch: must be an integer >= 0, got {cfg.prefetch!r}")
    if cfg.epochs is not None:
        _pos_int(cfg.epochs, "data.epochs", 1)
    if cfg.seed is not None:
        _pos_int(cfg.seed, "data.seed", 0)
    if not (isinstance(cfg.cache_wait_s, (int, float)) and math.isfinite(cfg.cache_wait_s) and cfg.cache_wait_s > 0):
        raise UserError(f"data.cache_wait_s: must be a finite number of seconds > 0, got {cfg.cache_wait_s!r}")
    if cfg.packing not in PACKING_MODES:
        raise UserError(f"data.packing: {cfg.packing!r} is not one of {', '.join(PACKING_MODES)}")
    if cfg.final_partial not in FINAL_PARTIAL:
        raise UserError(
            f"data.final_partial: {cfg.final_partial!r} is not one of {', '.join(FINAL_PARTIAL)}"
        )
    if not cfg.sources:
        raise UserError("data.sources: empty; give at least one source (or omit it for the synthetic default)")
    weights = []
    for i, src in enumerate(cfg.sources):
        name = source_label(i)
        if src.kind not in SOURCE_KINDS:
            raise UserError(f"{name}.kind: {src.kind!r} is not one of {', '.join(SOURCE_KINDS)}")
        try:
            w = float(src.weight)
        except (TypeError, ValueError):
            raise UserError(f"{name}.weight: must be a number >= 0, got {src.weight!r}") from None
        if not math.isfinite(w) or w < 0:
            raise UserError(f"{name}.weight: must be a finite number >= 0, got {src.weight!r}")
        weights.append(w)
        kind = src.kind
        if kind == "auto":
            kind = "hub" if src.hub_name else ("synthetic" if not src.path else "file")
        if kind == "hub":
            if not src.hub_name:
                raise UserError(f"{name}.hub_name: required for kind 'hub' (e.g. 'emozilla/pg19')")
        elif kind == "synthetic":
            validate_synthetic(src.synthetic, f"{name}.synthetic", cfg.seq_len)
        else:
            if not src.path:
                raise UserError(f"{name}.path: required for kind {src.kind!r}")
            _check_path(src, i)
            if src.kind == "auto" and not has_glob(src.path):
                resolve_kind(src, i)  # raises when the format cannot be inferred
            _peek(src, i)
        if not src.text_field:
            raise UserError(f"{name}.text_field: must name the column holding the text")
        if src.sample_by not in ("line", "paragraph", "document"):
            raise UserError(f"{name}.sample_by: {src.sample_by!r} is not one of line, paragraph, document")
        if not isinstance(src.min_tokens, int) or src.min_tokens < 0:
            raise UserError(f"{name}.min_tokens: must be an integer >= 0, got {src.min_tokens!r}")
        if src.max_tokens is not None and (not isinstance(src.max_tokens, int) or src.max_tokens < max(1, src.min_tokens)):
            raise UserError(f"{name}.max_tokens: must be null or an integer >= min_tokens ({src.min_tokens}), got {src.max_tokens!r}")
        if src.packing is not None and src.packing not in PACKING_MODES:
            raise UserError(f"{name}.packing: {src.packing!r} is not one of null, {', '.join(PACKING_MODES)}")
        for j, b in enumerate(src.upsample):
            bname = f"{name}.upsample[{j}]"
            if not isinstance(b.min_tokens, int) or b.min_tokens < 0:
                raise UserError(f"{bname}.min_tokens: must be an integer >= 0, got {b.min_tokens!r}")
            if b.max_tokens is not None and b.max_tokens <= b.min_tokens:
                raise UserError(f"{bname}.max_tokens: must be null or > min_tokens ({b.min_tokens})")
            if not math.isfinite(float(b.factor)) or float(b.factor) < 0:
                raise UserError(f"{bname}.factor: must be a finite number >= 0, got {b.factor!r}")
    if not sum(weights) > 0:
        raise UserError(
            f"data.sources[*].weight: mixture weights must sum to a positive number, got {weights}"
        )
    if cfg.tokenizer != "byte":
        from longctx.data.tokenizer import check_tokenizer_spec

        check_tokenizer_spec(cfg.tokenizer)
    if model_vocab_size is not None:
        from longctx.data.tokenizer import check_vocab, load_tokenizer

        check_vocab(load_tokenizer(cfg.tokenizer), model_vocab_size)
