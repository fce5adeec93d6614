"""Scoring as RULER defines it.

Both metrics are case-insensitive substring matches on the post-processed prediction, scaled
to 0..100:

* ``string_match_all``  - per sample, the fraction of references found in the prediction;
  averaged over samples. Used by every synthetic task (niah, vt, cwe, fwe, passkey).
* ``string_match_part`` - per sample, 1 if *any* reference is found; averaged over samples.
  Used by the QA tasks (any of the annotated answers counts).

``effective_length`` is RULER's headline number: the longest evaluated length whose average
score is above a threshold (default 85.6, Llama-2-7B-chat's score at 4k), with every shorter
length also above it. ``weighted_average`` is RULER's wAvg (inc / dec) over lengths.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

DEFAULT_THRESHOLD = 85.6

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess_pred(pred: str) -> str:
    """Strip, map control characters to newlines, strip again (RULER's post-processing)."""
    return _CONTROL.sub("\n", pred.strip()).strip()


def _hits(pred: str, refs: Sequence[str]) -> list[float]:
    p = postprocess_pred(pred).lower()
    return [1.0 if r.lower() in p else 0.0 for r in refs]


def sample_match_all(pred: str, refs: Sequence[str]) -> float:
    """0..100 for one sample: the share of references contained in the prediction."""
    if not refs:
        raise ValueError("a sample needs at least one reference answer")
    h = _hits(pred, refs)
    return 100.0 * sum(h) / len(h)


def sample_match_part(pred: str, refs: Sequence[str]) -> float:
    """0 or 100 for one sample: whether any reference is contained in the prediction."""
    if not refs:
        raise ValueError("a sample needs at least one reference answer")
    return 100.0 * max(_hits(pred, refs))


def string_match_all(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER's string_match_all over a set of samples (0..100)."""
    _check(preds, refs)
    return sum(sample_match_all(p, r) for p, r in zip(preds, refs)) / len(preds)


def string_match_part(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER's string_match_part over a set of samples (0..100)."""
    _check(preds, refs)
    return sum(sample_match_part(p, r) for p, r in zip(preds, refs)) / len(preds)


METRICS = {"string_match_all": sample_match_all, "string_match_part": sample_match_part}


def score_sample(metric: str, pred: str, refs: Sequence[str]) -> float:
    return METRICS[metric](pred, refs)


def _check(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions but {len(refs)} reference lists")
    if not preds:
        raise ValueError("no samples to score")


def mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def weighted_average(scores_by_length: Mapping[int, float], order: str) -> float:
    """RULER's wAvg over lengths: weights 1..n rising with the length ("inc") or falling ("dec")."""
    lengths = sorted(scores_by_length)
    if not lengths:
        return float("nan")
    ranks = range(1, len(lengths) + 1)
    weights = list(ranks) if order == "inc" else list(reversed(ranks))
    return sum(w * scores_by_length[L] for w, L in zip(weights, lengths)) / sum(weights)


def ruler_round(score: float) -> float:
    """A task score as RULER's evaluate.py reports it (rounded to 2 decimals)."""
    return round(score, 2)


def effective_length(scores_by_length: Mapping[int, float], threshold: float = DEFAULT_THRESHOLD) -> int:
    """Longest length L such that every evaluated length <= L scores above `threshold`.

    Returns 0 when even the shortest length is at or below the threshold.
    """
    best = 0
    for length in sorted(scores_by_length):
        if scores_by_length[length] > threshold:
            best = length
        else:
            break
    return best
