"""Needle in a haystack: RULER's eight retrieval tasks.

Needle: "One of the special magic {type_needle_v} for {key} is: {value}." Keys and values are
numbers (7 digits), adjective-noun words or uuids. Multi-key tasks hide needles for several keys
(or fill the whole haystack with distractor needles); multi-value hides several values for the
queried key; multi-query asks for the values of several keys at once. Scored with
string_match_all: every expected value must appear in the output.

Haystack units go one per line (noise passages, distractor needles), as in RULER; noise words
top up the last line. The distractor-needle haystack (niah_multikey_2/3) is needles only, as in
RULER; compact style (tiny models) tops it up with noise words too.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from longctx.eval.haystack import NEEDLE, NOISE, Corpus, distinct_values, get_corpus, random_value, worst_case_value
from longctx.eval.tasks.base import Draft, Task, TaskOptions, answer_budget
from longctx.eval.tasks.layout import RULER_DEPTHS, essay_context, insert_at, unit_indices

_NOISE_WORDS = NOISE.split(" ")

# RULER's template (plural) and the singular form its replacement rules produce.
_PLURAL = ("Some special magic {tv} are hidden within the following text. Make sure to memorize it. "
           "I will quiz you about the {tv} afterwards.\n{context}\n"
           "What are all the special magic {tv} for {query} mentioned in the provided text?")
_PLURAL_PREFIX = " The special magic {tv} for {query} mentioned in the provided text are"
_SINGULAR = ("A special magic {tv} is hidden within the following text. Make sure to memorize it. "
             "I will quiz you about the {tv} afterwards.\n{context}\n"
             "What is the special magic {tv} for {query} mentioned in the provided text?")
_SINGULAR_PREFIX = " The special magic {tv} for {query} mentioned in the provided text is"
# Compact style: no preamble, shorter question (same needle format).
_COMPACT = "{context}\nWhat {verb} the special magic {tv} for {query}?"
_COMPACT_PREFIX = " The special magic {tv} for {query} {verb}"


def _join_keys(keys: list[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]


class Distractors:
    """The key-value needles around the real ones in a haystack of needles: drawn in order from
    their own generator, so distractor i never depends on how many are drawn; never a sample key."""

    def __init__(self, rng: random.Random, type_k: str, type_v: str, exclude: set, num_digits: int):
        self._rng, self._type_k, self._type_v = rng, type_k, type_v
        self._exclude, self._num_digits = exclude, num_digits
        self._drawn: list[str] = []

    def __getitem__(self, i: int) -> str:
        while len(self._drawn) <= i:
            key = random_value(self._rng, self._type_k, self._num_digits)
            while key in self._exclude:
                key = random_value(self._rng, self._type_k, self._num_digits)
            value = random_value(self._rng, self._type_v, self._num_digits)
            self._drawn.append(NEEDLE.format(type_needle_v=self._type_v, key=key, value=value))
        return self._drawn[i]


@dataclass(frozen=True)
class Needles:
    """The needles of one sample and where they go: fracs (one per needle, 0..1) unless a fixed depth."""

    texts: list[str]
    fracs: list[float]
    depth: Optional[float]


class NiahDraft(Draft):
    def __init__(self, *, haystack: str, corpus: Optional[Corpus], needles: Needles, template: str,
                 answer_prefix: str, outputs: list[str], distractors: Distractors, filler: bool = True):
        self.haystack, self.corpus, self.needles, self.distractors = haystack, corpus, needles, distractors
        self.filler = filler  # noise words after the units (RULER's needle haystack has none)
        self.template, self.answer_prefix, self.outputs = template, answer_prefix, outputs
        self.n_min = 0
        self.meta = {"haystack": haystack}

    def context(self, n: int, fill: int) -> str:
        needles = self.needles
        if self.haystack == "essay":
            return essay_context(self.corpus, n, needles.texts, needles.fracs, needles.depth)
        units = [NOISE] * n if self.haystack == "noise" else [self.distractors[i] for i in range(n)]
        if fill:  # filler: noise words (cycling through the passage)
            units.append(" ".join((_NOISE_WORDS * 4)[:fill]))
        idx = unit_indices(n, needles.fracs, needles.depth)
        return "\n".join(insert_at(units, list(zip(idx, needles.texts))))

    def render(self, n: int, fill: int) -> str:
        return self.template.replace("{context}", self.context(n, fill))

    def fill_max(self, n: int) -> int:
        if self.haystack == "essay" or not self.filler:
            return 0
        # distractor needles can be longer than the noise passage: allow a few passages of filler
        return len(_NOISE_WORDS) * (1 if self.haystack == "noise" else 4) - 1


class NiahTask(Task):
    family = "niah"
    metric = "string_match_all"
    ruler_max_new_tokens = 128

    def __init__(self, name: str, haystack: str, type_k: str, type_v: str,
                 num_k: int = 1, num_v: int = 1, num_q: int = 1, description: str = ""):
        self.name, self.haystack, self.type_k, self.type_v = name, haystack, type_k, type_v
        self.num_k, self.num_v, self.num_q = max(num_k, num_q), num_v, num_q
        self.description = description

    def _digits(self, options: TaskOptions) -> int:
        return options.num_digits or 7

    def compact_max_new_tokens(self, tokenizer, options: TaskOptions) -> int:
        worst = worst_case_value(self.type_v, self._digits(options))
        return answer_budget(tokenizer, [worst] * (self.num_q * self.num_v))

    def draft(self, rng: random.Random, target_length: int, options: TaskOptions,
              depth: Optional[float], shared=None) -> NiahDraft:
        digits = self._digits(options)
        keys = distinct_values(rng, self.type_k, self.num_k, num_digits=digits)
        values = distinct_values(rng, self.type_v, self.num_k * self.num_v, exclude=keys, num_digits=digits)
        values_by_key = [values[i * self.num_v:(i + 1) * self.num_v] for i in range(self.num_k)]
        needles = [NEEDLE.format(type_needle_v=self.type_v, key=k, value=v)
                   for k, vs in zip(keys, values_by_key) for v in vs]
        rng.shuffle(needles)
        if self.haystack == "essay":
            fracs = rng.sample(RULER_DEPTHS, len(needles))
        else:
            fracs = [rng.random() for _ in needles]
        q_idx = rng.sample(range(self.num_k), self.num_q)
        queries = [keys[i] for i in q_idx]
        outputs = [v for i in q_idx for v in values_by_key[i]]
        query = _join_keys(queries)
        single = self.num_q * self.num_v == 1
        tv = self.type_v[:-1] if single else self.type_v
        if options.style == "compact":
            verb = "is" if single else "are"
            template = _COMPACT.format(verb=verb, tv=tv, query=query, context="{context}")
            prefix = _COMPACT_PREFIX.format(verb=verb, tv=tv, query=query)
        else:
            template = (_SINGULAR if single else _PLURAL).format(tv=tv, query=query, context="{context}")
            prefix = (_SINGULAR_PREFIX if single else _PLURAL_PREFIX).format(tv=tv, query=query)
        corpus = get_corpus(options.essay_path) if self.haystack == "essay" else None
        drng = random.Random(rng.getrandbits(64))
        return NiahDraft(haystack=self.haystack, corpus=corpus, needles=Needles(needles, fracs, depth),
                         template=template, answer_prefix=prefix, outputs=outputs,
                         distractors=Distractors(drng, self.type_k, self.type_v, set(keys), digits),
                         filler=self.haystack != "needle" or options.style == "compact")


NIAH_TASKS = [
    NiahTask("niah_single_1", "noise", "words", "numbers", description="one needle, noise haystack (passkey-like)"),
    NiahTask("niah_single_2", "essay", "words", "numbers", description="one needle, essay haystack (vanilla NIAH)"),
    NiahTask("niah_single_3", "essay", "words", "uuids", description="one uuid needle, essay haystack"),
    NiahTask("niah_multikey_1", "essay", "words", "numbers", num_k=4, description="4 keys, query one"),
    NiahTask("niah_multikey_2", "needle", "words", "numbers", description="haystack of distractor needles"),
    NiahTask("niah_multikey_3", "needle", "uuids", "uuids", description="distractor needles, uuid keys and values"),
    NiahTask("niah_multivalue", "essay", "words", "numbers", num_v=4, description="4 values for one key"),
    NiahTask("niah_multiquery", "essay", "words", "numbers", num_q=4, description="query 4 keys at once"),
]
