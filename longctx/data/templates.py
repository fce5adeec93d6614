"""Wording of the synthetic corpus: needles, questions and answer prefixes per style, and the
length of the shortest document each task can make.

RULER's needle / question / answer-prefix wording, as the eval suite renders it. "ruler":
RULER's templates with their instruction preamble; "compact": the same needles, no preamble,
the short question of the eval suite's compact style; "short": shorter needles and no
question, so that documents of 64-128 tokens still have room for filler.
"""
from __future__ import annotations

from typing import Dict, Protocol, Tuple

from longctx.data.words import LONGEST_PAIR

NEEDLE = "One of the special magic numbers for {key} is: {value}."
_PASSKEY_NEEDLE = "The pass key is {value}. Remember it. {value} is the pass key."
_PASSKEY_Q = ("What is the pass key?", "The pass key is")
# recall (associative recall): short key-value entries, then the same entries again in another
# order; every repeated value is an answer. Its "K is: V" is the needle's ending, so the skill it
# drills (find the entry whose key matches, copy its value) is the one niah needs, at ~26
# characters per entry instead of ~64: 4-5 keys to choose from in 256 bytes, ~19 in 1024.
RECALL_ENTRY = "{key} is: {value}."
TEMPLATES: Dict[str, Dict[str, object]] = {
    "ruler": {
        "intro": {
            "niah": "A special magic number is hidden within the following text. Make sure to memorize it. "
                    "I will quiz you about the number afterwards.",
            "multivalue": "Some special magic numbers are hidden within the following text. Make sure to "
                          "memorize it. I will quiz you about the numbers afterwards.",
            "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and "
                       "memorize it. I will quiz you about the important information there.",
        },
        "needle": NEEDLE, "passkey_needle": _PASSKEY_NEEDLE,
        "question": {
            "niah": ("What is the special magic number for {key} mentioned in the provided text?",
                     "The special magic number for {key} mentioned in the provided text is"),
            "multivalue": ("What are all the special magic numbers for {key} mentioned in the provided text?",
                           "The special magic numbers for {key} mentioned in the provided text are"),
            "passkey": _PASSKEY_Q,
        },
    },
    "compact": {
        "intro": {}, "needle": NEEDLE, "passkey_needle": _PASSKEY_NEEDLE,
        "question": {
            "niah": ("What is the special magic number for {key}?", "The special magic number for {key} is"),
            "multivalue": ("What are the special magic numbers for {key}?", "The special magic numbers for {key} are"),
            "passkey": _PASSKEY_Q,
        },
    },
    "short": {
        "intro": {}, "needle": "The magic number for {key} is {value}.",
        "passkey_needle": "The pass key is {value}.",
        "question": {
            "niah": ("", "The magic number for {key} is"),
            "multivalue": ("", "The magic numbers for {key} are"),
            "passkey": ("", "The pass key is"),
        },
    },
}
STYLES = tuple(TEMPLATES)


def passkey_digits(value_digits: int) -> int:
    """Digits of a pass key: value_digits, at most 5 (RULER's pass keys)."""
    return max(1, min(value_digits, 5))


def head_and_question(tpl: Dict[str, object], task: str, key: str) -> Tuple[str, str]:
    """(the intro line the document starts with, the final question with its answer prefix)."""
    q, prefix = tpl["question"][task]
    intro = tpl["intro"].get(task, "")
    head = intro + "\n" if intro else ""
    return head, "\n" + (q.format(key=key) + " " if q else "") + prefix.format(key=key)


class NeedleValues(Protocol):
    """What a document's shortest length depends on (a SyntheticConfig has these fields): the
    digits of a value and the values of the queried key in a multivalue document."""

    value_digits: int
    num_values: int


def min_document_chars(cfg: NeedleValues, task: str, style: str) -> int:
    """Characters (BOS/EOS excluded) of the shortest `task` document: queried needle(s),
    question and answer, no distractor, no filler (longest key, as a bound)."""
    if task == "recall":  # one single-value entry, asked once
        return 2 * (len(RECALL_ENTRY.format(key=LONGEST_PAIR, value="9" * cfg.value_digits)) + 1) + 1
    tpl = TEMPLATES[style]
    key = LONGEST_PAIR
    if task == "passkey":
        values = ["9" * passkey_digits(cfg.value_digits)]
        needles = [tpl["passkey_needle"].format(value=values[0])]
    else:
        values = ["9" * cfg.value_digits] * (cfg.num_values if task == "multivalue" else 1)
        needles = [tpl["needle"].format(key=key, value=v) for v in values]
    head, tail = head_and_question(tpl, task, key)
    answer = " " + ", ".join(values) + "."
    return len(head) + len(tail) + len(answer) + sum(len(n) + 2 for n in needles)
