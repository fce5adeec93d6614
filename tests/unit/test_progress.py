"""longctx.reporting.progress: plain lines off a terminal (when, and what they say), the bar on one."""
import io

from longctx.reporting.progress import LINE_EVERY_S, Progress, format_duration


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_lines_at_first_update_every_tenth_and_at_close():
    out, clock = io.StringIO(), Clock()
    p = Progress(20, "train", "step", file=out, clock=clock)
    for step in range(1, 21):
        clock.t += 1.0
        p.update(1, loss=f"{10 - step / 10:.2f}")
    p.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    steps = [int(line.split()[2].split("/")[0]) for line in lines]
    assert steps == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 20]  # first, every 2 (10% of 20), the last
    assert lines[0] == "train: step 1/20 (5%) | loss 9.90 | elapsed 0:01 | eta 0:19"
    assert lines[-1] == "train: step 20/20 (100%) | loss 8.00 | elapsed 0:20 | eta 0:00"


def test_a_line_every_interval_when_the_total_is_large_or_unknown():
    for total in (10_000, None):
        out, clock = io.StringIO(), Clock()
        p = Progress(total, "caching x", "doc", file=out, clock=clock)
        for _ in range(100):
            clock.t += LINE_EVERY_S / 10
            p.update(1)
        p.close()
        lines = out.getvalue().splitlines()
        assert [int(line.split()[3].split("/")[0].replace(",", "")) for line in lines] == [1, 11, 21, 31, 41, 51, 61,
                                                                                           71, 81, 91, 100]
        assert ("eta" in lines[0]) == (total is not None) and ("%" in lines[0]) == (total is not None)


def test_resumed_progress_counts_the_rate_from_where_it_started():
    out, clock = io.StringIO(), Clock()
    p = Progress(100, "train", "step", initial=90, file=out, clock=clock)
    clock.t = 10.0
    p.update(5)  # 5 steps in 10 s: the 5 left take 10 s more
    assert out.getvalue() == "train: step 95/100 (95%) | elapsed 0:10 | eta 0:10\n"


def test_disabled_prints_nothing_but_write():
    out = io.StringIO()
    p = Progress(3, "eval", "sample", enabled=False, file=out)
    p.update(3)
    p.write("stage 1: announced")
    p.close()
    assert out.getvalue() == "stage 1: announced\n"


def test_a_terminal_gets_the_bar_and_written_lines_above_it():
    out = FakeTerminal()
    p = Progress(4, "train", "step", file=out)
    p.update(1, loss="1.0")
    p.write("stage 1: announced")
    p.update(3)
    p.close()
    text = out.getvalue()
    assert "\r" in text and "4/4" in text and "loss=1.0" in text  # tqdm's redraws
    assert "stage 1: announced\n" in text
    assert "train: step" not in text  # no plain lines


def test_format_duration():
    assert [format_duration(s) for s in (0, 59.4, 61, 3600, 3 * 3600 + 62)] == ["0:00", "0:59", "1:01", "1:00:00",
                                                                                 "3:01:02"]
