import io

import pytest

from pipeline import progress
from pipeline.progress import Progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def log_file(capsys):
    """What reaches stderr, not a terminal (pytest's capture), as a file under nohup, CI or a Ray job's logs."""
    return lambda: capsys.readouterr().err


def test_duration():
    assert [duration(s) for s in (0, 59.6, 61, 3599, 3600, 7322)] == ["0:00", "1:00", "1:01", "59:59", "1:00:00", "2:02:02"]


def test_off_a_terminal_a_line_at_most_once_a_minute_and_the_last_one(log_file):
    clock = Clock()
    bar = Progress("distill", 1000, "sentence", clock=clock)
    for done, at in ((100, 110), (200, 130), (300, 170), (400, 175), (500, 230)):
        clock.now = at
        bar.update(done, f"at {done}")
    clock.now = 240
    bar.update(1000)
    bar.close()
    # 100 sentences at 110 s are the rate's start: 100 more by 170 s is 1.67/s, 400 more by 230 s 3.33/s
    assert log_file().splitlines() == [
        "distill: 300/1000 sentences (30%), 3.33 sentences/s, elapsed 1:10, ETA 3:30; at 300",
        "distill: 500/1000 sentences (50%), 3.33 sentences/s, elapsed 2:10, ETA 2:30; at 500",
        "distill: 1000/1000 sentences (100%), 6.92 sentences/s, elapsed 2:20, ETA 0:00"]


def test_a_single_update_gives_the_rate_since_the_start_and_no_line_is_written_twice(log_file, monkeypatch):
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    clock = Clock()
    bar = Progress("evaluate", 4, "decode", clock=clock)
    clock.now = 104
    bar.update(4, "last test src2tgt greedy: BLEU 1.00")
    bar.close()
    assert log_file() == ("evaluate: 4/4 decodes (100%), 1 decodes/s, elapsed 0:04, ETA 0:00; "
                                   "last test src2tgt greedy: BLEU 1.00\n")


def test_on_a_terminal_a_bar_and_no_lines(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    bar = Progress("evaluate", 4, "decode")
    bar.doing("test src2tgt greedy")
    bar.update(1, "ignored on a terminal")
    bar.close()
    assert "evaluate:  25%" in screen.getvalue() and "test src2tgt greedy" in screen.getvalue()
    assert "ignored" not in screen.getvalue()
    quiet = Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    silent = Progress("distill", 10, "sentence", bar=False)  # Ray Data draws its own bars there
    silent.update(10)
    silent.close()
    assert quiet.getvalue() == ""


def test_a_time_limit_brings_the_eta_forward(log_file, monkeypatch):
    """A training run of 100,000 steps stopped by its max_time of 60 s: the ETA is what is left of the 60 s
    after the first update, not 100,000 steps at its rate; a limit that comes later than the steps changes nothing."""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    clock = Clock()
    bar = Progress("train", 100_000, "step", clock=clock, time_limit=60.0)
    bar.update(5)
    clock.now = 120.0
    bar.update(25)
    assert log_file().splitlines()[-1] == "train: 25/100000 steps (0%), 1 steps/s, elapsed 0:20, ETA 0:40"
    late = Progress("train", 40, "step", clock=clock, time_limit=1000.0)
    late.update(0)
    clock.now = 130.0
    late.update(20)
    assert log_file().splitlines()[-1].endswith("ETA 0:10")
