"""The tokenizer files a Hugging Face export carries, for every tokenizer longctx trains with.

    files = TokenizerFiles("byte")                 # or a tokenizer.json, a directory, a hub id
    entries = files.write(export_dir, max_length)  # tokenizer.json / tokenizer_config.json ...
    # entries: config.json fields that match the tokenizer (bos/eos/pad ids, ...)

- byte: a `tokenizers` Tokenizer equivalent to ByteTokenizer (each UTF-8 byte one token, ids
  0-255; <s>/</s>/<pad> at 256/257/258), loaded by transformers' AutoTokenizer as a
  PreTrainedTokenizerFast. `tokenizer(text)` gives `encode(text, add_bos=True)`,
  `tokenizer.decode(ids, skip_special_tokens=True)` gives `decode(ids)`, and "<s>" written in
  a text is three bytes, as in ByteTokenizer (split_special_tokens).
- a Hugging Face tokenizer: its files are copied (the tokenizer.json as is); tokenizer_config.json
  gets the special tokens longctx picked where it names none (a `{"content": ...}` entry, which
  transformers cannot read, becomes its string), and a tokenizer class where it has none. A hub
  tokenizer, which has no local files, is written as its tokenizer.json.
In every case tokenizer_config.json's model_max_length is the model's length (a base
tokenizer's 4k would make `truncation=True` cut long inputs).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from longctx.data.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

# the files of a Hugging Face tokenizer directory that an export copies
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt")
BYTE_SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")  # ByteTokenizer's bos_id, eos_id, pad_id, in that order


def _byte_chars() -> list[str]:
    """The printable character the byte-level pre-tokenizer writes for each byte 0..255: bytes that
    are printable Latin-1 stand for themselves, the others take code points from 256 upwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_tokenizer_json(byte: ByteTokenizer) -> Tokenizer:
    """`byte` as a `tokenizers` Tokenizer: byte-level characters, one token each (a BPE without
    merges), the special tokens added at their ids, BOS prepended by the post-processor."""
    chars = _byte_chars()
    if set(chars) != set(pre_tokenizers.ByteLevel.alphabet()):  # the mapping tokenizers' ByteLevel uses
        raise RuntimeError("byte-level alphabet of this tokenizers version differs from the expected one")
    tok = Tokenizer(models.BPE(vocab={c: b for b, c in enumerate(chars)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = dict(zip(BYTE_SPECIAL_TOKENS, (byte.bos_id, byte.eos_id, byte.pad_id)))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for token, want in specials.items():
        if tok.token_to_id(token) != want:
            raise RuntimeError(f"{token} got id {tok.token_to_id(token)}, ByteTokenizer uses {want}")
    bos = BYTE_SPECIAL_TOKENS[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, byte.bos_id)])
    return tok


class TokenizerFiles:
    """What an export writes for the tokenizer `spec` (loaded now, so a bad spec fails before
    any weight is written)."""

    def __init__(self, spec: str):
        self.spec = spec
        self.tokenizer = load_tokenizer(spec)

    def write(self, directory: Path, max_length: int) -> dict:
        """Write the tokenizer files into `directory`; returns config.json entries that match them."""
        directory = Path(directory)
        tok = self.tokenizer
        if isinstance(tok, ByteTokenizer):
            # an OSError names the file
            (directory / "tokenizer.json").write_text(byte_tokenizer_json(tok).to_str(pretty=True))
            bos, eos, pad = BYTE_SPECIAL_TOKENS
            settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
                        "pad_token": pad, "add_bos_token": True, "add_eos_token": False,
                        "split_special_tokens": True, "clean_up_tokenization_spaces": False}
            extra = {"longctx_tokenizer": "byte"}  # eval reads it and uses ByteTokenizer itself
        else:
            settings = self._copy_hf_files(tok, directory)
            extra = {}
        settings["model_max_length"] = max_length
        (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
        ids = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
        return {**{k: v for k, v in ids.items() if v is not None}, **extra}

    def _copy_hf_files(self, tok: HFTokenizer, directory: Path) -> dict:
        """Copy the tokenizer's own files; returns its tokenizer_config.json settings, completed."""
        source = Path(os.path.expanduser(tok.source)) if tok.source else None
        if source is None:  # a hub id: nothing local to copy
            (directory / "tokenizer.json").write_text(tok.backend.to_str())
            files = []
        elif source.is_file():
            files = [source]
        else:
            files = [source / n for n in TOKENIZER_FILES if (source / n).is_file()]
        for f in files:
            shutil.copyfile(f, directory / f.name)  # contents only: the copy's mode follows the umask
        config = directory / "tokenizer_config.json"
        settings = json.loads(config.read_text()) if config.is_file() else {}
        if (directory / "tokenizer.json").is_file():  # else (sentencepiece only) the model type picks the class
            settings.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
        for key, token_id in (("bos_token", tok.bos_id), ("eos_token", tok.eos_id), ("pad_token", tok.pad_id)):
            value = settings.get(key)
            # {"content": ...}: longctx reads it, transformers not
            if isinstance(value, dict) and "__type" not in value:
                settings[key] = value.get("content")
            if token_id is not None and settings.get(key) is None:
                settings[key] = tok.backend.id_to_token(token_id)
        return settings
