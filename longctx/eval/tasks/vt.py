"""Variable tracking (RULER "vt"): follow a chain of assignments hidden in noise.

"VAR ABCDE = 12345", then "VAR FGHIJ = VAR ABCDE ", ... (num_chains=1, num_hops=4); the model
must list every variable that ends up holding the value. As in RULER, a one-shot example
(fitted to 500 tokens, 3-letter names) precedes the question. Scored with string_match_all.
"""
from __future__ import annotations

import random
import string
from typing import Optional

from longctx.eval.haystack import NOISE
from longctx.eval.tasks.base import Draft, Task, TaskOptions, count_tokens_fn, fit_draft
from longctx.eval.tasks.layout import insert_at

_NOISE_UNIT = NOISE + "\n"
_NOISE_WORDS = NOISE.split(" ")
_TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
             "{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.")
# RULER's prefix, typo included, so that prompts (and numbers) stay comparable.
_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
           "are assgined the value {query}, they are: ")
ICL_TOKENS = 500


def _chains(rng: random.Random, num_chains: int, num_hops: int, name_len: int):
    names: list[str] = []
    seen: set = set()
    while len(names) < num_chains * (num_hops + 1):
        v = "".join(rng.choices(string.ascii_uppercase, k=name_len))
        if v not in seen:
            seen.add(v)
            names.append(v)
    out_vars, out_chains = [], []
    for c in range(num_chains):
        vs = names[c * (num_hops + 1):(c + 1) * (num_hops + 1)]
        chain = [f"VAR {vs[0]} = {rng.randint(10000, 99999)}"]
        chain += [f"VAR {vs[j + 1]} = VAR {vs[j]} " for j in range(num_hops)]
        out_vars.append(vs)
        out_chains.append(chain)
    return out_vars, out_chains


class VtDraft(Draft):
    def __init__(self, rng: random.Random, num_chains: int, num_hops: int, name_len: int, icl: str):
        vars_, chains = _chains(rng, num_chains, num_hops, name_len)
        self.chains = chains
        self.fracs = [sorted(rng.random() for _ in chain) for chain in chains]
        self.value = chains[0][0].split("=")[-1].strip()
        self.outputs = vars_[0]
        self.answer_prefix = _PREFIX.format(num_v=num_hops + 1, query=self.value)
        self.icl = icl
        self.n_min = 0
        self.meta = {"haystack": "noise"}

    def context(self, n: int, fill: int) -> str:
        units = [_NOISE_UNIT] * n
        if fill:
            units.append(" ".join(_NOISE_WORDS[:fill]) + "\n")
        inserts = []
        for chain, fracs in zip(self.chains, self.fracs):
            inserts += [(min(int(u * n), n), stmt) for u, stmt in zip(fracs, chain)]
        return " ".join(insert_at(units, inserts)).replace(". \n", ".\n")

    def render(self, n: int, fill: int) -> str:
        return self.icl + _TEMPLATE.format(context=self.context(n, fill), query=self.value)

    def fill_max(self, n: int) -> int:
        return len(_NOISE_WORDS) - 1


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
        key = (id(tokenizer), seed, options)
        if key in self._icl:
            return self._icl[key]
        rng = random.Random(f"{seed}-vt-icl")
        draft = VtDraft(rng, self.num_chains, min(10, self.num_hops), 3, icl="")
        count = count_tokens_fn(tokenizer, options)
        answer = " " + " ".join(draft.outputs)
        target = ICL_TOKENS - self.max_new_tokens(tokenizer, options) - count(answer)
        fitted = fit_draft(draft, count, lambda t: t, target)
        if fitted is None:
            raise RuntimeError("vt: the one-shot example does not fit in 500 tokens")
        self._icl[key] = fitted.text + draft.answer_prefix + " ".join(draft.outputs) + "\n\n"
        return self._icl[key]

    def draft(self, rng: random.Random, target_length: int, options: TaskOptions,
              depth: Optional[float], shared=None) -> VtDraft:
        return VtDraft(rng, self.num_chains, self.num_hops, 5, icl=shared or "")
