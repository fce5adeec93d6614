"""Long documents encoded piece by piece, with the same ids as one call.

A 🤗 tokenizer keeps every token's string, offsets and alignments of a call until the call
returns: a 50 MB source file (15M tokens) takes a process past 12 GiB in one call. Cut into
pieces of about PIECE_CHARS characters, a few encoded per call and kept only as their ids, the
document costs its ids plus one group's encodings.

A cut is placed after a single newline between two non-whitespace characters: a pre-token
boundary for byte-level BPE regexes (GPT-2, Llama 3, SmolLM2, Qwen), whose whitespace rule
splits a run of newlines by what follows it, so a cut never ends a run. Each cut is checked before it is
used: the text around it, encoded whole, must equal its two sides encoded apart. A tokenizer
whose encoding depends on where a text starts (SentencePiece's prefix "▁", add_prefix_space)
fails the check, and the document is encoded in one call as before.
"""
from __future__ import annotations

from typing import Callable, List, Sequence

import numpy as np

PIECE_CHARS = 1 << 20  # characters per piece of a long document
CHECK_CHARS = 256  # characters each side of a cut that the check encodes
GROUP = 2  # pieces per call (encoded in parallel): one call's encodings are what is resident at a time

EncodeIds = Callable[[Sequence[str]], List[np.ndarray]]  # texts -> ids (no special tokens)


def cut_points(text: str, piece_chars: int = PIECE_CHARS) -> list[int]:
    """Offsets (ascending) where `text` is cut: each the first line start after a single newline
    (non-whitespace on both sides) at or past piece_chars characters after the previous cut."""
    cuts: list[int] = []
    start = 0
    while len(text) - start > piece_chars:
        at = text.find("\n", start + piece_chars - 1)
        while at != -1 and (at + 1 >= len(text) or text[at + 1].isspace() or at == 0 or text[at - 1].isspace()):
            at = text.find("\n", at + 1)
        if at == -1:
            break
        cuts.append(at + 1)
        start = at + 1
    return cuts


def cuts_are_exact(encode_ids: EncodeIds, text: str, cuts: Sequence[int], check_chars: int = CHECK_CHARS) -> bool:
    """Every cut leaves the ids around it unchanged."""
    for c in cuts:
        left, right = text[max(0, c - check_chars):c], text[c:c + check_chars]
        whole, a, b = encode_ids([left + right, left, right])
        if not np.array_equal(whole, np.concatenate([a, b])):
            return False
    return True


def encode_long(encode_ids: EncodeIds, text: str, piece_chars: int = PIECE_CHARS) -> np.ndarray:
    """The ids of `text` as one call gives them: in pieces where every cut is exact, else whole."""
    cuts = cut_points(text, piece_chars)
    if not cuts or not cuts_are_exact(encode_ids, text, cuts):
        return encode_ids([text])[0]
    bounds = [0, *cuts, len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    ids: list[np.ndarray] = []
    for g in range(0, len(pieces), GROUP):
        ids += encode_ids(pieces[g:g + GROUP])
    return np.concatenate(ids)
