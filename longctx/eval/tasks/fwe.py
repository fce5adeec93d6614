"""Frequent words extraction (RULER "fwe"): the 3 most frequent coded words of a Zipf text.

A vocabulary of (L - 50) / 50 random 6-letter "coded words" (RULER's size: the length less the
generation budget, over 50; at least 10); word k appears int(N * k^-alpha / zeta(alpha)) times
(alpha = 2) and the top-ranked one is the noise token "..." the prompt says to ignore, so the
answer is ranks 2-4. Scored with string_match_all.
"""
from __future__ import annotations

import math
import random
import string
from typing import Optional

from longctx.eval.tasks.base import Draft, Task, TaskOptions

_TEMPLATE = ("Read the following coded text and track the frequency of each coded word. Find the three "
             "most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. "
             "Please ignore the dots '....'. What are the three most frequently appeared words in the above "
             "coded text?")
_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
MAX_FILL = 32


def zeta(alpha: float, terms: int = 100000) -> float:
    """Riemann zeta for alpha > 1: a partial sum plus the integral tail (error ~ terms^-alpha)."""
    s = sum(k ** -alpha for k in range(1, terms + 1))
    return s + terms ** (1 - alpha) / (alpha - 1) - 0.5 * terms ** -alpha


class FweDraft(Draft):
    def __init__(self, rng: random.Random, target_length: int, budget: int, alpha: float = 2.0, coded_len: int = 6):
        vocab_size = max((target_length - budget) // 50, 10)
        vocab: set = set()
        while len(vocab) < vocab_size:
            vocab.add("".join(rng.choices(string.ascii_lowercase, k=coded_len)))
        words = sorted(vocab)
        rng.shuffle(words)
        words[0] = "..."  # the top-ranked "word" is noise
        self.vocab = words
        self.alpha, self.z = alpha, zeta(alpha)
        self.outputs = words[1:4]
        self.answer_prefix = _PREFIX
        self.shuffle_seed = rng.getrandbits(64)
        # Smallest N with strictly decreasing counts for ranks 2..5 (an unambiguous answer).
        self.n_min = math.ceil(self.z / (4 ** -alpha - 5 ** -alpha))
        self.meta = {"vocab_size": vocab_size, "alpha": alpha}

    def counts(self, n: int) -> list[int]:
        return [int(n * (k ** -self.alpha) / self.z) for k in range(1, len(self.vocab) + 1)]

    def render(self, n: int, fill: int) -> str:
        text = [w for w, c in zip(self.vocab, self.counts(n)) for _ in range(c)]
        random.Random(self.shuffle_seed).shuffle(text)
        text += ["..."] * fill  # filler: more of the noise token
        return _TEMPLATE.format(context=" ".join(text))

    def fill_max(self, n: int) -> int:
        return MAX_FILL


class FweTask(Task):
    name = "fwe"
    family = "fwe"
    metric = "string_match_all"
    ruler_max_new_tokens = 50
    description = "frequent words extraction: 3 most frequent coded words (Zipf, alpha=2)"

    def draft(self, rng: random.Random, target_length: int, options: TaskOptions,
              depth: Optional[float], shared=None) -> FweDraft:
        return FweDraft(rng, target_length, options.max_new_tokens or self.ruler_max_new_tokens)
