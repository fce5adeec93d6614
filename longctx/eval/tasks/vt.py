"""Variable tracking (RULER "vt"): follow a chain of assignments hidden in noise.

"VAR ABCDE = 12345", then "VAR FGHIJ = VAR ABCDE ", ... (num_chains=1, num_hops=4), each
statement on its own line between the noise passages; the model must list every variable that
ends up holding the value. As in RULER, a one-shot example precedes the question: its layout
(a question fitted to 500 tokens, 3-letter names, value 12345) is drawn once per seed, and each
sample re-draws its names and value. Scored with string_match_all.
"""
from __future__ import annotations

import random
import re
import string
from typing import Optional

from longctx.eval.haystack import NOISE
from longctx.eval.tasks.base import Draft, Task, TaskOptions, count_tokens_fn, fit_draft
from longctx.eval.tasks.layout import insert_at

_NOISE_WORDS = NOISE.split(" ")
_TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
             "{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.")
_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
           "are assigned the value {query}, they are: ")
ICL_TOKENS = 500
ICL_VALUE = "12345"


def _names(rng: random.Random, count: int, name_len: int, exclude=("VAR",)) -> list[str]:
    names: list[str] = []
    seen: set = set(exclude)
    while len(names) < count:
        v = "".join(rng.choices(string.ascii_uppercase, k=name_len))
        if v not in seen:
            seen.add(v)
            names.append(v)
    return names


def _chains(rng: random.Random, num_chains: int, num_hops: int, name_len: int, value: Optional[str] = None):
    names = _names(rng, num_chains * (num_hops + 1), name_len)
    out_vars, out_chains = [], []
    for c in range(num_chains):
        vs = names[c * (num_hops + 1):(c + 1) * (num_hops + 1)]
        chain = [f"VAR {vs[0]} = {value or rng.randint(10000, 99999)}"]
        chain += [f"VAR {vs[j + 1]} = VAR {vs[j]} " for j in range(num_hops)]
        out_vars.append(vs)
        out_chains.append(chain)
    return out_vars, out_chains


class VtDraft(Draft):
    """One chain layout; `icl` (the one-shot example, or "") goes before the task text."""

    def __init__(self, rng: random.Random, num_chains: int, num_hops: int, name_len: int, icl: str = "",
                 value: Optional[str] = None):
        vars_, chains = _chains(rng, num_chains, num_hops, name_len, value)
        self.chains = chains
        self.fracs = [sorted(rng.random() for _ in chain) for chain in chains]
        self.value = chains[0][0].split("=")[-1].strip()
        self.outputs = vars_[0]
        self.answer_prefix = _PREFIX.format(num_v=num_hops + 1, query=self.value)
        self.icl = icl
        self.n_min = 0
        self.meta = {"haystack": "noise"}

    def context(self, n: int, fill: int) -> str:
        # RULER: noise passages and chain statements, one per line
        units = [NOISE] * n
        if fill:
            units.append(" ".join(_NOISE_WORDS[:fill]))
        inserts = []
        for chain, fracs in zip(self.chains, self.fracs):
            inserts += [(min(int(u * n), n), stmt) for u, stmt in zip(fracs, chain)]
        return "\n".join(insert_at(units, inserts)).replace(". \n", ".\n")

    def render(self, n: int, fill: int) -> str:
        return self.icl + _TEMPLATE.format(context=self.context(n, fill), query=self.value)

    def fill_max(self, n: int) -> int:
        return len(_NOISE_WORDS) - 1


def redraw_example(example: str, names: list[str], rng: random.Random) -> str:
    """The one-shot example with fresh names (same lengths) and a fresh value, as RULER's
    randomize_icl does per sample (names swapped all at once, so a new name never clobbers an
    old one)."""
    fresh = _names(rng, len(names), len(names[0]), exclude=("VAR", *names))
    mapping = dict(zip(names, fresh))
    out = re.sub(r"\b(" + "|".join(names) + r")\b", lambda m: mapping[m.group(1)], example)
    return out.replace(ICL_VALUE, str(rng.randint(10000, 99999)))


class VtTask(Task):
    name = "vt"
    family = "vt"
    metric = "string_match_all"
    ruler_max_new_tokens = 30
    description = "variable tracking: 1 chain, 4 hops, noise haystack, one-shot example"

    def __init__(self, num_chains: int = 1, num_hops: int = 4):
        self.num_chains, self.num_hops = num_chains, num_hops
        self._icl: dict = {}

    def compact_max_new_tokens(self, tokenizer, options: TaskOptions) -> int:
        return self.ruler_max_new_tokens

    def prepare(self, tokenizer, target_length: int, options: TaskOptions, seed: int):
        """(one-shot example text, its variable names): RULER's example question (template and
        answer prefix) fitted to 500 tokens, then " " + the answer and a newline."""
        key = (id(tokenizer), seed, options)
        if key in self._icl:
            return self._icl[key]
        rng = random.Random(f"{seed}-vt-icl")
        hops = min(10, self.num_hops)
        draft = VtDraft(rng, self.num_chains, hops, 3, value=ICL_VALUE)
        count = count_tokens_fn(tokenizer, options)
        fitted = fit_draft(draft, count, lambda t: t, ICL_TOKENS)
        if fitted is None:
            raise RuntimeError("vt: the one-shot example does not fit in 500 tokens")
        example = fitted.text + draft.answer_prefix + " " + " ".join(draft.outputs) + "\n"
        self._icl[key] = (example, list(draft.outputs))
        return self._icl[key]

    def draft(self, rng: random.Random, target_length: int, options: TaskOptions,
              depth: Optional[float], shared=None) -> VtDraft:
        icl = ""
        if shared is not None:  # RULER joins the example and the question with a newline
            example, names = shared
            icl = redraw_example(example, names, random.Random(rng.getrandbits(64))) + "\n"
        return VtDraft(rng, self.num_chains, self.num_hops, 5, icl=icl)
