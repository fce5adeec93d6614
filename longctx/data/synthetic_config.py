"""The synthetic corpus's section (`data.sources[i].synthetic`): its tasks, their fallbacks and
its own checks. The corpus itself is synthetic.py; its wording templates.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from longctx.base.errors import UserError
from longctx.data.field_checks import check_int, check_probability
from longctx.data.filler import FILLER_KINDS
from longctx.data.templates import STYLES, min_document_chars

SYNTHETIC_TASKS = ("niah", "multivalue", "passkey", "recall")
DEFAULT_TASKS = {"niah": 0.6, "multivalue": 0.2, "passkey": 0.2}
# a task whose document does not fit the row falls back along this chain (longest first);
# recall documents shrink with the row, so recall has no fallback
FALLBACK_ORDER = ("multivalue", "niah", "passkey")


def fallback_chain(task: str) -> Tuple[str, ...]:
    """The task itself, then the shorter tasks it falls back to."""
    return FALLBACK_ORDER[FALLBACK_ORDER.index(task):] if task in FALLBACK_ORDER else (task,)


@dataclass
class SyntheticConfig:
    """The built-in retrieval corpus (format documented in docs/data.md).

    Document i is a pure function of (seed, i): the same corpus on every machine and rank.
    Lengths are in tokens of the loader's tokenizer (bytes for the byte tokenizer), BOS/EOS
    included, so `length_max: null` (= seq_len) makes every document fit one row.
    """

    num_docs: int = 20000  # documents per epoch
    seed: int = 1234  # corpus seed (independent of the training seed)
    length_min: Optional[int] = None  # null: length_min_ratio x seq_len
    # the shortest document as a fraction of seq_len when length_min is null; near 1 packs every
    # document full of needles (distractors fit only in long documents)
    length_min_ratio: float = 0.5
    length_max: Optional[int] = None  # null: seq_len
    num_keys: int = 4  # needles with distinct keys per niah/multivalue document (1 queried)
    num_values: int = 2  # values of the queried key in a multivalue document
    # questions per niah document: the first queries-1 distractor keys are asked (and answered)
    # before the final question, so one document holds several key-matching examples;
    # questions that do not fit the document's length are left out
    queries: int = 1
    # probability that a recall key has num_values values (asked as one list in text order):
    # the multivalue skill, "the next value of this key", drilled densely
    recall_multivalue: float = 0.0
    # probability that a niah/multivalue/passkey document puts each needle on a line of its own
    # (a newline before and after instead of a space), the way RULER's niah haystacks separate
    # their units; the text is otherwise the same document, character for character
    line_breaks: float = 0.0
    value_digits: int = 7
    distance_min: Optional[int] = None  # tokens between the queried needle and the question
    distance_max: Optional[int] = None  # null: anywhere in the document
    filler: str = "mixed"  # "noise" (RULER's repeated sentences) | "varied" | "mixed"
    style: str = "compact"  # "compact" (RULER's needles, the eval suite's compact question) | "ruler" | "short"
    # task mix; null means DEFAULT_TASKS (a null schema default: a config's `tasks` then
    # replaces the mix instead of being merged into it key by key)
    tasks: Optional[Dict[str, float]] = None

    def task_mix(self) -> Dict[str, float]:
        """{task: weight}: `tasks`, or DEFAULT_TASKS when unset."""
        return dict(self.tasks) if self.tasks else dict(DEFAULT_TASKS)

    def length_bounds(self, seq_len: int) -> Tuple[int, int]:
        """(length_min, length_max) in tokens for rows of seq_len, nulls resolved."""
        lo = self.length_min if self.length_min is not None else max(1, int(seq_len * self.length_min_ratio))
        hi = self.length_max if self.length_max is not None else seq_len
        return lo, hi

    def validate(self, name: str, seq_len: int) -> None:
        """`name`: where this section sits (e.g. data.sources[0].synthetic)."""
        for count in ("num_docs", "num_keys", "num_values", "queries", "value_digits"):
            check_int(getattr(self, count), f"{name}.{count}")
        check_probability(self.recall_multivalue, f"{name}.recall_multivalue")
        check_probability(self.line_breaks, f"{name}.line_breaks")
        if not (isinstance(self.length_min_ratio, (int, float)) and 0 < self.length_min_ratio <= 1):
            raise UserError(f"{name}.length_min_ratio: must be in (0, 1], got {self.length_min_ratio!r}")
        lo, hi = self.length_bounds(seq_len)
        if lo < 1 or hi < lo:
            raise UserError(f"{name}.length_min/length_max: need 1 <= length_min <= length_max, got {lo}..{hi}")
        if self.filler not in FILLER_KINDS:
            raise UserError(f"{name}.filler: {self.filler!r} is not one of {', '.join(FILLER_KINDS)}")
        if self.style not in STYLES:
            raise UserError(f"{name}.style: {self.style!r} is not one of {', '.join(STYLES)}")
        self._validate_tasks(name, hi)
        for which in ("distance_min", "distance_max"):
            v = getattr(self, which)
            if v is not None and (not isinstance(v, int) or v < 0):
                raise UserError(f"{name}.{which}: must be null or an integer >= 0, got {v!r}")
        if self.distance_min is not None and self.distance_max is not None:
            if self.distance_max < self.distance_min:
                raise UserError(f"{name}.distance_max: must be >= distance_min ({self.distance_min})")

    def _validate_tasks(self, name: str, length_max: int) -> None:
        """Known tasks, usable weights, and each task (or its fallback) fits length_max."""
        tasks = self.task_mix()
        bad = [t for t in tasks if t not in SYNTHETIC_TASKS]
        if bad:
            raise UserError(f"{name}.tasks: unknown task {bad[0]!r}; valid: {', '.join(SYNTHETIC_TASKS)}")
        total = sum(float(w) for w in tasks.values())
        if not tasks or any(float(w) < 0 for w in tasks.values()) or not total > 0:
            raise UserError(f"{name}.tasks: weights must be >= 0 and sum to a positive number")
        # a task too long for length_max falls back to a shorter one (multivalue → niah →
        # passkey); it is an error only when even the fallback does not fit
        need = {t: min_document_chars(self, t, self.style) + 2 for t in SYNTHETIC_TASKS}  # + BOS/EOS
        weighted = [t for t, w in tasks.items() if float(w) > 0]

        def failing(needs: dict) -> list:
            return [t for t in weighted if not any(needs[f] <= length_max for f in fallback_chain(t))]

        too_long = failing(need)
        if too_long:
            task = too_long[0]
            short = {t: min_document_chars(self, t, "short") + 2 for t in SYNTHETIC_TASKS}
            fixes = ["style 'short'"] if self.style != "short" and not failing(short) else []
            fixes.append(f"length_max >= {max(need[t] for t in too_long)}")
            kept = [t for t in weighted if t not in too_long]
            fitting = [t for t in SYNTHETIC_TASKS if need[t] <= length_max]
            if kept:
                fixes.append(f"{name}.tasks without {', '.join(map(repr, too_long))}")
            elif fitting:
                fixes.append(f"{name}.tasks of {', '.join(map(repr, fitting))} only")
            raise UserError(
                f"{name}.length_max: {length_max} tokens is too short for a {task!r} document in style "
                f"{self.style!r} (needs ~{need[task]}); use " + (" or ".join(fixes) if len(fixes) < 3 else
                                                                 ", ".join(fixes[:-1]) + ", or " + fixes[-1])
            )

