"""Filler text of the synthetic corpus: RULER's noise passage and varied sentences drawn from
small word lists, cut to a character budget."""
from __future__ import annotations

import random
from typing import List

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NOISE_SENTENCES = [s.strip() + "." for s in NOISE.split(".") if s.strip()]
FILLER_KINDS = ("noise", "varied", "mixed")

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


def varied_sentence(rng: random.Random) -> str:
    """One sentence of six random forms over the word lists above (no digits)."""
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


def filler_text(rng: random.Random, kind: str, n_chars: int) -> str:
    """At most n_chars characters of `kind` filler (one of FILLER_KINDS), short of it by less
    than a word (the last sentence may be cut, at a word boundary)."""
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
            s = varied_sentence(rng)
        parts.append(s)
        total += len(s) + 1
    text = " ".join(parts)
    if len(text) > n_chars:
        text = text[: n_chars + 1]
        text = text[: text.rfind(" ")] if " " in text else ""
    return text
