"""Train a small byte-level BPE tokenizer (🤗 tokenizers) on text the project generates.

    path = train_bpe(texts, vocab_size=1024, out_dir=run / "tokenizer")
    tok = load_tokenizer(str(path))          # an HFTokenizer: <s> BOS, </s> EOS, <pad> PAD

Byte-level, so any text encodes (no unknown token); digits are split one per token, so a
7-digit value is always 7 tokens and copying it is the same task whatever the digits are
(merged digit pairs would make "1234567" and "1243567" differ in length and pieces).
The file is deterministic for the same texts and vocab_size.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from longctx.base.errors import UserError
from longctx.storage import atomic

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2: found by load_tokenizer's BOS/EOS/PAD candidates
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # the byte alphabet and the specials


def train_bpe(texts: Iterable[str], vocab_size: int, out_dir: Path) -> Path:
    """Train on `texts`, write out_dir/tokenizer.json (atomically) and return its path."""
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB:
        raise UserError(f"tokenizer vocab_size: {vocab_size!r} is too small; a byte-level BPE needs >= {MIN_VOCAB}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    path = Path(out_dir) / "tokenizer.json"
    with atomic.result_file(path) as tmp:
        tok.save(str(tmp))
    return path
