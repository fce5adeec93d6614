"""benchlib, the shared package of benchmarks/: the interleaved timer (a fake clock, no real time)
and the report fields every benchmark writes."""
import pytest
from benchlib.report import markdown_table, timing_fields
from benchlib.timing import Timing, interleaved, slowest_rank


class FakeClock:
    """Time moves only when a contender runs: each call of contender X takes durations[X][k]."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _contenders(clock, calls, durations):
    def make(name):
        def run():
            calls.append(name)
            clock.now += durations[name][sum(c == name for c in calls) - 1]
        return run
    return {name: make(name) for name in durations}


def test_calls_are_interleaved_round_robin_after_the_warmup():
    clock, calls = FakeClock(), []
    durations = {"a": [9.0] * 7, "b": [9.0] * 7, "c": [9.0] * 7}
    interleaved(_contenders(clock, calls, durations), steps=5, warmup=2, clock=clock)
    assert calls == ["a", "b", "c"] * 7  # 2 warm-up rounds, then 5 timed rounds


def test_warmup_is_not_timed_and_median_min_come_from_the_timed_steps():
    clock, calls = FakeClock(), []
    # the first call of each is a slow warm-up (100 s); the 5 timed calls follow
    durations = {"a": [100.0, 3.0, 1.0, 2.0, 5.0, 4.0], "b": [100.0, 0.5, 0.5, 0.25, 2.0, 0.5]}
    t = interleaved(_contenders(clock, calls, durations), steps=5, warmup=1, clock=clock)
    assert t["a"].times == [3.0, 1.0, 2.0, 5.0, 4.0] and t["a"].steps == 5 and t["a"].warmup == 1
    assert (t["a"].median_s, t["a"].min_s) == (3.0, 1.0)
    assert (t["b"].median_s, t["b"].min_s) == (0.5, 0.25)


def test_hooks_run_around_each_timed_call_outside_the_clock():
    clock, calls, seen = FakeClock(), [], []

    def before(name):
        seen.append(("before", name))
        clock.now += 50.0  # a barrier's wait is not the contender's time

    t = interleaved(_contenders(clock, calls, {"a": [1.0] * 3, "b": [2.0] * 3}), steps=2, warmup=1, clock=clock,
                    before=before, after=lambda name: seen.append(("after", name)))
    assert t["a"].times == [1.0, 1.0] and t["b"].times == [2.0, 2.0]
    assert seen == [("before", "a"), ("after", "a"), ("before", "b"), ("after", "b")] * 2  # not in the warm-up


def test_no_timed_steps_is_an_error():
    with pytest.raises(ValueError, match="steps"):
        interleaved({"a": lambda: None}, steps=0)


def test_slowest_rank_per_step():
    assert slowest_rank([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]


def test_timing_fields_record_steps_warmup_median_and_min():
    fields = timing_fields(Timing([4.0, 1.0, 2.0], warmup=1))
    assert fields == {"steps": 3, "warmup": 1, "median_s": 2.0, "min_s": 1.0, "times_s": [4.0, 1.0, 2.0]}
    assert timing_fields([2.0, 6.0], warmup=0, prefix="hf_")["hf_median_s"] == 4.0


def test_markdown_table():
    assert markdown_table(["a", "b"], [[1, "x"]], "rl") == "| a | b |\n| ---: | --- |\n| 1 | x |"
