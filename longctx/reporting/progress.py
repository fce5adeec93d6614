"""Progress of a long loop (training steps, eval samples, cache documents) for a person watching
a terminal or reading a log afterwards.

On a terminal it is tqdm's bar. Anywhere else (a log file, a SLURM .out, a pipe) a redrawn bar
would be one endless line of carriage returns, so it is a plain line instead, printed at the
first update, then whenever LINE_EVERY_S seconds or LINE_EVERY_FRACTION of the total have
passed since the last line (whichever comes first), and at the end:

    train: step 3/10 (30%) | loss 6.2285 | lr 2.00e-05 | tok/s 5,203 | mem 0.42 GiB | elapsed 0:03 | eta 0:05

    progress = Progress(total=10, desc="train", unit="step", enabled=rank == 0)
    for ...:
        progress.update(1, loss="6.2285", lr="2.00e-05")   # fields: preformatted strings
        progress.write("a line that does not break the bar")
    progress.close()
"""
from __future__ import annotations

import math
import sys
import time
from typing import Callable, Optional, TextIO

from tqdm import tqdm

LINE_EVERY_S = 30.0
LINE_EVERY_FRACTION = 0.1


def is_terminal(file: TextIO) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed file
        return False


def format_duration(seconds: float) -> str:
    """H:MM:SS, or M:SS under an hour."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """A bar on a terminal, periodic plain lines elsewhere, nothing when not `enabled`.

    total: units expected (None when unknown: no percentage, no ETA); initial: units already
    done (a resumed run); bar: force the bar (True) or the lines (False) instead of asking
    whether `file` (default stderr) is a terminal; clock: seconds, for tests."""

    def __init__(self, total: Optional[int], desc: str, unit: str, *, enabled: bool = True, initial: int = 0,
                 file: Optional[TextIO] = None, bar: Optional[bool] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.desc, self.unit, self.enabled = total, desc, unit, enabled
        self.file = file if file is not None else sys.stderr
        self.n = self._start_n = initial
        self.fields: dict[str, str] = {}
        self._clock = clock
        self._start_t = clock()
        self._line_t: Optional[float] = None  # when the last plain line was printed
        self._line_n = initial
        use_bar = enabled and (bar if bar is not None else is_terminal(self.file))
        self._bar = (tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self.file, dynamic_ncols=True)
                     if use_bar else None)

    def update(self, n: int = 1, **fields: str) -> None:
        """`n` more units done; `fields` (name -> preformatted value) replace the shown ones."""
        if not self.enabled:
            return
        self.n += n
        self.fields.update(fields)
        if self._bar is not None:
            if fields:
                self._bar.set_postfix(self.fields, refresh=False)
            self._bar.update(n)
        elif self._line_due():
            self._print_line()

    def write(self, message: str) -> None:
        """A line of its own (the bar redraws below it); printed even when not `enabled`."""
        if self._bar is not None:
            self._bar.write(message, file=self.file)
        else:
            print(message, file=self.file, flush=True)

    def close(self) -> None:
        """Close the bar, or print the last line if the latest units have not been shown."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and self.n != self._line_n:
            self._print_line()
        self.enabled = False

    def line(self) -> str:
        """The plain line for the current state."""
        elapsed = self._clock() - self._start_t
        head = f"{self.desc}: {self.unit} {self.n:,}"
        if self.total:
            head += f"/{self.total:,} ({100 * self.n / self.total:.0f}%)"
        parts = [head] + [f"{name} {value}" for name, value in self.fields.items()]
        parts.append(f"elapsed {format_duration(elapsed)}")
        done = self.n - self._start_n
        if self.total and done > 0 and elapsed > 0:
            parts.append(f"eta {format_duration(max(0, self.total - self.n) * elapsed / done)}")
        return " | ".join(parts)

    def _line_due(self) -> bool:
        if self._line_t is None:
            return True  # the first update: the loop runs, and its first estimate
        if self._clock() - self._line_t >= LINE_EVERY_S:
            return True
        return bool(self.total) and self.n - self._line_n >= max(1, math.ceil(self.total * LINE_EVERY_FRACTION))

    def _print_line(self) -> None:
        print(self.line(), file=self.file, flush=True)
        self._line_t, self._line_n = self._clock(), self.n
