"""`python run_pipeline.py ...` started as a user starts it from a shell, then stopped by a signal: the fault drill
(tests/faults/test_kill.py) and the sweep stopped while it trains (tests/pipeline/test_tune.py)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import run_pipeline
from pipeline.stage import HOLD_ENV
from tests.conftest import SESSION_RAY_TMPDIR

REPO = Path(run_pipeline.__file__).resolve().parent
MARK = "DUPLEX_FAULT_RUN"  # in the environment of the run and of every process it starts (Ray's too)
AGENT = re.compile(r"ray::(DashboardAgent|RuntimeEnvAgent)")
STOP_S = 10  # what an interrupted run may take to end (SIGTERM in train once took over a minute)
EXIT = {signal.SIGTERM: (143, "SIGTERM"), signal.SIGINT: (130, "Ctrl-C")}


def _processes() -> dict[int, tuple[int, str, bytes]]:
    """pid -> (parent pid, start time in clock ticks since boot, environment) of every process that can be read."""
    table = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()  # after `pid (comm)`: state, ppid, ...
            table[int(proc.name)] = (int(stat[1]), stat[19], (proc / "environ").read_bytes())
        except (OSError, IndexError, ValueError):  # gone, or not ours
            continue
    return table


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:100].decode(errors="replace")
    except OSError:
        return "(gone)"


def family_of(mark: str, table: dict[int, tuple[int, str, bytes]] | None = None) -> dict[int, str]:
    """pid -> start time of every process whose environment carries MARK=mark, and of every descendant of one: a
    process that retitles itself (setproctitle: Ray's dashboard modules, its node agents) overwrites the memory
    that /proc/<pid>/environ reads, so the mark is found in its ancestors only. `table`: `_processes()` read
    already."""
    table = _processes() if table is None else table
    needle = f"{MARK}={mark}".encode()
    found = {pid for pid, (_, _, environ) in table.items() if needle in environ.split(b"\0")}
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    pending = list(found)
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return {pid: table[pid][1] for pid in found}


def processes_of(mark: str, known: dict[int, str] | None = None) -> list[str]:
    """`pid cmdline` of every process of `family_of(mark)`, and of `known` (a family seen earlier: a descendant whose
    parent has died is no longer linked to the mark) where the same process (pid and start time) still runs."""
    table = _processes()
    family = family_of(mark, table)
    family.update({pid: start for pid, start in (known or {}).items() if pid in table and table[pid][1] == start})
    return [f"{pid} {_command(pid)}" for pid in sorted(family)]


class Start:
    """One `python run_pipeline.py *args`, its output in `<logs>.out` and `<logs>.err`. `hold` names the stage
    that waits inside its build for the signal (HOLD_ENV); `tmpdir` starts it as on a user's machine: without the
    suite's RAY_TMPDIR, the system temporary directory there."""

    def __init__(self, args: list[str], logs: Path, hold: str = "", tmpdir: Path | None = None) -> None:
        self.mark = uuid.uuid4().hex
        self.family: dict[int, str] = {}  # its processes when it was signalled (`stop`)
        self.stdout, self.stderr = (logs.with_name(f"{logs.name}.{kind}") for kind in ("out", "err"))
        # A SIGKILLed driver's Ray processes try to reach its GCS, gone too, for the reconnect timeout (60 s by
        # default): 5 s here (the node agents' last report has its own minute).
        env = {**os.environ, "PYTHONUNBUFFERED": "1", MARK: self.mark, "RAY_gcs_rpc_server_reconnect_timeout_s": "5"}
        env.pop("RAY_ADDRESS", None)
        env.pop(HOLD_ENV, None)
        if hold:
            env[HOLD_ENV] = hold
        if tmpdir is not None:
            env.pop("RAY_TMPDIR", None)
            env.pop(SESSION_RAY_TMPDIR, None)
            env["TMPDIR"] = str(tmpdir)
        with open(self.stdout, "w") as out, open(self.stderr, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "run_pipeline.py", *args], cwd=REPO, env=env, stdout=out,
                                         stderr=err, start_new_session=True)  # its own process group, as from a shell

    def stop(self, sig: signal.Signals, where: str, how_to_continue: str) -> float:
        """Send `sig` (SIGINT: Ctrl-C, to the whole process group as a terminal does) and check the exit: an
        interruption ends within STOP_S with its exit code and one `error:` line, a SIGKILL at once."""
        self.family = family_of(self.mark)  # as it was when signalled: `processes_left` follows it
        signalled = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        said = None  # when the `error:` line came: the stage's cleanup and Ray's shutdown are before it
        while self.proc.poll() is None and time.monotonic() - signalled < 120:
            if said is None and "\nerror: " in self.stderr.read_text(encoding="utf-8", errors="replace"):
                said = time.monotonic() - signalled
            time.sleep(0.05)
        code = self.proc.wait(timeout=1)
        took = time.monotonic() - signalled
        if sig == signal.SIGKILL:
            assert code == -signal.SIGKILL, (where, code)
            return took
        expected, name = EXIT[sig]
        assert code == expected, f"{where}: exit {code}\n{self.text()[-3000:]}"
        split = "no error line before the exit" if said is None else f"{said:.1f} s to its error line"
        assert took <= STOP_S, f"{where}: the run took {took:.1f} s to stop ({split})\n{self.text()[-3000:]}"
        last = self.stderr.read_text(encoding="utf-8").strip().splitlines()[-1]
        assert last.startswith(f"error: interrupted by {name}; {how_to_continue}"), (where, last)
        return took

    def text(self) -> str:
        return self.stdout.read_text(encoding="utf-8") + self.stderr.read_text(encoding="utf-8")

    def wait_for(self, condition, what: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended (exit {self.proc.returncode}) before {what}:\n{self.text()[-3000:]}")
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"no {what} after {timeout_s} s:\n{self.text()[-3000:]}")
            time.sleep(0.05)

    def processes_left(self, timeout_s: float, agents: bool = True) -> list[str]:
        """This start's processes still alive after waiting up to `timeout_s` for them to end; `agents=False`
        leaves out Ray's two node agents, which outlive a SIGKILLed driver by up to a minute."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = [p for p in processes_of(self.mark, self.family) if agents or not AGENT.search(p)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)
