"""Laying needles into haystack units (shared by niah, passkey and vt)."""
from __future__ import annotations

from typing import Optional, Sequence

from longctx.eval.haystack import Corpus

# RULER draws each needle's depth from 40 evenly spaced percentages (0..100, rounded).
RULER_DEPTHS = [round(100 * i / 39) / 100 for i in range(40)]


def insert_at(units: Sequence[str], inserts: Sequence[tuple[int, str]]) -> list[str]:
    """Insert texts before unit indices (0..len); equal indices keep the given order."""
    out: list[str] = []
    by_idx: dict[int, list[str]] = {}
    for idx, text in inserts:
        by_idx.setdefault(min(max(idx, 0), len(units)), []).append(text)
    for i, u in enumerate(units):
        out.extend(by_idx.get(i, ()))
        out.append(u)
    out.extend(by_idx.get(len(units), ()))
    return out


def unit_indices(n: int, fracs: Sequence[float], depth: Optional[float]) -> list[int]:
    """Insertion indices among n units: all at `depth` when given, else at the random fractions,
    uniform over all n + 1 gaps. (RULER draws from the first n gaps, so a needle never follows the
    last unit; harmless with thousands of units, but with the 1-5 units of a 256-512-token prompt
    the queried needle of niah_multikey_2 would almost always come first, and "copy the first
    needle" would score as key matching.)"""
    if depth is not None:
        return [round(depth * n)] * len(fracs)
    return [min(int(u * (n + 1)), n) for u in fracs]


def essay_context(corpus: Corpus, n: int, needles: Sequence[str], depth_fracs: Sequence[float],
                  depth: Optional[float]) -> str:
    """First n words of the corpus with needles at sentence boundaries, joined by spaces.

    Random placement follows RULER (sentence index = int(#sentences * depth)); a controlled
    `depth` puts all needles at the sentence boundary nearest to that fraction of the words.
    """
    words = corpus.take(n)
    starts = corpus.sentence_starts_upto(n)
    if depth is not None:
        bounds = starts + [n]
        target = depth * n
        pos = min(bounds, key=lambda b: abs(b - target))
        word_pos = [pos] * len(needles)
    else:
        word_pos = []
        for d in depth_fracs:
            si = int(len(starts) * d)
            word_pos.append(starts[si] if si < len(starts) else n)
    order = sorted(range(len(needles)), key=lambda i: word_pos[i])
    pieces: list[str] = []
    last = 0
    for i in order:
        p = word_pos[i]
        if p > last:
            pieces.append(" ".join(words[last:p]))
        pieces.append(needles[i])
        last = max(last, p)
    if last < n:
        pieces.append(" ".join(words[last:n]))
    return " ".join(pieces)
