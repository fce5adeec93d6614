"""Tokenizers: a built-in byte-level one (offline default) and local Hugging Face ones.

    tok = load_tokenizer("byte")                      # 256 bytes + BOS/EOS/PAD, vocab 259
    tok = load_tokenizer("path/to/tokenizer.json")    # or an HF tokenizer directory
    ids = tok.encode(text, add_bos=True)              # list[int]
    arrs = tok.encode_batch(texts)                    # list[np.ndarray(int32)], the fast path
    text = tok.decode(ids)

Every tokenizer has `name`, `vocab_size`, `bos_id`, `eos_id`, `pad_id` (int or None), `adds_bos`
(whether the tokenizer's own config prepends BOS: tokenizer_config.json's `add_bos_token`) and a
`fingerprint` (a hash of everything that changes token ids; part of the cache key).
Special tokens are never inserted by the underlying tokenizer's post-processor; BOS/EOS are
added here, explicitly, so the packer controls document edges.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np
from tokenizers import Tokenizer

from longctx.base.errors import UserError
from longctx.data.pieces import PIECE_CHARS, encode_long
from longctx.storage.hub import HUB_ID, TOKENIZER_FILES, fetch

Spans = Sequence[Tuple[int, int]]  # [start, end) character offsets

BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|im_start|>")
EOS_CANDIDATES = ("<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>", "<|im_end|>")
PAD_CANDIDATES = ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>")


def _as_int_array(ids) -> np.ndarray:
    if hasattr(ids, "detach"):  # torch tensor
        ids = ids.detach().cpu().numpy()
    return np.asarray(ids, dtype=np.int64).reshape(-1)


def _with_specials(ids: np.ndarray, bos: Optional[int], eos: Optional[int], add_bos: bool, add_eos: bool) -> np.ndarray:
    if add_bos and bos is None:
        raise ValueError("add_bos=True but this tokenizer has no BOS token")
    if add_eos and eos is None:
        raise ValueError("add_eos=True but this tokenizer has no EOS token")
    n = len(ids) + int(add_bos) + int(add_eos)
    out = np.empty(n, dtype=np.int32)
    start = 1 if add_bos else 0
    if add_bos:
        out[0] = bos
    out[start : start + len(ids)] = ids
    if add_eos:
        out[-1] = eos
    return out


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; BOS=256, EOS=257, PAD=258. Needs no files."""

    name = "byte"
    vocab_size = 259
    bos_id = 256
    eos_id = 257
    pad_id = 258
    adds_bos = True
    fingerprint = "byte-v1"

    def encode_np(self, text: str, add_bos: bool = False, add_eos: bool = False) -> np.ndarray:
        raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        return _with_specials(raw, self.bos_id, self.eos_id, add_bos, add_eos)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> List[int]:
        return self.encode_np(text, add_bos, add_eos).tolist()

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> List[np.ndarray]:
        return [self.encode_np(t, add_bos, add_eos) for t in texts]

    def decode(self, ids) -> str:
        arr = _as_int_array(ids)
        arr = arr[(arr >= 0) & (arr < 256)].astype(np.uint8)
        return arr.tobytes().decode("utf-8", errors="replace")

    def span_mask(self, text: str, spans: Spans) -> np.ndarray:
        """Bool per token of encode(text) (no specials): True where the token overlaps a span."""
        n = len(text.encode("utf-8"))
        mask = np.zeros(n, dtype=bool)
        ascii_only = n == len(text)
        for s, e in spans:
            if not ascii_only:  # character offsets → byte offsets
                s, e = len(text[:s].encode("utf-8")), len(text[:e].encode("utf-8"))
            mask[s:e] = True
        return mask

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=259)"


class HFTokenizer:
    """A 🤗 `tokenizers.Tokenizer` (from tokenizer.json) with explicit BOS/EOS handling.
    `source`: the tokenizer.json or directory it was read from (None from the hub), whose
    files an export copies (data/hf_tokenizer.py)."""

    def __init__(self, tok, name: str, bos: Optional[str] = None, eos: Optional[str] = None, pad: Optional[str] = None,
                 source: Optional[str] = None, add_bos_token: Optional[bool] = None, field: str = "data.tokenizer",
                 no_bos: bool = False):
        self._tok = tok
        self.name = name
        self.source = source
        self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
        vocab = tok.get_vocab(with_added_tokens=True)

        def pick(explicit, candidates):
            if explicit is not None:
                if explicit not in vocab:
                    raise UserError(f"{field}: {name}: special token {explicit!r} is not in the vocabulary")
                return vocab[explicit]
            for c in candidates:
                if c in vocab:
                    return vocab[c]
            return None

        # no_bos: the tokenizer's config says bos_token null (Qwen's): no stand-in such as <|im_start|>
        self.bos_id = None if no_bos and bos is None else pick(bos, BOS_CANDIDATES)
        self.eos_id = pick(eos, EOS_CANDIDATES)
        self.pad_id = pick(pad, PAD_CANDIDATES)
        # a BOS-like token may exist without being prepended (SmolLM2: <|im_start|>, add_bos_token false)
        self.adds_bos = self.bos_id is not None and (add_bos_token is None or bool(add_bos_token))
        # the largest id may exceed get_vocab_size() in some files (holes); the embedding
        # must cover it
        if vocab:
            self.vocab_size = max(self.vocab_size, max(vocab.values()) + 1)
        h = hashlib.sha256(tok.to_str().encode("utf-8"))
        h.update(json.dumps([self.bos_id, self.eos_id, self.pad_id]).encode())
        self.fingerprint = "hf-" + h.hexdigest()[:32]

    @property
    def backend(self) -> Tokenizer:
        return self._tok

    def _ids(self, enc) -> np.ndarray:
        return np.asarray(enc.ids, dtype=np.int32)

    def _encode_many(self, texts: List[str]):
        # encode_batch_fast (tokenizers >= 0.21) skips character offsets, which nothing here reads
        fast = getattr(self._tok, "encode_batch_fast", None)
        if fast is not None:
            return fast(texts, add_special_tokens=False)
        return self._tok.encode_batch(texts, add_special_tokens=False)

    def _ids_many(self, texts: Sequence[str]) -> List[np.ndarray]:
        return [self._ids(e) for e in self._encode_many(list(texts))]

    def _ids_of(self, texts: Sequence[str]) -> List[np.ndarray]:
        """ids of each text; texts over PIECE_CHARS characters are encoded in pieces (pieces.py)."""
        short = [i for i, t in enumerate(texts) if len(t) <= PIECE_CHARS]
        out: List[Optional[np.ndarray]] = [None] * len(texts)
        for i, ids in zip(short, self._ids_many([texts[i] for i in short])):  # parallel in Rust
            out[i] = ids
        for i, t in enumerate(texts):
            if out[i] is None:
                out[i] = encode_long(self._ids_many, t, PIECE_CHARS)
        return out

    def encode_np(self, text: str, add_bos: bool = False, add_eos: bool = False) -> np.ndarray:
        return _with_specials(self._ids_of([text])[0], self.bos_id, self.eos_id, add_bos, add_eos)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> List[int]:
        return self.encode_np(text, add_bos, add_eos).tolist()

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> List[np.ndarray]:
        return [_with_specials(ids, self.bos_id, self.eos_id, add_bos, add_eos) for ids in self._ids_of(texts)]

    def decode(self, ids) -> str:
        return self._tok.decode(_as_int_array(ids).tolist(), skip_special_tokens=True)

    def span_mask(self, text: str, spans: Spans) -> np.ndarray:
        enc = self._tok.encode(text, add_special_tokens=False)
        offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        mask = np.zeros(len(offsets), dtype=bool)
        for s, e in spans:
            mask |= (offsets[:, 0] < e) & (offsets[:, 1] > s)
        return mask

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r}, vocab_size={self.vocab_size}, bos={self.bos_id}, eos={self.eos_id})"


def _token_content(value) -> Optional[str]:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_special_tokens(directory: str, field: str) -> dict:
    out = {}
    for fname in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins
        path = os.path.join(directory, fname)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise UserError(f"{field}: {path} is not valid JSON ({e})") from None
            for key in ("bos_token", "eos_token", "pad_token"):
                tok = _token_content(data.get(key))
                if tok is not None:
                    out[key] = tok
            if "bos_token" in data and data["bos_token"] is None and fname == "tokenizer_config.json":
                out.pop("bos_token", None)
                out["no_bos"] = True
            if isinstance(data.get("add_bos_token"), bool):
                out["add_bos_token"] = data["add_bos_token"]
    return out


def _from_file(path: str, name: str, specials: dict, source: str, field: str) -> HFTokenizer:
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise UserError(f"{field}: cannot read {path} ({str(e).splitlines()[0]})") from None
    return HFTokenizer(tok, name, specials.get("bos_token"), specials.get("eos_token"), specials.get("pad_token"),
                       source=source, add_bos_token=specials.get("add_bos_token"), field=field,
                       no_bos=specials.get("no_bos", False))


# the files any of which gives a tokenizer directory its vocabulary (fast, or converted by transformers)
VOCABULARY_FILES = (("tokenizer.json",), ("tokenizer.model",), ("spiece.model",), ("sentencepiece.bpe.model",),
                    ("vocab.json", "merges.txt"), ("vocab.txt",))


def _has_vocabulary(directory: str) -> bool:
    return any(all(os.path.isfile(os.path.join(directory, f)) for f in group) for group in VOCABULARY_FILES)


def check_tokenizer_spec(spec: str, field: str = "data.tokenizer") -> None:
    """Cheap check (no loading) that `spec` names something load_tokenizer can try; errors name `field`."""
    if spec == "byte":
        return
    path = os.path.expanduser(spec)
    if os.path.exists(path):
        if os.path.isdir(path) and not _has_vocabulary(path):
            found = sorted(f for f in os.listdir(path) if not f.startswith("."))
            shown = (", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
                     if found else "nothing")
            raise UserError(
                f"{field}: {spec} has no tokenizer.json or other vocabulary file (found: {shown}); a "
                "tokenizer directory needs tokenizer.json (a fast tokenizer), or tokenizer.model (sentencepiece) "
                "or vocab.json + merges.txt for transformers to convert; "
                "tokenizer_config.json only names special tokens"
            )
        return
    if not HUB_ID.match(spec):
        raise UserError(
            f"{field}: {spec} does not exist; use 'byte', a tokenizer.json, a tokenizer "
            "directory or a hub id like 'org/name'"
        )


def load_tokenizer(spec: str, field: str = "data.tokenizer"):
    """`"byte"`, a path to tokenizer.json, an HF tokenizer directory, or a hub id (its files from the
    HF cache, downloaded there unless HF_HUB_OFFLINE is set);
    errors name `field`, the config field that gave `spec`."""
    if spec is None or spec == "byte":
        return ByteTokenizer()
    check_tokenizer_spec(spec, field)
    path = os.path.expanduser(spec)
    if not os.path.exists(path):  # a hub id: its tokenizer files, fetched into the HF cache (longctx/storage/hub.py)
        path = str(fetch(spec, field, TOKENIZER_FILES))
    if os.path.isfile(path):
        return _from_file(path, spec, _read_special_tokens(os.path.dirname(os.path.abspath(path)), field), path, field)
    if os.path.isdir(path):
        specials = _read_special_tokens(path, field)
        tj = os.path.join(path, "tokenizer.json")
        if os.path.isfile(tj):
            return _from_file(tj, spec, specials, path, field)
        # a slow (sentencepiece) tokenizer: let transformers convert it to a fast one
        try:
            from transformers import AutoTokenizer  # optional: only to convert a slow tokenizer
        except ImportError:
            raise UserError(
                f"{field}: {spec} has no tokenizer.json; install transformers to convert "
                "tokenizer.model, or save a fast tokenizer there"
            ) from None
        try:
            hf = AutoTokenizer.from_pretrained(path, use_fast=True)
        except Exception as e:
            raise UserError(f"{field}: cannot load {spec} ({str(e).splitlines()[0]})") from None
        if not getattr(hf, "is_fast", False):
            raise UserError(f"{field}: {spec} could not be converted to a fast tokenizer")
        return HFTokenizer(hf.backend_tokenizer, spec, hf.bos_token, hf.eos_token, hf.pad_token, source=path,
                           add_bos_token=specials.get("add_bos_token"), field=field,
                           no_bos=specials.get("no_bos", False))
    raise UserError(f"{field}: {spec} is neither a tokenizer.json nor a directory")


def check_vocab(tokenizer, model_vocab_size: int) -> None:
    """UserError unless every id the tokenizer can produce fits the model's embedding."""
    if tokenizer.vocab_size > int(model_vocab_size):
        raise UserError(
            f"data.tokenizer: {tokenizer.name} has vocab_size {tokenizer.vocab_size} but the model's "
            f"vocab_size is {model_vocab_size}; use the model's own tokenizer or a model with "
            f"vocab_size >= {tokenizer.vocab_size}"
        )


def check_local_tokenizer_vocab(spec: str, model_vocab_size: int) -> None:
    """check_vocab before any work, where that is cheap: 'byte' or a local tokenizer.json (a file,
    or a directory holding one). Hub ids and sentencepiece-only directories are checked when the
    trainer loads them (network, slow conversion)."""
    check_tokenizer_spec(spec)
    path = os.path.expanduser(spec)
    fast = spec == "byte" or os.path.isfile(path) or os.path.isfile(os.path.join(path, "tokenizer.json"))
    if fast:
        check_vocab(load_tokenizer(spec), model_vocab_size)


def prepends_bos(tokenizer) -> bool:
    """Whether text for this model starts with the tokenizer's BOS id: it has one and its own
    config does not turn it off."""
    return getattr(tokenizer, "bos_id", None) is not None and getattr(tokenizer, "adds_bos", True)


def adds_bos_for(add_bos: Optional[bool], tokenizer) -> bool:
    """data.add_bos as training applies it: the user's true / false, or (null) the tokenizer's own
    choice, so a tokenizer without a BOS token (Qwen's) gets no stand-in prepended."""
    return prepends_bos(tokenizer) if add_bos is None else bool(add_bos)


def tokenizer_fingerprint(tokenizer) -> str:
    fp = getattr(tokenizer, "fingerprint", None)
    if fp:
        return str(fp)
    return f"{type(tokenizer).__name__}-{tokenizer.name}-{tokenizer.vocab_size}"

