"""Common words extraction (RULER "cwe"): the 10 most frequent words of a long numbered list.

10 common words appear 30 times each, every other word 3 times (6 and 1 below 4096 tokens, as
RULER does), shuffled and numbered "1. word 2. word ...". A one-shot example comes first, in a
chat turn of its own under a chat template (RULER wraps each example in the model's template).
Scored with string_match_all over the 10 common words.

Words: the built-in list first, then a word-list file (`words_path`, RULER's
english_words.json) or, without one, pronounceable made-up words.
"""
from __future__ import annotations

import random
from functools import lru_cache
from typing import Optional

from longctx.eval.haystack import SINGLE_WORDS, load_word_list, pseudo_words
from longctx.eval.tasks.base import Draft, Task, TaskOptions, resolve_chat_template

_TEMPLATE = ("Below is a numbered list of words. In these words, some appear more often than others. "
             "Memorize the ones that appear most often.\n{context}\n"
             "Question: What are the 10 most common words in the above list?")
_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
NUM_COMMON = 10
MAX_FILL = 64


@lru_cache(maxsize=4)
def word_pool(words_path: Optional[str] = None) -> tuple[str, ...]:
    """The built-in words, then the file's (or made-up words, so long contexts never run dry)."""
    if words_path is None:
        return tuple(SINGLE_WORDS) + tuple(pseudo_words(40000, seed=1234))
    builtin = set(SINGLE_WORDS)
    return tuple(SINGLE_WORDS) + tuple(w for w in load_word_list(words_path) if w not in builtin)


def _numbered(words) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


class CweDraft(Draft):
    def __init__(self, rng: random.Random, target_length: int, chat_template: str = "{input}",
                 words_path: Optional[str] = None):
        pool = word_pool(words_path)
        small = target_length < 4096
        self.freq_common, self.freq_rare = (6, 1) if small else (30, 3)
        ex_n, ex_fc, ex_fr = (20, 3, 1) if small else (40, 10, 3)
        ex_words = rng.sample(SINGLE_WORDS, ex_n)
        ex_list = ex_words[:NUM_COMMON] * ex_fc + ex_words[NUM_COMMON:] * ex_fr
        rng.shuffle(ex_list)
        example = chat_template.replace("{input}", _TEMPLATE.format(context=_numbered(ex_list)))
        self.pre_template = example + _PREFIX + " " + _numbered(ex_words[:NUM_COMMON]) + "\n"
        # One permutation of the real words fixed per sample: the first n words are used, the rest fill.
        n_real = len(SINGLE_WORDS) if words_path is None else len(pool)
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
        return _TEMPLATE.format(context=_numbered(lst))

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
        return CweDraft(rng, target_length, resolve_chat_template(options.chat_template), options.words_path)
