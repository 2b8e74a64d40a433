"""Progress wherever the output goes: on a terminal a tqdm bar, elsewhere (a log file, CI, `nohup`, a Ray
job's logs) a line on stderr at most every `LINE_EVERY_S` seconds, and one at the end.

    train: 30/30 steps (100%), 0.71 steps/s, elapsed 0:42, ETA 0:00; loss 5.1 (ctc_src2tgt 2.6, ...), ...

The training runs (pipeline/training/raytrain.py), distillation (pipeline/stages/distill.py) and evaluation
(pipeline/stages/evaluate.py) report through it; "a terminal" is stderr being one, as for tqdm's `disable=None`.
"""
from __future__ import annotations

import math
import sys
import time
from typing import Callable, Optional

LINE_EVERY_S = 60.0  # at most one line a minute off a terminal (tests set it to 0)


def duration(seconds: float) -> str:
    """h:mm:ss, or m:ss under an hour."""
    minutes, secs = divmod(int(round(max(seconds, 0.0))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """`done` of `total` `unit`s. `update(done, details, postfix)`: on a terminal the bar moves (with
    `postfix` beside it; `bar=False`: no bar, where Ray Data draws its own); off a terminal a line — `desc`,
    done/total, rate, elapsed, ETA, then `details` — once `LINE_EVERY_S` have passed since the last line
    (the first after `LINE_EVERY_S` from the start). `close()` writes the last line if it was not written.
    `time_limit`: seconds after the first update at which the work stops whatever `done` is (a training run's
    max_time): the ETA is the sooner of the two."""

    def __init__(self, desc: str, total: int, unit: str, bar: bool = True,
                 clock: Callable[[], float] = time.monotonic, time_limit: float = math.inf) -> None:
        self.desc, self.total, self.unit, self.clock, self.time_limit = desc, total, unit, clock, time_limit
        self.lines = not sys.stderr.isatty()
        self.bar = None
        if bar and not self.lines:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True)
        self.started = self.last_line = clock()
        self.first: Optional[tuple[int, float]] = None  # the first update: rates leave out start-up time
        self.done, self.details, self.written = 0, "", -1

    def update(self, done: int, details: str = "", postfix: Optional[dict[str, str]] = None) -> None:
        """Progress is now `done` (absolute)."""
        now = self.clock()
        if self.first is None:
            self.first = (done, now)
        self.done, self.details = done, details
        if self.bar is not None:
            self.bar.n = min(done, self.total)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.refresh()
        elif self.lines and now - self.last_line >= LINE_EVERY_S:
            self._line(now)

    def doing(self, what: str) -> None:
        """On a terminal, what runs now, beside the bar."""
        if self.bar is not None:
            self.bar.set_postfix_str(what)

    def line(self, now: Optional[float] = None) -> str:
        """The progress line as it stands."""
        now = self.clock() if now is None else now
        first_done, first_time = self.first or (0, self.started)
        if not (now > first_time and self.done > first_done):  # one update so far: the rate since the start
            first_done, first_time = 0, self.started
        rate = (self.done - first_done) / (now - first_time) if now > first_time else 0.0
        left = min((self.total - self.done) / rate if rate > 0 else math.inf,
                   self.time_limit - (now - (self.first or (0, now))[1]))
        eta = duration(left) if left != math.inf else "?"
        percent = 100.0 * self.done / self.total if self.total else 100.0
        text = (f"{self.desc}: {self.done}/{self.total} {self.unit}s ({percent:.0f}%), {rate:.3g} {self.unit}s/s, "
                f"elapsed {duration(now - self.started)}, ETA {eta}")
        return f"{text}; {self.details}" if self.details else text

    def _line(self, now: float) -> None:
        print(self.line(now), file=sys.stderr, flush=True)
        self.last_line, self.written = now, self.done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.lines and self.written != self.done:
            self._line(self.clock())
