"""Haystack material and random needle values.

Three haystack kinds, as in RULER:

* ``noise``  - one fixed passage of trivial sentences, repeated;
* ``essay``  - a long natural-language text, read as a stream of words (a local corpus when a
  path is given, else the built-in essay below, written for this project);
* ``needle`` - distractor needles: the needle sentence with random keys and values.

Needle values come in RULER's three types: 7-digit ``numbers``, adjective-noun ``words`` and
``uuids``. Everything draws from an explicit ``random.Random`` so that a sample is a pure
function of its seed.
"""
from __future__ import annotations

import json
import random
import re
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Optional

from longctx.base.errors import UserError
from longctx.data.words import ADJECTIVES, NOUNS, SINGLE_WORDS, VERBS, WORD_PAIRS  # noqa: F401  (re-exported)

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
VALUE_TYPES = ("numbers", "words", "uuids")
HAYSTACK_KINDS = ("noise", "essay", "needle")


_SYLLABLES = [c + v for c in "bdfghklmnprstvz" for v in "aeiou"]


def pseudo_words(n: int, seed: int = 0) -> list[str]:
    """`n` distinct pronounceable pseudo-words (used when a task needs more than SINGLE_WORDS)."""
    rng = random.Random(seed)
    out: list[str] = []
    seen = set(SINGLE_WORDS)
    while len(out) < n:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def random_number(rng: random.Random, num_digits: int = 7) -> str:
    return str(rng.randint(10 ** (num_digits - 1), 10**num_digits - 1))


def random_word(rng: random.Random) -> str:
    return rng.choice(WORD_PAIRS)


def random_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def random_value(rng: random.Random, kind: str, num_digits: int = 7) -> str:
    if kind == "numbers":
        return random_number(rng, num_digits)
    if kind == "words":
        return random_word(rng)
    if kind == "uuids":
        return random_uuid(rng)
    raise UserError(f"needle value type {kind!r}: valid types are {', '.join(VALUE_TYPES)}")


def distinct_values(rng: random.Random, kind: str, n: int, exclude=(), num_digits: int = 7) -> list[str]:
    """`n` distinct random values of one type, none of them in `exclude`."""
    seen = set(exclude)
    out: list[str] = []
    while len(out) < n:
        v = random_value(rng, kind, num_digits)
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def worst_case_value(kind: str, num_digits: int = 7) -> str:
    """The longest value of a type (to size generation budgets)."""
    if kind == "numbers":
        return "9" * num_digits
    if kind == "words":
        return max(WORD_PAIRS, key=len)
    return "ffffffff-ffff-4fff-bfff-ffffffffffff"


# --------------------------------------------------------------------------------------------
# Essay corpus: a word stream with known sentence starts.

BUILTIN_ESSAY = """
The first thing you notice about a long project is that nobody remembers why it started. The
people who began it have moved on, the documents describing it have gone stale, and what remains
is a set of habits. Some of those habits are wise and some are accidents that hardened into
rules. The work of a new person on such a project is mostly the work of telling the two apart.

It is tempting to think that the difficult part of building anything is the clever idea at its
center. In practice the clever idea is usually small. What takes the time is everything around
it: the careful handling of the cases nobody thought about, the patient measurement of what
actually happens, and the slow removal of the parts that looked necessary but were not. A good
builder spends more of the day deleting than adding.

Consider how a town grows along a river. At first there is a ford where the water is shallow,
and people cross there because it is the only place they can. A path forms on each bank. Someone
builds a shelter near the crossing, then a market, then a bridge. Centuries later the town is
still arranged around a crossing that no longer matters, and the streets bend in ways that make
sense only if you remember the shallow water. Most systems are like this. Their shape records
the problems they solved long ago.

Writing is a way of finding out what you think. You begin with a feeling that you understand
something, and then you try to put it into sentences, and the sentences refuse to line up. The
gap between the feeling and the sentences is where the real thinking happens. People who say
they know exactly what they mean but cannot put it into words are usually mistaken about the
first part. The words are not a wrapper around the thought. They are how the thought gets its
edges.

Small teams often move faster than large ones, and the usual explanation is that they have less
communication to do. That is part of it. The larger part is that a small team can hold the whole
problem in its head. When every person knows roughly what every other person is doing, a change
in one place does not surprise anyone in another. Once the problem no longer fits in a few heads,
the team needs written rules, and written rules are always a little behind the problem they
describe.

There is a particular pleasure in a tool that does one thing well. A good knife, a reliable
compass, a program that reads a file and reports exactly what is wrong with it. Such tools earn
trust slowly and lose it quickly. Every surprise costs more than every success gains. This is why
careful makers test the dull cases as thoroughly as the exciting ones. The dull cases are the
ones people meet every day.

Learning a difficult subject resembles walking through fog on a hillside. For a long time you see
only the ground at your feet and you cannot tell whether you are climbing. Then, without any
single step being special, the fog thins and you can see the valley you crossed. Students who
quit usually quit in the fog, just before the view. The remedy is not more effort in the moment
but a steady habit that carries you through the stretches where progress is invisible.

Measurement changes behavior. When a number becomes the goal, people find ways to move the number
that have nothing to do with what it was meant to capture. A library that counts the books it
lends will lend more books, whether or not anyone reads them. The honest response is not to stop
measuring but to measure several things at once, to look at the raw cases behind every average,
and to be suspicious whenever a number improves faster than the thing it describes.

Old maps are full of confident mistakes. Rivers that flow the wrong way, islands that do not
exist, mountain ranges drawn from rumor. Yet the people who used those maps mostly arrived where
they meant to go, because they also watched the sun, asked the locals, and turned back when the
ground disagreed with the paper. A map is useful only to someone who is willing to notice when
it is wrong.

The best questions are often embarrassingly simple. What does this actually do. Who uses it and
what for. What would happen if we removed it. Experts stop asking such questions because they
feel they should already know the answers, and newcomers do not ask them because they fear
looking foolish. So the simplest questions go unasked for years, while the complicated ones get
all the attention.

A garden teaches patience in a way that few other things do. You cannot make a seed grow faster
by watching it. You can only give it water, light and time, and remove what competes with it.
Much of good work is like gardening. The effort goes into preparing conditions, and the result
arrives on its own schedule. People who expect every action to produce an immediate effect tend
to dig up the seeds to check on them.

Every craft has its quiet standards that outsiders never see. A carpenter knows the joint that
will hold for a century from the one that will fail in a decade, though both look the same on
the first day. A cook knows when a sauce has been rushed. These standards are passed along less
by instruction than by example, by working next to someone who cares and slowly coming to care
about the same invisible things.
"""


def _clean_words(text: str) -> list[str]:
    return re.sub(r"\s+", " ", text).strip().split(" ")


@lru_cache(maxsize=8)
def _load_corpus_cached(path: Optional[str]) -> tuple[str, ...]:
    if path is None:
        return tuple(_clean_words(BUILTIN_ESSAY))
    p = Path(path)
    if not p.exists():
        raise UserError(f"haystack corpus {path}: no such file or directory "
                        "(give a .txt/.json/.jsonl file or a folder of .txt files)")
    files = sorted(p.rglob("*.txt")) if p.is_dir() else [p]
    texts: list[str] = []
    for f in files:
        raw = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix == ".json":
            obj = json.loads(raw)
            if isinstance(obj, dict) and "text" in obj:
                obj = obj["text"]
            texts.extend(obj if isinstance(obj, list) else [str(obj)])
        elif f.suffix == ".jsonl":
            for line in raw.splitlines():
                if line.strip():
                    texts.append(json.loads(line).get("text", ""))
        else:
            texts.append(raw)
    words = _clean_words(" ".join(texts))
    if len(words) < 50:
        raise UserError(f"haystack corpus {path}: only {len(words)} words; need at least 50")
    return tuple(words)


class Corpus:
    """A word stream that wraps around, with the indices of words that start a sentence."""

    def __init__(self, path: Optional[str] = None):
        self.words = _load_corpus_cached(None if path is None else str(path))
        starts = [0] + [i + 1 for i, w in enumerate(self.words[:-1]) if w.endswith((".", "!", "?"))]
        self.sentence_starts = starts  # word indices, within one pass of the stream

    def take(self, n: int) -> list[str]:
        """The first `n` words of the (wrapped) stream."""
        L = len(self.words)
        reps, rem = divmod(n, L)
        return list(self.words) * reps + list(self.words[:rem])

    def sentence_starts_upto(self, n: int) -> list[int]:
        """Word indices < n that begin a sentence in the wrapped stream."""
        L = len(self.words)
        out: list[int] = []
        base = 0
        while base < n:
            out.extend(base + s for s in self.sentence_starts if base + s < n)
            base += L
        return out


@lru_cache(maxsize=4)
def load_word_list(path: str) -> tuple[str, ...]:
    """Distinct words of a word-list file, in file order: RULER's english_words.json (an object
    whose values are the words), a JSON list, or plain text with one word per line."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"eval.words: {path} is not a file (give RULER's english_words.json or one word per line)")
    text = p.read_text(encoding="utf-8", errors="replace")
    try:
        obj = json.loads(text)
        items = list(obj.values()) if isinstance(obj, dict) else obj
    except json.JSONDecodeError:
        items = text.splitlines()
    if not isinstance(items, list):
        raise UserError(f"eval.words: {path} holds a {type(items).__name__}; expected a JSON object or list of words")
    words = [str(w).strip() for w in items if isinstance(w, str) and w.strip() and " " not in w.strip()]
    words = list(dict.fromkeys(words))
    if len(words) < 50:
        raise UserError(f"eval.words: {path} has {len(words)} usable words; need at least 50")
    return tuple(words)


@lru_cache(maxsize=8)
def get_corpus(path: Optional[str] = None) -> Corpus:
    """Shared, cached Corpus for a path (None = the built-in essay)."""
    return Corpus(path)
