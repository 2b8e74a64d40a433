"""Where the test suite's time goes, test by test: a pytest plugin that appends, for each test's setup, call and
teardown, its wall time, the pytest process's own CPU time and the whole machine's busy CPU time over the same
span (/proc/stat's user, nice, system, irq and softirq of every core) to a CSV file; and a summary of that file.

    SUITE_PROFILE=/tmp/profile.csv PYTHONPATH=$PWD PYTEST_ADDOPTS="-p bench.suite_profile" CI=true bash .ci/run
    python -m bench.suite_profile /tmp/profile.csv [--top 30]

and which processes the machine's CPU went to, by command, from the kernel's process accounting over the same run
(Debian's acct package; the accounting file records every process that ended, its command truncated to 15
characters, as Ray's worker processes title themselves: `ray::RayTrainWorker`, `ray::IDLE`):

    touch /tmp/acct && accton /tmp/acct && (the run above); accton off
    python -m bench.suite_profile --processes /tmp/acct [--top 30]

The summary gives, per directory and per test, the wall seconds, pytest's CPU seconds, the machine's CPU seconds
and the machine's idle capacity (cores × wall − machine CPU): where a test left a core idle (it waited, or ran
on one core), work beside it would cost no time; where the machine had none to spare, only less work makes the
suite shorter. A child pytest (it inherits PYTEST_ADDOPTS, hence PYTHONPATH above) appends its own rows under its
own process id; the summary reads the process with the most rows, the suite's own.
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The CSV file the plugin appends to; no header, each row: pid, nodeid, phase, wall_s, pytest_cpu_s, machine_cpu_s
ENV = "SUITE_PROFILE"


def machine_cpu_s() -> float:
    """The machine's busy CPU seconds since boot, all cores (/proc/stat: user, nice, system, irq, softirq)."""
    with open("/proc/stat", encoding="ascii") as stat:
        ticks = [int(value) for value in stat.readline().split()[1:8]]
    return (ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]) / os.sysconf("SC_CLK_TCK")


def _writer() -> tuple:
    handle = open(os.environ.get(ENV, "suite_profile.csv"), "a", newline="", encoding="utf-8")  # noqa: SIM115
    return handle, csv.writer(handle)


_OUT: tuple | None = None


def _timed(phase: str):
    @pytest.hookimpl(hookwrapper=True)
    def hook(item: pytest.Item, *args, **kwargs):
        global _OUT
        wall, own, machine = time.monotonic(), sum(os.times()[:2]), machine_cpu_s()
        yield
        if _OUT is None:
            _OUT = _writer()
        _OUT[1].writerow([os.getpid(), item.nodeid, phase, round(time.monotonic() - wall, 3),
                          round(sum(os.times()[:2]) - own, 3), round(machine_cpu_s() - machine, 3)])
        _OUT[0].flush()
    return hook


pytest_runtest_setup = _timed("setup")
pytest_runtest_call = _timed("call")
pytest_runtest_teardown = _timed("teardown")


def read(path: Path) -> dict[str, list[float]]:
    """nodeid → [wall s, pytest's CPU s, machine CPU s], setup, call and teardown summed, of the process with the
    most rows (the suite's own; child pytests append under their own pid)."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.reader(handle) if row]
    suite = collections.Counter(row[0] for row in rows).most_common(1)[0][0]
    tests: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for pid, nodeid, _phase, *values in rows:
        if pid == suite:
            tests[nodeid] = [total + float(value) for total, value in zip(tests[nodeid], values)]
    return dict(tests)


def summary(tests: dict[str, list[float]], cores: int, top: int) -> str:
    def line(name: str, wall: float, own: float, machine: float) -> str:
        return f"| {name} | {wall:.1f} | {own:.1f} | {machine:.1f} | {cores * wall - machine:.1f} |"

    head = "| {} | wall s | pytest's CPU-s | machine CPU-s | idle capacity, CPU-s |\n|---|---|---|---|---|"
    by_directory: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for nodeid, values in tests.items():
        directory = "/".join(nodeid.split("::")[0].split("/")[:2])
        by_directory[directory] = [a + b for a, b in zip(by_directory[directory], values)]
    total = [sum(values[i] for values in tests.values()) for i in range(3)]
    parts = [head.format("tests"), *(line(d, *v) for d, v in sorted(by_directory.items(), key=lambda kv: -kv[1][0])),
             line("all", *total), ""]
    for title, key in (("by machine CPU", lambda kv: -kv[1][2]),
                       ("by idle capacity", lambda kv: -(cores * kv[1][0] - kv[1][2]))):
        parts += [f"{title}:", head.format("test"),
                  *(line(n, *v) for n, v in sorted(tests.items(), key=key)[:top]), ""]
    return "\n".join(parts)


ACCT_HZ = 100  # the kernel's accounting clock (AHZ): dump-acct prints user and system time in its ticks


def processes(dump: str) -> dict[str, list[float]]:
    """command → [processes, CPU seconds (user + system)], from `dump-acct FILE`'s lines (fields separated by `|`:
    command, version, user ticks, system ticks, ...)."""
    commands: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for number, line in enumerate(dump.splitlines(), 1):
        fields = [field.strip() for field in line.split("|")]
        if len(fields) < 4:
            raise ValueError(f"dump-acct's line {number} has {len(fields)} fields, not the 4 or more read: {line!r}")
        total = commands[fields[0]]
        total[0] += 1
        total[1] += (float(fields[2]) + float(fields[3])) / ACCT_HZ
    return dict(commands)


def process_summary(commands: dict[str, list[float]], top: int) -> str:
    total = sum(cpu for _, cpu in commands.values())
    parts = [f"{sum(n for n, _ in commands.values()):.0f} processes ended, {total:.1f} CPU-s", "",
             "| command | processes | CPU-s | CPU-s each | share |", "|---|---|---|---|---|"]
    for name, (count, cpu) in sorted(commands.items(), key=lambda kv: -kv[1][1])[:top]:
        parts.append(f"| {name} | {count:.0f} | {cpu:.1f} | {cpu / count:.2f} | {cpu / total:.1%} |")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, nargs="?", help="the CSV file the plugin wrote")
    parser.add_argument("--processes", type=Path, metavar="ACCT", help="a process accounting file (accton) instead")
    parser.add_argument("--top", type=int, default=30, help="tests (or commands) listed in each ranking")
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="the machine's cores (default: this one's)")
    args = parser.parse_args(argv)
    if (args.profile is None) == (args.processes is None):
        parser.error("give the plugin's CSV file or --processes ACCT, one of the two")
    if args.processes is not None:
        if not args.processes.is_file():
            parser.error(f"{args.processes}: no such file (made by `accton FILE`)")
        dump = subprocess.run(["dump-acct", str(args.processes)], capture_output=True, text=True)
        if dump.returncode:
            parser.error(f"dump-acct {args.processes}: {dump.stderr.strip() or f'exit {dump.returncode}'}")
        print(process_summary(processes(dump.stdout), args.top))
        return 0
    print(summary(read(args.profile), args.cores, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
