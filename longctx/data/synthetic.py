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
can up-weight answer tokens. Format details: docs/data.md.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from longctx.data.config import SYNTHETIC_TASKS, SyntheticConfig, fallback_chain
from longctx.data.words import ADJECTIVES, LONGEST_PAIR, NOUNS, WORD_PAIRS
from longctx.errors import UserError

log = logging.getLogger(__name__)

__all__ = ["SyntheticConfig", "SyntheticDocument", "SyntheticCorpus", "generate_document", "min_document_chars", "TEMPLATES", "NOISE"]

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NOISE_SENTENCES = [s.strip() + "." for s in NOISE.split(".") if s.strip()]

# RULER's needle / question / answer-prefix wording, as the eval suite renders it.
# "ruler": RULER's templates with their instruction preamble; "compact": the same needles,
# no preamble, the short question of the eval suite's compact style; "short": shorter
# needles and no question, so that documents of 64-128 tokens still have room for filler.
_NEEDLE = "One of the special magic numbers for {key} is: {value}."
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
        "needle": _NEEDLE, "passkey_needle": _PASSKEY_NEEDLE,
        "question": {
            "niah": ("What is the special magic number for {key} mentioned in the provided text?",
                     "The special magic number for {key} mentioned in the provided text is"),
            "multivalue": ("What are all the special magic numbers for {key} mentioned in the provided text?",
                           "The special magic numbers for {key} mentioned in the provided text are"),
            "passkey": _PASSKEY_Q,
        },
    },
    "compact": {
        "intro": {}, "needle": _NEEDLE, "passkey_needle": _PASSKEY_NEEDLE,
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

_ADJ = ("quiet brave calm bright old young silver golden hidden gentle swift tall tiny wide "
        "happy lucky rapid steady sunny windy wooden wild warm cold sharp soft proud polite "
        "noble clever dusty rusty misty lively loyal humble fierce eager curious bold ancient "
        "crisp fancy frozen giant grand green honest icy jolly keen lazy merry narrow purple "
        "rough royal silent simple smooth spicy sweet velvet violet").split()
_NOUN = ("river lantern fox bridge garden mountain harbor forest castle meadow window kettle "
         "violin anchor basket candle compass desert dragon feather island jungle ladder mirror "
         "orchard palace pencil planet rabbit saddle shadow teapot temple tiger tower valley "
         "wagon whale wizard acorn badger beacon cactus cellar comet cottage falcon glacier "
         "hammer helmet lagoon magnet marble pebble quarry ribbon rocket canyon tunnel walrus").split()
_VERB = ("waits sleeps shines grows rests drifts sings glows wanders hums turns sways "
         "stands sits hides floats dances rolls leans shivers").split()
_PLACE = ("near the old bridge", "by the river", "in the garden", "under the tall tree",
          "behind the red barn", "beside the quiet lake", "on the hill", "at the market",
          "in the small village", "along the narrow road", "inside the warm kitchen",
          "across the wide field")
_TIME = ("in the morning", "at noon", "every evening", "after the rain", "before sunrise",
         "late at night", "in early spring", "during the long winter", "on most days")
_NAMES = ("Alice", "Bruno", "Clara", "Daniel", "Elena", "Farid", "Grace", "Hugo", "Ines",
          "Jonas", "Kiri", "Lena", "Marco", "Nora", "Oskar", "Priya")


def _varied_sentence(rng: random.Random) -> str:
    a, n, n2 = rng.choice(_ADJ), rng.choice(_NOUN), rng.choice(_NOUN)
    form = rng.randrange(6)
    if form == 0:
        return f"The {a} {n} {rng.choice(_VERB)} {rng.choice(_PLACE)}."
    if form == 1:
        return f"{rng.choice(_NAMES)} saw a {a} {n} {rng.choice(_TIME)}."
    if form == 2:
        return f"Every {n} has a {a} {n2}."
    if form == 3:
        return f"A {a} {n} {rng.choice(_VERB)} {rng.choice(_TIME)}."
    if form == 4:
        return f"{rng.choice(_NAMES)} and {rng.choice(_NAMES)} walk {rng.choice(_PLACE)}."
    return f"The {n} is {a}, and the {n2} is {rng.choice(_ADJ)}."


def _filler(rng: random.Random, kind: str, n_chars: int) -> str:
    """At most n_chars characters of filler, short of it by less than a word (the last
    sentence may be cut, at a word boundary)."""
    if n_chars <= 0:
        return ""
    parts: List[str] = []
    total = -1
    noise_i = rng.randrange(len(NOISE_SENTENCES))
    while total < n_chars:
        use_noise = kind == "noise" or (kind == "mixed" and rng.random() < 0.5)
        if use_noise:  # RULER's passage, in order, from a random starting sentence
            s = NOISE_SENTENCES[noise_i % len(NOISE_SENTENCES)]
            noise_i += 1
        else:
            s = _varied_sentence(rng)
        parts.append(s)
        total += len(s) + 1
    text = " ".join(parts)
    if len(text) > n_chars:
        text = text[: n_chars + 1]
        text = text[: text.rfind(" ")] if " " in text else ""
    return text


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

    def answer_spans_with_separators(self) -> List[Tuple[int, int]]:
        """answer_spans, each extended by the separator that follows its value (", " lists go
        on, "." ends the answer): the characters that decide how many values are given."""
        return [(a, b + 1) if b < len(self.text) and self.text[b] in ",." else (a, b)
                for a, b in self.answer_spans]


def _make_key(rng: random.Random, taken: set) -> str:
    # drawn like the eval suite's "words" keys (same lists), so a model trained here is
    # asked at eval time to match keys of the kind it learned to match
    while True:
        k = rng.choice(WORD_PAIRS)
        if k not in taken:
            taken.add(k)
            return k


def _make_similar_key(rng: random.Random, taken: set, like: str) -> str:
    """A new key that shares the adjective or the noun of `like` (the other word random)."""
    adjective, noun = like.split("-", 1)
    keep_noun = rng.random() < 0.5
    for _ in range(100):
        k = f"{rng.choice(ADJECTIVES)}-{noun}" if keep_noun else f"{adjective}-{rng.choice(NOUNS)}"
        if k not in taken:
            taken.add(k)
            return k
    return _make_key(rng, taken)


def _number(rng: random.Random, digits: int, taken: set) -> str:
    while True:
        v = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
        if v not in taken:
            taken.add(v)
            return v


def _weighted(rng: random.Random, weights: Dict[str, float]) -> str:
    names = sorted(weights)
    return rng.choices(names, weights=[float(weights[n]) for n in names])[0]


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
    keys_taken: set = set()
    vals_taken: set = set()
    # needles: (text, is_queried); values of the queried key in planting order
    needles: List[Tuple[str, bool]] = []
    key = None
    values: List[str] = []
    keys: List[str] = []
    asked: List[Tuple[str, str, str]] = []  # distractors asked before the final question: (key, value, needle)
    if task == "passkey":
        values = [_number(rng, max(1, min(cfg.value_digits, 5)), vals_taken)]
        needles.append((tpl["passkey_needle"].format(value=values[0]), True))
        q, prefix = tpl["question"]["passkey"]
    else:
        key = _make_key(rng, keys_taken)
        keys.append(key)
        n_vals = cfg.num_values if task == "multivalue" else 1
        values = [_number(rng, cfg.value_digits, vals_taken) for _ in range(n_vals)]
        needles += [(tpl["needle"].format(key=key, value=v), True) for v in values]
        for i in range(cfg.num_keys - 1):  # distractors: other keys, other values
            hard = cfg.hard_keys > 0 and rng.random() < cfg.hard_keys
            k = _make_similar_key(rng, keys_taken, key) if hard else _make_key(rng, keys_taken)
            v = _number(rng, cfg.value_digits, vals_taken)
            keys.append(k)
            needles.append((tpl["needle"].format(key=k, value=v), False))
            if task == "niah" and i < cfg.queries - 1:
                asked.append((k, v, needles[-1][0]))
        q, prefix = tpl["question"][task]
        q, prefix = q.format(key=key), prefix.format(key=key)
    intro = tpl["intro"].get(task, "")
    answer = " " + ", ".join(values) + "."
    head = intro + "\n" if intro else ""
    final_q = "\n" + (q + " " if q else "") + prefix

    qk, pk = tpl["question"]["niah"]

    def answered(k: str, v: str) -> Tuple[str, int]:  # an earlier question with its answer, where v starts
        ask = (qk.format(key=k) + " " if qk else "") + pk.format(key=k) + " "
        return ask + v + ".", len(ask)

    def render_tail():  # earlier questions answered in turn, then the final question
        text, spans = "", []
        for k, v, _ in asked:
            qa, at = answered(k, v)
            spans.append((len(text) + 1 + at, len(text) + 1 + at + len(v)))
            text += "\n" + qa
        return text + final_q, spans

    # answered questions inside the text (a separate stream: the same document otherwise)
    inline = bool(asked) and cfg.inline_queries > 0 and \
        random.Random(f"longctx-synthetic-inline:{cfg.seed}:{index}").random() < cfg.inline_queries
    # needles that do not fit are dropped, distractors first (never the queried ones), then
    # earlier questions with their needles; each needle costs its length + 2 separators at most
    # (an inline question too: one more than its leading newline in the tail)
    while True:
        tail, asked_spans = render_tail()
        fixed = len(head) + len(tail) + len(answer) + (len(asked) if inline else 0)
        if not needles or fixed + sum(len(n) + 2 for n, _ in needles) <= length_chars:
            break
        protected = {n for _, _, n in asked}
        drop = [i for i, (n, queried) in enumerate(needles) if not queried and n not in protected]
        if drop:
            needles.pop(drop[-1])
        elif asked:
            asked.pop()
        else:
            break
    if key is not None:
        keys = keys[: 1 + sum(1 for _, queried in needles if not queried)]
    n_filler = max(0, length_chars - fixed - sum(len(n) + 2 for n, _ in needles))
    filler = _filler(rng, cfg.filler, n_filler)
    # insertion points: sentence starts in the filler, and its two ends
    bounds = [0] + [i + 2 for i in range(len(filler) - 1) if filler[i] == "." and filler[i + 1] == " "]
    bounds.append(len(filler))
    lo_d = cfg.distance_min if distance is None else distance
    hi_d = cfg.distance_max if distance is None else distance
    placed: List[Tuple[int, float, str, bool]] = []  # (position, tie-break, needle, queried)
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
    units = list(placed)  # (position, tie-break, text, queried: True | False | None = a question)
    qa_answers: Dict[str, Tuple[int, int]] = {}  # inline question -> its answer's span in it
    if inline:
        tail = final_q
        qrng = random.Random(f"longctx-synthetic-inline-at:{cfg.seed}:{index}")
        at_needle = {n: p for p, _, n, _ in placed}
        for k, v, needle in asked:  # each at a random point after its needle (after the needles there)
            qa, at = answered(k, v)
            qa_answers[qa] = (at, at + len(v))
            units.append((qrng.choice([b for b in bounds if b >= at_needle[needle]]), 1 + qrng.random(), qa, None))
        units.sort()
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
    body = head
    last = 0
    needle_spans: List[Tuple[int, int]] = []
    inline_spans: List[Tuple[int, int]] = []  # the answers of inline questions
    for pos, _, unit, queried in units:
        body += filler[last:pos]
        last = pos
        if body.endswith(" "):  # the filler's space before the needle becomes the separator
            body = body[:-1]
        if len(body) > len(head) and not body.endswith("\n"):
            body += sep
        if queried is True:
            needle_spans.append((len(body), len(body) + len(unit)))
        elif queried is None:
            a, b = qa_answers[unit]
            inline_spans.append((len(body) + a, len(body) + b))
        body += unit + sep
    body += filler[last:]
    body = body.rstrip(" \n")
    deficit = length_chars - len(body) - len(tail) - len(answer)
    if deficit > 1:  # top up towards the target with more filler
        more = _filler(rng, cfg.filler, deficit - 1)
        if more:
            body += (sep if units and body.endswith(units[-1][2]) else " ") + more.rstrip(" ")
    prompt = body + tail
    text = prompt + answer
    spans = inline_spans if inline else [(len(body) + a, len(body) + b) for a, b in asked_spans]
    at = len(prompt) + 1
    for v in values:
        spans.append((at, at + len(v)))
        at += len(v) + 2
    farthest = min((s for s, _ in needle_spans), default=0)
    end_of_needle = max((e for s, e in needle_spans if s == farthest), default=0)
    return SyntheticDocument(
        text=text, task=task, answer=answer, prompt_len=len(prompt), answer_spans=spans,
        key=key, values=values, keys=keys, needle_spans=needle_spans,
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
        cost = sum(len(RECALL_ENTRY.format(key=k, value=v)) + 1 for v in vs) + len(RECALL_ENTRY.format(key=k, value=", ".join(vs))) + 1
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
    filler = _filler(rng, cfg.filler, length_chars - used)
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


def min_document_chars(cfg: SyntheticConfig, task: str, style: str) -> int:
    """Characters (BOS/EOS excluded) of the shortest `task` document: queried needle(s),
    question and answer, no distractor, no filler (longest key, as a bound)."""
    if task == "recall":  # one single-value entry, asked once
        return 2 * (len(RECALL_ENTRY.format(key=LONGEST_PAIR, value="9" * cfg.value_digits)) + 1) + 1
    tpl = TEMPLATES[style]
    key = LONGEST_PAIR
    if task == "passkey":
        values = ["9" * max(1, min(cfg.value_digits, 5))]
        needles = [tpl["passkey_needle"].format(value=values[0])]
    else:
        values = ["9" * cfg.value_digits] * (cfg.num_values if task == "multivalue" else 1)
        needles = [tpl["needle"].format(key=key, value=v) for v in values]
    q, prefix = tpl["question"][task]
    intro = tpl["intro"].get(task, "")
    head = intro + "\n" if intro else ""
    tail = "\n" + (q.format(key=key) + " " if q else "") + prefix.format(key=key)
    answer = " " + ", ".join(values) + "."
    return len(head) + len(tail) + len(answer) + sum(len(n) + 2 for n in needles)


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
            sample = _filler(random.Random(0), self.cfg.filler, 4000) + " " + _NEEDLE.format(key="calm-river", value="1234567")
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

