"""Common words extraction (RULER "cwe"): the 10 most frequent words of a long numbered list.

10 common words appear 30 times each, every other word 3 times (6 and 1 below 4096 tokens, as
RULER does), shuffled and numbered "1. word 2. word ...". A one-shot example comes first.
Scored with string_match_all over the 10 common words.
"""
from __future__ import annotations

import random
from functools import lru_cache
from typing import Optional

from longctx.eval.haystack import SINGLE_WORDS, pseudo_words
from longctx.eval.tasks.base import Draft, Task, TaskOptions

_TEMPLATE = ("Below is a numbered list of words. In these words, some appear more often than others. "
             "Memorize the ones that appear most often.\n{context}\n"
             "Question: What are the 10 most common words in the above list?")
_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
NUM_COMMON = 10
MAX_FILL = 64


@lru_cache(maxsize=1)
def _pool() -> tuple[str, ...]:
    # Real words first; pronounceable pseudo-words beyond that so long contexts never run dry.
    return tuple(SINGLE_WORDS) + tuple(pseudo_words(40000, seed=1234))


def _numbered(words) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


class CweDraft(Draft):
    def __init__(self, rng: random.Random, target_length: int):
        pool = _pool()
        small = target_length < 4096
        self.freq_common, self.freq_rare = (6, 1) if small else (30, 3)
        ex_n, ex_fc, ex_fr = (20, 3, 1) if small else (40, 10, 3)
        ex_words = rng.sample(SINGLE_WORDS, ex_n)
        ex_list = ex_words[:NUM_COMMON] * ex_fc + ex_words[NUM_COMMON:] * ex_fr
        rng.shuffle(ex_list)
        self.example = (_TEMPLATE.format(context=_numbered(ex_list)) + _PREFIX + " "
                        + _numbered(ex_words[:NUM_COMMON]))
        # One permutation of the pool fixed per sample: the first n words are used, the rest fill.
        n_real = len(SINGLE_WORDS)
        order = rng.sample(range(n_real), n_real) + list(range(n_real, len(pool)))
        self.words = [pool[i] for i in order if pool[i] not in ex_words[:NUM_COMMON]]
        self.outputs = self.words[:NUM_COMMON]
        self.answer_prefix = _PREFIX
        self.shuffle_seed = rng.getrandbits(64)
        self.n_min = NUM_COMMON + 1
        self.n_max = len(self.words) - MAX_FILL
        self.meta = {"freq_common": self.freq_common, "freq_rare": self.freq_rare}

    def render(self, n: int, fill: int) -> str:
        lst = self.words[:NUM_COMMON] * self.freq_common + self.words[NUM_COMMON:n] * self.freq_rare
        random.Random(self.shuffle_seed).shuffle(lst)
        lst += self.words[n:n + fill]  # filler: words seen once, never competing with the common ones
        return self.example + "\n" + _TEMPLATE.format(context=_numbered(lst))

    def fill_max(self, n: int) -> int:
        return MAX_FILL


class CweTask(Task):
    name = "cwe"
    family = "cwe"
    metric = "string_match_all"
    ruler_max_new_tokens = 120
    description = "common words extraction: 10 most frequent words in a numbered list"

    def draft(self, rng: random.Random, target_length: int, options: TaskOptions,
              depth: Optional[float], shared=None) -> CweDraft:
        return CweDraft(rng, target_length)
