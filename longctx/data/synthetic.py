"""The built-in synthetic retrieval corpus: filler text with planted key→value facts and a
question at the end whose answer lies far back. Offline, deterministic, and learnable by a
tiny model on a CPU; the default training source and the demo's corpus.

A document (style "compact", task "niah", 3 distractor keys):

    The grass is green. The sky is blue. ... One of the special magic numbers for
    quiet-lantern is: 5203911. A brave fox waits near the old bridge. ... One of the
    special magic numbers for calm-river is: 8816342. ... The sun is yellow. Here we go.
    What is the special magic number for calm-river mentioned in the provided text? The
    special magic number for calm-river mentioned in the provided text is 8816342.

Document i is a pure function of (config, i). `SyntheticDocument.answer_spans` holds the
character spans of the answer value(s) after the question, and `prompt_len` where the answer
starts (`text[:prompt_len]` is a ready evaluation prompt, `answer` the expected continuation).
The loader turns the spans into `answer_mask` (see DataConfig.emit_answer_mask) so a trainer
can up-weight answer tokens. Wording: templates.py; filler: filler.py; format: docs/data.md.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from longctx.base.errors import UserError
from longctx.data.filler import filler_text
from longctx.data.synthetic_config import SYNTHETIC_TASKS, SyntheticConfig, fallback_chain
from longctx.data.templates import (
    NEEDLE,
    RECALL_ENTRY,
    TEMPLATES,
    head_and_question,
    min_document_chars,
    passkey_digits,
)
from longctx.data.words import WORD_PAIRS

log = logging.getLogger(__name__)

__all__ = ["SyntheticDocument", "SyntheticCorpus", "generate_document"]

Needle = Tuple[str, bool]  # (needle text, is it about the queried key)
Asked = Tuple[str, str, str]  # a distractor asked before the final question: (key, value, its needle)
Placed = Tuple[int, float, str, bool]  # (filler position, tie-break, needle text, queried)


@dataclass
class SyntheticDocument:
    text: str
    task: str  # "niah" | "multivalue" | "passkey" | "recall"
    answer: str  # the expected continuation of text[:prompt_len], e.g. " 8816342."
    prompt_len: int  # text[:prompt_len] ends with the answer prefix
    answer_spans: List[Tuple[int, int]]  # [start, end) char spans of the answered values (earlier questions first)
    key: Optional[str]  # the queried key (None for passkey)
    values: List[str]  # the queried value(s), in answer order
    keys: List[str] = field(default_factory=list)  # all keys planted (queried first)
    needle_spans: List[Tuple[int, int]] = field(default_factory=list)  # spans of queried needles
    distance: int = 0  # chars from the end of the farthest queried needle to the question


@dataclass
class _Facts:
    """What a niah / multivalue / passkey document states and asks, before layout."""

    needles: List[Needle]
    key: Optional[str]
    values: List[str]  # the queried key's values, in planting order
    keys: List[str]  # queried first, then the distractors
    asked: List[Asked]


def _make_key(rng: random.Random, taken: set) -> str:
    # drawn like the eval suite's "words" keys (same lists), so a model trained here is
    # asked at eval time to match keys of the kind it learned to match
    while True:
        k = rng.choice(WORD_PAIRS)
        if k not in taken:
            taken.add(k)
            return k


def _number(rng: random.Random, digits: int, taken: set) -> str:
    while True:
        v = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
        if v not in taken:
            taken.add(v)
            return v


def _weighted(rng: random.Random, weights: Dict[str, float]) -> str:
    names = sorted(weights)
    return rng.choices(names, weights=[float(weights[n]) for n in names])[0]


def _draw_facts(cfg: SyntheticConfig, rng: random.Random, task: str, tpl: dict) -> _Facts:
    """The queried needle(s), then num_keys - 1 distractors (other keys, other values); a niah
    document also asks about its first queries - 1 distractors."""
    vals_taken: set = set()
    if task == "passkey":
        values = [_number(rng, passkey_digits(cfg.value_digits), vals_taken)]
        return _Facts([(tpl["passkey_needle"].format(value=values[0]), True)], None, values, [], [])
    keys_taken: set = set()
    key = _make_key(rng, keys_taken)
    n_vals = cfg.num_values if task == "multivalue" else 1
    values = [_number(rng, cfg.value_digits, vals_taken) for _ in range(n_vals)]
    facts = _Facts([(tpl["needle"].format(key=key, value=v), True) for v in values], key, values, [key], [])
    for i in range(cfg.num_keys - 1):
        k, v = _make_key(rng, keys_taken), _number(rng, cfg.value_digits, vals_taken)
        facts.keys.append(k)
        facts.needles.append((tpl["needle"].format(key=k, value=v), False))
        if task == "niah" and i < cfg.queries - 1:
            facts.asked.append((k, v, facts.needles[-1][0]))
    return facts


def _answered(tpl: dict, k: str, v: str) -> Tuple[str, int]:
    """An earlier question with its answer, and where the value starts in it."""
    q, prefix = tpl["question"]["niah"]
    ask = (q.format(key=k) + " " if q else "") + prefix.format(key=k) + " "
    return ask + v + ".", len(ask)


def _render_tail(tpl: dict, asked: List[Asked], final_q: str) -> Tuple[str, List[Tuple[int, int]]]:
    """The earlier questions answered in turn, then the final question; the answers' spans."""
    text, spans = "", []
    for k, v, _ in asked:
        qa, at = _answered(tpl, k, v)
        spans.append((len(text) + 1 + at, len(text) + 1 + at + len(v)))
        text += "\n" + qa
    return text + final_q, spans


def _fit(facts: _Facts, tpl: dict, head: str, final_q: str, answer: str, length_chars: int):
    """Drop what does not fit length_chars: distractors first (never a queried needle), then
    earlier questions with their needles; each needle costs its length + 2 separators at most.
    Returns (tail, the tail's answer spans, characters taken by all but needles and filler)."""
    while True:
        tail, asked_spans = _render_tail(tpl, facts.asked, final_q)
        fixed = len(head) + len(tail) + len(answer)
        if not facts.needles or fixed + sum(len(n) + 2 for n, _ in facts.needles) <= length_chars:
            break
        protected = {n for _, _, n in facts.asked}
        drop = [i for i, (n, queried) in enumerate(facts.needles) if not queried and n not in protected]
        if drop:
            facts.needles.pop(drop[-1])
        elif facts.asked:
            facts.asked.pop()
        else:
            break
    if facts.key is not None:
        facts.keys = facts.keys[: 1 + sum(1 for _, queried in facts.needles if not queried)]
    return tail, asked_spans, fixed


def _place(rng: random.Random, needles: List[Needle], filler: str, lo_d: Optional[int],
           hi_d: Optional[int]) -> List[Placed]:
    """Needles at sentence starts of the filler (or its ends), sorted by position; with a
    distance range the queried ones go where they sit closest to a drawn distance."""
    bounds = [0] + [i + 2 for i in range(len(filler) - 1) if filler[i] == "." and filler[i + 1] == " "]
    bounds.append(len(filler))
    placed: List[Placed] = []
    targeted = lo_d is not None or hi_d is not None
    # needles on the same insertion point are ordered at random: a fixed order (queried first)
    # lets a model score by copying the first needle instead of matching the key, since short
    # documents have only a few insertion points
    for needle, queried in needles:
        if not (queried and targeted):
            placed.append((rng.choice(bounds), rng.random(), needle, queried))
    for needle, queried in needles:
        if queried and targeted:
            d = rng.randint(lo_d or 0, max(lo_d or 0, hi_d if hi_d is not None else len(filler)))

            def distance_at(b):  # chars from this needle's end to the question, if put at b
                return len(filler) - b + sum(len(n) + 1 for p, _, n, _ in placed if p >= b)

            pos = min(bounds, key=lambda b: (abs(distance_at(b) - d), b))
            placed.append((pos, -1, needle, queried))  # before any needle at the same place
    placed.sort()
    return placed


def _weave(head: str, filler: str, placed: List[Placed], sep: str) -> Tuple[str, List[Tuple[int, int]]]:
    """head + filler with each needle inserted at its position, set off by `sep`; the text and
    the queried needles' spans."""
    body, last = head, 0
    needle_spans: List[Tuple[int, int]] = []
    for pos, _, needle, queried in placed:
        body += filler[last:pos]
        last = pos
        if body.endswith(" "):  # the filler's space before the needle becomes the separator
            body = body[:-1]
        if len(body) > len(head) and not body.endswith("\n"):
            body += sep
        if queried:
            needle_spans.append((len(body), len(body) + len(needle)))
        body += needle + sep
    body += filler[last:]
    return body.rstrip(" \n"), needle_spans


def generate_document(
    cfg: SyntheticConfig,
    index: int,
    *,
    length_chars: Optional[int] = None,
    task: Optional[str] = None,
    distance: Optional[int] = None,
    style: str = "compact",
) -> SyntheticDocument:
    """Document `index` of the corpus `cfg`, `length_chars` characters long (not counting
    BOS/EOS; exactly, unless the needles and question alone are longer). `task` and
    `distance` (chars between the queried needle and the question) override the draws."""
    rng = random.Random(f"longctx-synthetic:{cfg.seed}:{index}")
    if length_chars is None:
        lo = cfg.length_min if cfg.length_min is not None else 128
        hi = cfg.length_max if cfg.length_max is not None else 256
        length_chars = rng.randint(lo, hi)
    task = task or _weighted(rng, cfg.task_mix())
    if task == "recall":
        return _recall_document(cfg, rng, length_chars)
    tpl = TEMPLATES[style]
    facts = _draw_facts(cfg, rng, task, tpl)
    head, final_q = head_and_question(tpl, task, facts.key)
    tail, asked_spans, fixed = _fit(facts, tpl, head, final_q, " " + ", ".join(facts.values) + ".", length_chars)
    n_filler = max(0, length_chars - fixed - sum(len(n) + 2 for n, _ in facts.needles))
    filler = filler_text(rng, cfg.filler, n_filler)
    lo_d = cfg.distance_min if distance is None else distance
    hi_d = cfg.distance_max if distance is None else distance
    placed = _place(rng, facts.needles, filler, lo_d, hi_d)
    values = facts.values
    # the answer lists the values in the order their needles appear (the eval scores any order;
    # text order makes "next needle of this key" the rule instead of an arbitrary permutation)
    if len(values) > 1:
        text_order = [n for _, _, n, queried in placed if queried]
        values.sort(key=lambda v: next(i for i, n in enumerate(text_order) if f" {v}." in n))
    answer = " " + ", ".join(values) + "."
    # needles on lines of their own: drawn from a separate stream, so the document is the same
    # text with some spaces turned into newlines (and line_breaks=0 changes nothing)
    sep = " "
    if cfg.line_breaks > 0 and random.Random(f"longctx-synthetic-lines:{cfg.seed}:{index}").random() < cfg.line_breaks:
        sep = "\n"
    body, needle_spans = _weave(head, filler, placed, sep)
    deficit = length_chars - len(body) - len(tail) - len(answer)
    if deficit > 1:  # top up towards the target with more filler
        more = filler_text(rng, cfg.filler, deficit - 1)
        if more:
            body += (sep if placed and body.endswith(placed[-1][2]) else " ") + more.rstrip(" ")
    prompt = body + tail
    spans = [(len(body) + a, len(body) + b) for a, b in asked_spans]
    at = len(prompt) + 1
    for v in values:
        spans.append((at, at + len(v)))
        at += len(v) + 2
    farthest = min((s for s, _ in needle_spans), default=0)
    end_of_needle = max((e for s, e in needle_spans if s == farthest), default=0)
    return SyntheticDocument(
        text=prompt + answer, task=task, answer=answer, prompt_len=len(prompt), answer_spans=spans,
        key=facts.key, values=values, keys=facts.keys, needle_spans=needle_spans,
        distance=max(0, len(body) - end_of_needle),
    )


def _recall_document(cfg: SyntheticConfig, rng: random.Random, length_chars: int) -> SyntheticDocument:
    """Entries "K is: V." in a random order, one per value (a key has num_values values with
    probability recall_multivalue, like a multivalue document's key, else one); a newline;
    then every key once, in a random order, with its values in text order ("K is: V1, V2.").
    As many keys as fit; filler pads the front to length_chars. The values after the newline
    are the answers, the last key's the document's answer."""
    keys_taken: set = set()
    vals_taken: set = set()
    keyed: List[Tuple[str, List[str]]] = []
    used = 1  # the newline between the lists
    while True:
        k = _make_key(rng, keys_taken)
        multi = cfg.recall_multivalue > 0 and cfg.num_values > 1 and rng.random() < cfg.recall_multivalue
        vs = [_number(rng, cfg.value_digits, vals_taken) for _ in range(cfg.num_values if multi else 1)]
        # each entry and the answer line, with a separator each
        cost = (sum(len(RECALL_ENTRY.format(key=k, value=v)) + 1 for v in vs)
                + len(RECALL_ENTRY.format(key=k, value=", ".join(vs))) + 1)
        if keyed and used + cost > length_chars:
            break
        keyed.append((k, vs))
        used += cost
    entries = [(k, v) for k, vs in keyed for v in vs]
    rng.shuffle(entries)
    in_text_order: Dict[str, List[str]] = {}
    for k, v in entries:
        in_text_order.setdefault(k, []).append(v)
    asked = [(k, in_text_order[k]) for k, _ in keyed]
    rng.shuffle(asked)
    filler = filler_text(rng, cfg.filler, length_chars - used)
    defined = filler + " " if filler else ""
    entry_spans: Dict[str, List[Tuple[int, int]]] = {}
    for k, v in entries:
        entry = RECALL_ENTRY.format(key=k, value=v)
        entry_spans.setdefault(k, []).append((len(defined), len(defined) + len(entry)))
        defined += entry + " "
    text = defined.rstrip(" ") + "\n"
    spans: List[Tuple[int, int]] = []
    for i, (k, vs) in enumerate(asked):
        if i:
            text += " "
        query_start = len(text)
        text += RECALL_ENTRY.format(key=k, value="")[:-1]  # "K is: "
        for j, v in enumerate(vs):
            spans.append((len(text), len(text) + len(v)))
            text += v + (", " if j < len(vs) - 1 else ".")
    key, values = asked[-1]
    first_answer = len(spans) - len(values)
    needle_spans = entry_spans[key]
    return SyntheticDocument(
        text=text, task="recall", answer=text[spans[first_answer][0] - 1:], prompt_len=spans[first_answer][0] - 1,
        answer_spans=spans, key=key, values=values, keys=[key] + [k for k, _ in keyed if k != key],
        needle_spans=needle_spans, distance=query_start - min(e for _, e in needle_spans),
    )


class SyntheticCorpus:
    """`cfg.num_docs` documents, sized in tokens of `tokenizer` (BOS/EOS included).

    With the byte tokenizer lengths are exact; with another tokenizer the character budget is
    scaled by a measured chars-per-token ratio and shrunk until the document fits."""

    def __init__(self, cfg: Optional[SyntheticConfig] = None, *, seq_len: int = 256, tokenizer=None,
                 add_bos: bool = True, add_eos: bool = True, style: Optional[str] = None):
        self.cfg = cfg or SyntheticConfig()
        self.style = style or self.cfg.style
        self.length_min, self.length_max = self.cfg.length_bounds(seq_len)
        self.tokenizer = tokenizer
        self.n_special = int(add_bos) + int(add_eos)
        self._byte = tokenizer is None or getattr(tokenizer, "name", None) == "byte"
        self._ratio = 1.0
        if not self._byte:
            sample = (filler_text(random.Random(0), self.cfg.filler, 4000) + " "
                      + NEEDLE.format(key="calm-river", value="1234567"))
            self._ratio = len(sample) / max(1, len(tokenizer.encode(sample)))
        # tasks whose shortest document does not fit length_max fall back to a smaller one
        self.min_tokens = {t: int(min_document_chars(self.cfg, t, self.style) / self._ratio) + self.n_special
                           for t in SYNTHETIC_TASKS}
        weighted = [t for t, w in self.cfg.task_mix().items() if float(w) > 0]
        self.fallback = {}
        for t in weighted:
            chain = fallback_chain(t)
            fit = next((c for c in chain if self.min_tokens[c] <= self.length_max), None)
            if fit is None:
                raise UserError(
                    f"synthetic.length_max: {self.length_max} tokens is too short for a {t!r} document in "
                    f"style {self.style!r} (needs ~{self.min_tokens[t]})"
                )
            self.fallback[t] = fit
        changed = {t: f for t, f in self.fallback.items() if t != f}
        if changed:
            log.warning("synthetic corpus: documents of at most %d tokens are too short for %s; those "
                        "documents become %s", self.length_max, ", ".join(changed), ", ".join(changed.values()))

    def __len__(self) -> int:
        return self.cfg.num_docs

    def target_tokens(self, index: int) -> int:
        rng = random.Random(f"longctx-synthetic-length:{self.cfg.seed}:{index}")
        return rng.randint(self.length_min, self.length_max)

    def __getitem__(self, index: int) -> SyntheticDocument:
        if not 0 <= index < len(self):
            raise IndexError(index)
        target = self.target_tokens(index) - self.n_special
        task = _weighted(random.Random(f"longctx-synthetic-task:{self.cfg.seed}:{index}"), self.cfg.task_mix())
        task = self.fallback[task]
        if self._byte:
            target = max(target, min(self.length_max - self.n_special, min_document_chars(self.cfg, task, self.style)))
            return generate_document(self.cfg, index, length_chars=target, task=task, style=self.style)
        budget = int(target * self._ratio)
        for _ in range(4):
            doc = generate_document(self.cfg, index, length_chars=budget, task=task, style=self.style)
            n = len(self.tokenizer.encode(doc.text))
            if n <= target:
                return doc
            budget = int(budget * target / n) - 2
        return doc

