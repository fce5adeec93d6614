"""longctx/eval/paired.py against values worked out by hand or from an exact distribution."""
from __future__ import annotations

import math

import pytest

from longctx.eval.paired import bootstrap_interval, fmt_diff, paired_difference, standard_error, summarize


def test_standard_error_is_sd_over_root_n_for_one_stratum():
    # values 1..4: sample variance 5/3, s.e. sqrt(5/3 / 4)
    assert standard_error([[1, 2, 3, 4]]) == pytest.approx(math.sqrt(5 / 12))
    assert standard_error([[7.0]]) == 0.0


def test_standard_error_of_a_mean_of_strata_means():
    # strata [0, 1] (variance 0.5, n 2) and four 10s (variance 0): sqrt(0.5 / 2 + 0) / 2
    assert standard_error([[0, 1], [10, 10, 10, 10]]) == pytest.approx(0.25)
    s = summarize([[0, 1], [10, 10, 10, 10]])
    assert s["mean"] == pytest.approx((0.5 + 10) / 2) and s["n"] == 6


def test_bootstrap_of_a_coin_matches_the_binomial_quantiles():
    # 20 differences, ten 0s and ten 1s: a resampled mean is Binomial(20, 1/2) / 20, whose 2.5% and
    # 97.5% quantiles are 6 and 14 (P(X <= 5) = 0.021, P(X <= 6) = 0.058; symmetric)
    lo, hi = bootstrap_interval([[0.0] * 10 + [1.0] * 10], resamples=10_000, seed=0)
    assert (lo, hi) == (pytest.approx(0.30), pytest.approx(0.70))


def test_bootstrap_is_seeded_and_degenerate_when_all_differences_agree():
    data = [[0.0, 1.0, 1.0, 0.5, 0.25, 0.0, 1.0]]
    assert bootstrap_interval(data, seed=3) == bootstrap_interval(data, seed=3)
    assert bootstrap_interval([[2.5] * 9]) == (2.5, 2.5)


def test_paired_difference_removes_the_spread_between_samples():
    a = {("t", i): float(i * 10 % 97) for i in range(40)}  # scores that differ a lot between samples
    b = {k: v + 1.0 for k, v in a.items()}
    b[("t", 999)] = 5.0  # only one variant has it: left out and counted
    d = paired_difference(a, b, stratum_of=lambda k: k[0])
    assert d["mean"] == pytest.approx(1.0) and (d["lo"], d["hi"]) == (pytest.approx(1.0), pytest.approx(1.0))
    assert d["se"] == 0.0 and d["n"] == 40 and d["unpaired"] == 1
    assert d["b"] - d["a"] == pytest.approx(1.0)
    assert fmt_diff(d) == "+1.0 [+1.0, +1.0]"


def test_paired_difference_weighs_each_stratum_once():
    # task x: 2 samples, each +10; task y: 8 samples, each 0 -> (10 + 0) / 2, not 20 / 10
    a = {("x", i): 0.0 for i in range(2)} | {("y", i): 50.0 for i in range(8)}
    b = {("x", i): 10.0 for i in range(2)} | {("y", i): 50.0 for i in range(8)}
    d = paired_difference(a, b, stratum_of=lambda k: k[0])
    assert d["mean"] == pytest.approx(5.0) and d["lo"] == d["hi"] == pytest.approx(5.0)
