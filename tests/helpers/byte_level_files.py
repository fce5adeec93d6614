"""Tokenizer files made with `tokenizers` for tests: the 256 byte-level symbols as the vocabulary
(no merges) plus the given special tokens, the way byte-level BPE tokenizers (GPT-2, Llama 3,
Qwen) are stored."""
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


def write_byte_level_tokenizer(d: Path, specials: list[str]) -> dict[str, int]:
    """tokenizer.json in `d` (made if missing); returns each special token's id."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    return {t: tok.token_to_id(t) for t in specials}
