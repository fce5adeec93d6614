"""Paired comparisons of two evaluations on the same samples, with one standard error and one
interval everywhere.

A comparison is the mean over samples of (score of B - score of A) where both variants scored the
same sample (the same seed, task, length, depth and index give the same prompt, so the samples are
shared). Samples are grouped in strata (a task, or a depth of a grid); an aggregate over strata is
the unweighted mean of the strata's means, so each task counts once whatever its sample count.

- standard error (`se`): sqrt(sum_s var_s / n_s) / K over the K strata, var_s the sample variance
  (n - 1 denominator) of the values in stratum s: the usual s.e. of a mean for one stratum, and
  the same formula for every mean and every paired difference in a report.
- interval: a 95% percentile interval of the paired bootstrap: each of `resamples` (10,000 by
  default) draws n_s samples with replacement within every stratum, the same draw for both
  variants (the pairs move together), and recomputes the aggregate; the interval is the 2.5th and
  97.5th percentiles of those. numpy's PCG64 seeded with `seed` (0 by default) draws them, so a
  report is reproducible. Percentile intervals suit bounded, partial scores (no normality needed);
  when every difference is the same the interval is that one value.
"""
from __future__ import annotations

import math
from typing import Hashable, Mapping, Sequence

import numpy as np

RESAMPLES = 10_000
LEVEL = 0.95
SEED = 0


def standard_error(strata: Sequence[Sequence[float]]) -> float:
    """The s.e. of the mean of strata means (one stratum: sd / sqrt(n)); 0 for a stratum of one value."""
    strata = [np.asarray(s, dtype=float) for s in strata if len(s)]
    if not strata:
        return float("nan")
    var = sum(float(s.var(ddof=1)) / len(s) if len(s) > 1 else 0.0 for s in strata)
    return math.sqrt(var) / len(strata)


def stratified_mean(strata: Sequence[Sequence[float]]) -> float:
    strata = [s for s in strata if len(s)]
    return float(np.mean([np.mean(s) for s in strata])) if strata else float("nan")


def bootstrap_interval(strata: Sequence[Sequence[float]], *, resamples: int = RESAMPLES, level: float = LEVEL,
                       seed: int = SEED) -> tuple[float, float]:
    """The percentile interval of the stratified bootstrap of stratified_mean(strata)."""
    strata = [np.asarray(s, dtype=float) for s in strata if len(s)]
    if not strata:
        return float("nan"), float("nan")
    rng = np.random.Generator(np.random.PCG64(seed))
    means = np.zeros(resamples)
    for s in strata:  # (resamples, n_s) draws within the stratum, averaged
        idx = rng.integers(0, len(s), size=(resamples, len(s)))
        means += s[idx].mean(axis=1)
    means /= len(strata)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def summarize(strata: Sequence[Sequence[float]], **bootstrap) -> dict:
    """{"mean", "se", "lo", "hi", "n"} of the values (one variant's scores or paired differences)."""
    lo, hi = bootstrap_interval(strata, **bootstrap)
    return {"mean": stratified_mean(strata), "se": standard_error(strata), "lo": lo, "hi": hi,
            "n": int(sum(len(s) for s in strata))}


def paired_difference(a: Mapping[Hashable, float], b: Mapping[Hashable, float],
                      stratum_of=lambda key: None, **bootstrap) -> dict:
    """B - A over the samples both scored ({key: score} each; keys shared by both): summarize()'s
    fields for the differences, plus "a" and "b" (each variant's mean over the same samples, same
    strata) and "unpaired" (keys only one of them has, left out)."""
    keys = sorted(set(a) & set(b), key=repr)
    strata: dict = {}
    for k in keys:
        strata.setdefault(stratum_of(k), []).append(k)
    groups = [strata[s] for s in sorted(strata, key=repr)]
    out = summarize([[b[k] - a[k] for k in g] for g in groups], **bootstrap)
    out["a"] = stratified_mean([[a[k] for k in g] for g in groups])
    out["b"] = stratified_mean([[b[k] for k in g] for g in groups])
    out["unpaired"] = len(set(a) ^ set(b))
    return out


def fmt_diff(d: Mapping) -> str:
    """"+3.1 [-0.4, +6.9]" (the difference and its 95% interval)."""
    if not d.get("n"):
        return "-"
    return f"{d['mean']:+.1f} [{d['lo']:+.1f}, {d['hi']:+.1f}]"


def fmt_mean(d: Mapping) -> str:
    """"41.2 ± 3.0" (mean ± s.e.)."""
    if not d.get("n"):
        return "-"
    return f"{d['mean']:.1f} ± {d['se']:.1f}"
