"""Scoring follows RULER: case-insensitive substring matches, x100, all vs part."""
import pytest

from longctx.eval.scoring import (
    effective_length,
    postprocess_pred,
    sample_match_all,
    sample_match_part,
    string_match_all,
    string_match_part,
)


def test_match_all_counts_the_share_of_references_found():
    assert string_match_all(["The values are 1234567 and 7654321."], [["1234567", "7654321"]]) == 100.0
    assert string_match_all(["Only 1234567 here"], [["1234567", "7654321"]]) == 50.0
    assert string_match_all(["nothing"], [["1234567", "7654321"]]) == 0.0
    # averaged over samples: (100 + 50 + 0) / 3
    preds = ["a b", "a", "z"]
    assert string_match_all(preds, [["a", "b"], ["a", "b"], ["a", "b"]]) == pytest.approx(50.0)


def test_match_part_is_any_reference_per_sample():
    assert string_match_part(["Paris, France"], [["London", "Paris"]]) == 100.0
    assert string_match_part(["Berlin"], [["London", "Paris"]]) == 0.0
    # RULER sums the per-sample max and divides by the number of samples
    assert string_match_part(["Paris", "Rome"], [["Paris"], ["Madrid"]]) == 50.0


def test_case_insensitive_and_substring():
    assert sample_match_all("ANSWER: Bright-Apple", ["bright-apple"]) == 100.0
    assert sample_match_part("xxSaN FrAnCiScOxx", ["san francisco"]) == 100.0
    # uuids and hyphenated words must match whole; a prefix is not enough
    assert sample_match_all("3f2a", ["3f2a-11"]) == 0.0


def test_postprocess_maps_control_characters_like_ruler():
    assert postprocess_pred("  \x00123\x01\n") == "123"
    assert postprocess_pred("a\tb") == "a\nb"
    # a reference split by a control character no longer matches
    assert sample_match_all("12\x0034", ["1234"]) == 0.0


def test_mismatched_or_empty_inputs_are_errors():
    with pytest.raises(ValueError):
        string_match_all(["a"], [["a"], ["b"]])
    with pytest.raises(ValueError):
        string_match_all([], [])
    with pytest.raises(ValueError):
        sample_match_all("a", [])


def test_effective_length_is_the_last_length_of_the_passing_prefix():
    scores = {4096: 95.0, 8192: 90.0, 16384: 80.0, 32768: 88.0}
    assert effective_length(scores) == 8192  # 32k passes again but 16k broke the run
    assert effective_length(scores, threshold=70.0) == 32768
    assert effective_length({4096: 50.0}) == 0
    assert effective_length({4096: 85.6}) == 0  # strictly above the threshold


def test_aggregate_reports_standard_errors():
    import math

    from longctx.eval.report import aggregate, standard_error

    recs = [{"task": "t1", "metric": "all", "target_length": 256, "score": s} for s in (100.0, 0.0, 100.0, 0.0)]
    recs += [{"task": "t2", "metric": "all", "target_length": 256, "score": s} for s in (100.0, 100.0, 50.0)]
    summary = aggregate(recs)
    se1 = math.sqrt(sum((x - 50) ** 2 for x in (100, 0, 100, 0)) / 3 / 4)  # 28.87
    se2 = math.sqrt(sum((x - 250 / 3) ** 2 for x in (100, 100, 50)) / 2 / 3)
    assert summary["tasks"]["t1"]["stderr"]["256"] == pytest.approx(se1)
    assert summary["tasks"]["t2"]["stderr"]["256"] == pytest.approx(se2)
    # the average over tasks: independent samples, so its variance is sum(se^2) / k^2
    assert summary["average_stderr_by_length"]["256"] == pytest.approx(math.hypot(se1, se2) / 2)
    assert standard_error([100.0]) == 0.0 and standard_error([40.0] * 5) == 0.0
