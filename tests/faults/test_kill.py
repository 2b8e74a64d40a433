"""Issue 23's fault suite, part one: the pipeline killed inside every stage, then run again.

One tiny tracked run (the smoke config, a few steps) is started as `python run_pipeline.py` again and again;
each start is killed inside the next stage — SIGTERM (`kill PID`, a scheduler's preemption) or SIGKILL (the
OOM killer, a lost node) — until a last start finishes. Each stage is killed once; the signals alternate so
that each kind of stage (the driver's own work: ingest, spm, evaluate; Ray Data: tokenize, distill; Ray
Train: teacher, train) meets both. After every kill: SIGTERM exits 143 with one `error:` line and leaves no
temporary output; no stage directory without `_SUCCESS` exists; no process of that run (Ray's included) is
left; the next start runs the killed stage again. At the end: the run completes, the killed Ray Train stage
resumed from its checkpoint, and no MLflow run is left RUNNING — each killed start's runs are KILLED with the
reason in their `error` tag.
"""
from __future__ import annotations

import json
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
from pipeline.stage import HOLD_ENV, SUCCESS

REPO = Path(run_pipeline.__file__).resolve().parent
SMOKE = REPO / "configs" / "smoke.yaml"
TINY = ["tracking.enabled=true", "teacher.train.max_steps=4", "teacher.train.validate_every=2",
        "train.max_steps=12", "train.validate_every=2", "train.num_workers=1", "train.keep_checkpoints=2",
        "train.average_best=1", "evaluate.max_sentences=10", "evaluate.latency_sentences=2",
        "evaluate.throughput_batch=4"]
MARK = "DUPLEX_FAULT_RUN"  # in the environment of the run and of every process it starts (Ray's too)
STAGE_DIR = re.compile(r"^[a-z]+-[0-9a-f]{12}$")


def _files(workdir: Path, pattern: str) -> list[Path]:
    return list(workdir.glob(pattern))


# When each start is killed: the stage's temporary directory exists (its build began), and then...
KILLS = [
    ("ingest", signal.SIGTERM, lambda w: True),
    ("spm", signal.SIGKILL, lambda w: True),  # a 0.1 s stage: held in its build (HOLD_ENV)
    ("tokenize", signal.SIGKILL, lambda w: True),
    ("teacher", signal.SIGTERM, lambda w: _files(w, "ray_results/teacher-*-src2tgt/checkpoint_*")),
    ("distill", signal.SIGTERM, lambda w: True),
    ("train", signal.SIGKILL, lambda w: _files(w, "ray_results/train-*/checkpoint_*")),  # then it resumes
    ("evaluate", signal.SIGKILL, lambda w: True),
]


def _processes_of(mark: str) -> list[str]:
    """`pid cmdline` of every process whose environment carries MARK=mark."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append(f"{proc.name} {(proc / 'cmdline').read_bytes().replace(b'\0', b' ')[:100].decode()}")
        except OSError:  # gone, or not ours
            continue
    return found


class Start:
    """One `python run_pipeline.py` of the tiny run, its output in files beside the workdir."""

    def __init__(self, workdir: Path, number: int, hold: str = "") -> None:
        self.mark = uuid.uuid4().hex
        self.stdout, self.stderr = (workdir.parent / f"start{number}.{kind}" for kind in ("out", "err"))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", MARK: self.mark}
        env.pop("RAY_ADDRESS", None)
        env.pop(HOLD_ENV, None)
        if hold:
            env[HOLD_ENV] = hold
        with open(self.stdout, "w") as out, open(self.stderr, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "run_pipeline.py", "--config", str(SMOKE),
                                          f"workdir={workdir}", *TINY], cwd=REPO, env=env, stdout=out, stderr=err)

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

    def no_processes_left(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while (left := _processes_of(self.mark)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"processes of a killed run still alive after {timeout_s} s: {left}"


@pytest.mark.slow
def test_killed_inside_every_stage_then_run_again(tmp_path):
    import mlflow

    workdir = tmp_path / "work"
    for number, (stage, sig, ready) in enumerate(KILLS):
        start = Start(workdir, number, hold=stage if stage == "spm" else "")
        start.wait_for(lambda: f"] {stage}: running" in start.stdout.read_text(encoding="utf-8")
                       and _files(workdir, f".{stage}-*.tmp") and ready(workdir), f"stage {stage} under way")
        start.proc.send_signal(sig)
        code = start.proc.wait(timeout=120)
        where = f"killed in {stage} with {sig.name}"
        if sig == signal.SIGTERM:
            assert code == 143, f"{where}: exit {code}\n{start.text()[-3000:]}"
            last = start.stderr.read_text(encoding="utf-8").strip().splitlines()[-1]
            assert last.startswith("error: interrupted by SIGTERM; finished stages are kept"), (where, last)
            assert not _files(workdir, ".*.tmp"), f"{where}: temporary output left"
        else:
            assert code == -signal.SIGKILL, (where, code)
        unfinished = [p.name for p in workdir.iterdir() if STAGE_DIR.match(p.name) and not (p / SUCCESS).is_file()]
        assert not unfinished, f"{where}: published without {SUCCESS}: {unfinished}"
        assert not _files(workdir, f"{stage}-*/{SUCCESS}"), f"{where}: the stage finished anyway"
        start.no_processes_left()

    final = Start(workdir, len(KILLS))
    assert final.proc.wait(timeout=600) == 0, final.text()[-5000:]
    out = final.stdout.read_text(encoding="utf-8")
    assert "[7/7] evaluate: running" in out and out.count("skipped (finished earlier)") == 2 * 6
    last = json.loads((workdir / "last_run.json").read_text(encoding="utf-8"))
    assert last["stages"]["evaluate"]["status"] == "ran"
    train_dir = Path(last["stages"]["train"]["output"])
    assert json.loads((train_dir / "report.json").read_text(encoding="utf-8"))["restarts"] >= 1  # resumed
    assert last["stages"]["train"]["counts"]["steps"] == 12

    mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    parents = [r for r in runs if r.info.run_name == "pipeline"]
    assert sorted(r.info.status for r in parents) == ["FINISHED"] + ["KILLED"] * len(KILLS)
    errors = sorted(r.data.tags["error"] for r in parents if r.info.status == "KILLED")
    assert sum(e.startswith("Terminated: SIGTERM") for e in errors) == 3
    assert sum(" ended without closing this run (killed)" in e for e in errors) == 4
    killed_teacher = [r for r in runs if r.info.run_name == "teacher src2tgt" and r.info.status == "KILLED"]
    assert len(killed_teacher) == 1  # the direction under way when SIGTERM came, closed with its stage
