"""What every task shares: options, the Sample record, drafts and fitting to a token length.

A task turns a seeded ``random.Random`` into a *draft*: the random content of one sample (keys,
values, needles, the question) plus ``render(n, fill)``, which lays that content into a haystack
of ``n`` units (words, noise passages, distractor needles, documents ...) followed by ``fill``
extra filler words. The fitter then finds the largest ``n`` and ``fill`` whose prompt, plus the
task's generation budget, fits the target length in the evaluated model's tokenizer. Units are
coarse (RULER's granularity), fill is fine (a word), so prompts land within a few tokens of the
target at every length.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

from longctx.base.errors import UserError
from longctx.data.tokenizer import prepends_bos

STYLES = ("ruler", "compact")


@dataclass(frozen=True)
class TaskOptions:
    """Knobs shared by all tasks.

    style: "ruler" uses RULER's templates and budgets verbatim (comparable numbers);
        "compact" drops instruction preambles and sizes the budget to the answer, so that tiny
        models at 256-2048 tokens have room for a haystack (niah_* and passkey).
    max_new_tokens: override the task's generation budget.
    essay_path: local text corpus for the "essay" haystack (file or folder); built-in text if None.
    squad_path / hotpotqa_path: local SQuAD (v2 dev json) / HotpotQA (dev distractor json) files.
    words_path: a word list for cwe beyond the built-in words (RULER's english_words.json, a JSON
        list, or one word per line); made-up words if None.
    chat_template: a string with one "{input}" placeholder wrapping the task input (the answer
        prefix goes after it), or a preset name, see CHAT_TEMPLATES.
    num_digits: digits of numeric needle values / pass keys (default 7 / 5).
    add_bos: count (and later feed) the tokenizer's BOS token.
    """

    style: str = "ruler"
    max_new_tokens: Optional[int] = None
    essay_path: Optional[str] = None
    squad_path: Optional[str] = None
    hotpotqa_path: Optional[str] = None
    words_path: Optional[str] = None
    chat_template: Optional[str] = None
    num_digits: Optional[int] = None
    add_bos: bool = True

    def __post_init__(self):
        if self.style not in STYLES:
            raise UserError(f"eval.style: {self.style!r} is not a style; valid: {', '.join(STYLES)}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise UserError(f"eval.max_new_tokens: must be >= 1, got {self.max_new_tokens}")
        if self.num_digits is not None and not (1 <= self.num_digits <= 30):
            raise UserError(f"eval.num_digits: must be in 1..30, got {self.num_digits}")
        if self.chat_template is not None:
            resolve_chat_template(self.chat_template)


CHAT_TEMPLATES = {
    "none": "{input}",
    "llama2-chat": "[INST] {input} [/INST]",
    "llama3-chat": ("<|start_header_id|>user<|end_header_id|>\n\n{input}<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "chatml": "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n",
}


def resolve_chat_template(spec: Optional[str]) -> str:
    if spec is None:
        return "{input}"
    tpl = CHAT_TEMPLATES.get(spec, spec)
    if tpl.count("{input}") != 1:
        raise UserError(f"eval.chat_template: {spec!r} is neither a preset ({', '.join(CHAT_TEMPLATES)}) "
                        "nor a string with exactly one {input} placeholder")
    return tpl


@dataclass
class Sample:
    """One evaluation input. `prompt` is what the model reads; it continues after answer_prefix.

    `pre_template` comes before the chat-wrapped input (cwe's one-shot example, a chat turn of its own).
    """

    task: str
    index: int
    input: str
    answer_prefix: str
    outputs: list[str]
    metric: str
    target_length: int
    max_new_tokens: int
    prompt_tokens: int = 0
    depth: Optional[float] = None  # requested needle depth in [0, 1] (grid runs), else None
    stop: list[str] = field(default_factory=list)
    chat_template: str = "{input}"
    meta: dict = field(default_factory=dict)
    pre_template: str = ""

    @property
    def prompt(self) -> str:
        return self.pre_template + self.chat_template.replace("{input}", self.input) + self.answer_prefix

    @property
    def length(self) -> int:
        """Prompt tokens plus the generation budget (what must fit the target length)."""
        return self.prompt_tokens + self.max_new_tokens

    def to_dict(self) -> dict:
        d = asdict(self)
        d["length"] = self.length
        return d


class Draft:
    """Random content of one sample; `render` lays it out with a haystack of a given size."""

    outputs: list[str]
    answer_prefix: str
    pre_template: str = ""  # text before the chat-wrapped input
    n_min: int = 1
    n_max: Optional[int] = None
    meta: dict

    def render(self, n: int, fill: int) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def fill_max(self, n: int) -> int:
        return 0


class Task:
    """A task family member. Subclasses set the class attributes and implement `draft`."""

    name: str = ""
    family: str = ""
    metric: str = "string_match_all"
    ruler_max_new_tokens: int = 128
    description: str = ""

    def unavailable_reason(self, options: TaskOptions) -> Optional[str]:
        """Why this task cannot run with these options (missing data), or None."""
        return None

    def max_new_tokens(self, tokenizer, options: TaskOptions) -> int:
        if options.max_new_tokens is not None:
            return options.max_new_tokens
        if options.style == "compact":
            return self.compact_max_new_tokens(tokenizer, options)
        return self.ruler_max_new_tokens

    def compact_max_new_tokens(self, tokenizer, options: TaskOptions) -> int:
        return self.ruler_max_new_tokens

    def stop(self, options: TaskOptions) -> list[str]:
        return ["\n"] if options.style == "compact" else []

    def draft(self, rng: random.Random, target_length: int, options: TaskOptions,
              depth: Optional[float], shared=None) -> Draft:  # pragma: no cover - interface
        raise NotImplementedError

    def prepare(self, tokenizer, target_length: int, options: TaskOptions, seed: int):
        """Per-(task, length) setup shared by all samples (vt's one-shot example, QA's data);
        the result is handed to `draft` as `shared`."""
        return None


def answer_budget(tokenizer, answers: Sequence[str], slack: int = 4) -> int:
    """Tokens needed to write `answers` comma-separated after a space, plus slack."""
    return len(tokenizer.encode(" " + ", ".join(answers))) + slack


# --------------------------------------------------------------------------------------------
# Fitting

def largest_fitting(f: Callable[[int], int], target: int, lo: int, hi: Optional[int],
                    guess: Optional[int] = None) -> Optional[int]:
    """Largest x in [lo, hi] with f(x) <= target for a nondecreasing f (hi None = unbounded).

    Interpolation search: f is close to linear here (tokens per haystack unit), so a handful
    of evaluations suffice; every third step bisects to bound the worst case. Returns None when
    f(lo) > target.
    """
    cache: dict[int, int] = {}

    def F(x: int) -> int:
        if x not in cache:
            cache[x] = f(x)
        return cache[x]

    if F(lo) > target:
        return None
    good, bad = lo, None
    x = guess if guess is not None else lo + 1
    step = 0
    while True:
        if hi is not None and good >= hi:
            return good
        if bad is not None and bad - good <= 1:
            return good
        x = max(x, good + 1)
        if hi is not None:
            x = min(x, hi)
        if bad is not None:
            x = min(x, bad - 1)
        if F(x) <= target:
            good = x
        else:
            bad = x
        step += 1
        if bad is None:  # extrapolate from the line through lo and good
            slope = (F(good) - F(lo)) / max(good - lo, 1)
            if slope <= 0:
                x = good * 2 + 1
                if x > 1 << 40:
                    raise RuntimeError("largest_fitting: f does not grow; cannot fit the target")
            else:
                x = good + max(1, int((target - F(good)) / slope))
        elif step % 3 == 0:
            x = (good + bad) // 2
        else:
            fg, fb = F(good), F(bad)
            x = good + max(1, int((target - fg) * (bad - good) / max(fb - fg, 1)))


@dataclass
class Fitted:
    text: str
    n: int
    fill: int
    prompt_tokens: int


def count_tokens_fn(tokenizer, options: TaskOptions) -> Callable[[str], int]:
    add_bos = options.add_bos and prepends_bos(tokenizer)
    return lambda text: len(tokenizer.encode(text, add_bos=add_bos))


def draft_wrap(draft: Draft, tpl: str) -> Callable[[str], str]:
    """The draft's rendered text as the model reads it: pre_template, then the chat-wrapped text."""
    return lambda text: draft.pre_template + tpl.replace("{input}", text)


def fit_draft(draft: Draft, count: Callable[[str], int], wrap: Callable[[str], str], target_prompt: int,
              guess_n: Optional[int] = None) -> Optional[Fitted]:
    """Largest haystack (then filler) whose prompt has at most `target_prompt` tokens."""

    def tokens(n: int, fill: int) -> int:
        return count(wrap(draft.render(n, fill)) + draft.answer_prefix)

    n = largest_fitting(lambda k: tokens(k, 0), target_prompt, draft.n_min, draft.n_max, guess_n)
    if n is None:
        return None
    fmax = draft.fill_max(n)
    fill = 0
    if fmax > 0:
        fill = largest_fitting(lambda k: tokens(n, k), target_prompt, 0, fmax, None) or 0
    text = draft.render(n, fill)
    return Fitted(text=text, n=n, fill=fill, prompt_tokens=tokens(n, fill))
