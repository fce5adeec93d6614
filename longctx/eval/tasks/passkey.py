"""Passkey retrieval (Mohtashami & Jaggi, 2023): a number hidden in repeated filler text.

Not one of RULER's 13 tasks (niah_single_1 is its closest relative) but the classic first check
of a context extension. Supports a controlled depth for depth x length grids.
"""
from __future__ import annotations

import random
from typing import Optional

from longctx.eval.haystack import NOISE, random_number
from longctx.eval.tasks.base import Draft, Task, TaskOptions, answer_budget
from longctx.eval.tasks.layout import insert_at, unit_indices

_NOISE_WORDS = NOISE.split(" ")
_PREAMBLE = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
             "I will quiz you about the important information there.\n")
_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
_QUESTION = "\nWhat is the pass key?"
_PREFIX = " The pass key is"


class PasskeyDraft(Draft):
    def __init__(self, key: str, frac: float, depth: Optional[float], preamble: str):
        self.outputs = [key]
        self.answer_prefix = _PREFIX
        self.needle = _NEEDLE.format(key=key)
        self.frac, self.depth, self.preamble = frac, depth, preamble
        self.n_min = 0
        self.meta = {"haystack": "noise"}

    def render(self, n: int, fill: int) -> str:
        units = [NOISE] * n
        if fill:
            units.append(" ".join(_NOISE_WORDS[:fill]))
        idx = unit_indices(n, [self.frac], self.depth)[0]
        return self.preamble + " ".join(insert_at(units, [(idx, self.needle)])) + _QUESTION

    def fill_max(self, n: int) -> int:
        return len(_NOISE_WORDS) - 1


class PasskeyTask(Task):
    name = "passkey"
    family = "passkey"
    metric = "string_match_all"
    ruler_max_new_tokens = 16
    description = "a numeric pass key hidden in repeated noise"

    def compact_max_new_tokens(self, tokenizer, options: TaskOptions) -> int:
        return answer_budget(tokenizer, ["9" * (options.num_digits or 5)])

    def draft(self, rng: random.Random, target_length: int, options: TaskOptions,
              depth: Optional[float], shared=None) -> PasskeyDraft:
        key = random_number(rng, options.num_digits or 5)
        preamble = "" if options.style == "compact" else _PREAMBLE
        return PasskeyDraft(key, rng.random(), depth, preamble)
