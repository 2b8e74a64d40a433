"""Issue 23's fault suite, part one: the pipeline killed inside every stage and run again; then each kind of
artifact corrupted under the stage that consumes it.

One tiny tracked run (the smoke config, a few steps) is started as `python run_pipeline.py` again and again;
each start is stopped inside the next stage — SIGTERM (`kill PID`, `ray job stop`, a scheduler's preemption),
Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or SIGKILL (the OOM killer, a lost node) —
until a last start finishes. The signals are spread so that each kind of stage (the driver's own work:
ingest, spm, evaluate; Ray Data: tokenize, distill; Ray Train: teacher, train) meets an interruption and a
SIGKILL; the train stage meets both, its second start being stopped after it resumed. After every stop:
SIGTERM and Ctrl-C end the run within STOP_S with exit 143 / 130 and one `error:` line, and leave no
temporary output; no stage directory without `_SUCCESS` exists; no process of that run is left (Ray's node
agents, which outlive a SIGKILL by up to a minute, are checked at the end); the next start runs the stopped
stage again. At the end: the run completes, the Ray Train stages resumed from their checkpoints, and no
MLflow run is left RUNNING — each stopped start's runs are KILLED with the reason in their `error` tag. A
sweep (`run_pipeline.py tune`, one trial) on the finished run's data is then stopped by SIGTERM while it trains,
within STOP_S, and `--resume` completes it. The finished run then serves the corruption checks (see the
test's second part).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import run_pipeline
from pipeline.stage import HOLD_ENV, SUCCESS
from pipeline.tracking.store import STAGE_TAG
from tests.checkpoints import registered_under, resumed
from tests.conftest import SESSION_RAY_TMPDIR

REPO = Path(run_pipeline.__file__).resolve().parent
SMOKE = REPO / "configs" / "smoke.yaml"
TINY = ["tracking.enabled=true", "teacher.train.max_steps=4", "teacher.train.validate_every=2",
        "train.max_steps=20", "train.validate_every=5", "train.num_workers=1", "train.keep_checkpoints=2",
        "train.average_best=1", "evaluate.max_sentences=10", "evaluate.latency_sentences=2",
        "evaluate.throughput_batch=4",
        # validations and evaluate's penalty tuning on 10 sentences, not the smoke config's 50, and no teacher rows in
        # evaluate (teachers of 4 updates decode to their length limit): what is stopped is the same, in less time
        "train.valid_max_sentences=10", "teacher.train.valid_max_sentences=10", "evaluate.teacher_baseline=false"]
MARK = "DUPLEX_FAULT_RUN"  # in the environment of the run and of every process it starts (Ray's too)
HELD = ("ingest", "spm")
AGENT = re.compile(r"ray::(DashboardAgent|RuntimeEnvAgent)")
STAGE_DIR = re.compile(r"^[a-z]+-[0-9a-f]{12}$")


def _files(workdir: Path, pattern: str) -> list[Path]:
    return list(workdir.glob(pattern))


# When each start is stopped: the stage's temporary directory exists (its build began), and then (`ready`,
# given the workdir)... a Ray Train stage once it has a registered checkpoint (the train stage's second stop:
# one saved after it resumed). SIGINT is Ctrl-C: sent to the run's process group. Each kind of signal reaches
# a Ray Data stage and a Ray Train fit (issue 55: Ctrl-C reached only distill, tokenize only SIGKILL).
KILLS = [
    # ingest and spm last a fraction of a second on this corpus: each is held at its own point inside its build
    # (HOLD_ENV, stage.drill_hold) until the signal: ingest with its train split written, spm with its sample drawn
    ("ingest", signal.SIGTERM, lambda w: _files(w, ".ingest-*.tmp/train/part-00000.parquet")),
    ("spm", signal.SIGKILL, lambda w: True),
    ("tokenize", signal.SIGINT, lambda w: True),
    ("teacher", signal.SIGTERM, lambda w: registered_under(w / "ray_results", "teacher-*")),
    ("distill", signal.SIGINT, lambda w: True),
    ("train", signal.SIGKILL, lambda w: registered_under(w / "ray_results", "train-*")),  # then it resumes
    ("train", signal.SIGINT, lambda w: any(map(resumed, registered_under(w / "ray_results", "train-*")))),
    ("evaluate", signal.SIGTERM, lambda w: True),
]
# The sweep's stop and --resume need one trial, not the smoke config's three (each a Ray Train start): the three
# of them made the sweep 323 of the suite's 857 s (2-core box, 2026-11-27).
ONE_TRIAL = ("tune.space={loss.lambda_fba: {grid: [0.1]}}",)
STOP_S = 10  # what an interrupted run may take to end (issue 40: SIGTERM in train once took over a minute)
EXIT = {signal.SIGTERM: (143, "SIGTERM"), signal.SIGINT: (130, "Ctrl-C")}


# After a SIGKILL Ray's two node agents see their raylet die and try to tell the (dead) GCS, which Ray gives
# 60 s (`publish_error_to_driver`'s fixed timeout, whatever RAY_gcs_rpc_server_reconnect_timeout_s says):
# the last SIGKILL comes two starts before the final one, so that their minute passes while those run.
AGENTS_LINGER_S = 60


def _processes_of(mark: str) -> list[str]:
    """`pid cmdline` of every process whose environment carries MARK=mark."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ")[:100].decode(errors="replace")
                found.append(f"{proc.name} {command}")
        except OSError:  # gone, or not ours
            continue
    return found


class Start:
    """One `python run_pipeline.py` of the tiny run, its output in files beside the workdir."""

    def __init__(self, workdir: Path, number: int, hold: str = "", command: tuple[str, ...] = (),
                 tmpdir: Path | None = None, extra: tuple[str, ...] = ()) -> None:
        self.mark = uuid.uuid4().hex
        self.stdout, self.stderr = (workdir.parent / f"start{number}.{kind}" for kind in ("out", "err"))
        # A SIGKILLed driver's Ray processes try to reach its GCS, gone too, for the reconnect timeout (60 s by
        # default): 5 s here (the node agents' last report has its own minute: AGENTS_LINGER_S).
        env = {**os.environ, "PYTHONUNBUFFERED": "1", MARK: self.mark, "RAY_gcs_rpc_server_reconnect_timeout_s": "5"}
        env.pop("RAY_ADDRESS", None)
        env.pop(HOLD_ENV, None)
        if hold:
            env[HOLD_ENV] = hold
        if tmpdir is not None:  # as on a user's machine: no RAY_TMPDIR (the suite sets one), the system temp here
            env.pop("RAY_TMPDIR", None)
            env.pop(SESSION_RAY_TMPDIR, None)
            env["TMPDIR"] = str(tmpdir)
        with open(self.stdout, "w") as out, open(self.stderr, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "run_pipeline.py", *command, "--config", str(SMOKE),
                                          f"workdir={workdir}", *TINY, *extra], cwd=REPO, env=env, stdout=out, stderr=err,
                                         start_new_session=True)  # its own process group, as from a shell

    def stop(self, sig: signal.Signals, where: str, how_to_continue: str) -> float:
        """Send `sig` (SIGINT: Ctrl-C, to the whole process group as a terminal does) and check the exit: an
        interruption ends within STOP_S with its exit code and one `error:` line, a SIGKILL at once."""
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
        leaves out Ray's two node agents, which outlive a SIGKILLed driver by up to AGENTS_LINGER_S."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = [p for p in _processes_of(self.mark) if agents or not AGENT.search(p)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)


@pytest.mark.slow
def test_killed_inside_every_stage_then_run_again_and_corrupted_artifacts_are_refused(tmp_path, capsys, request):
    import mlflow

    workdir = tmp_path / "work"
    killed: list[Start] = []
    took: dict[str, float] = {}  # seconds from the signal to the run's exit
    phases: list[str] = []  # where the suite's time goes (shown with -rA): start to signal, signal to exit, the rest
    for number, (stage, sig, ready) in enumerate(KILLS):
        began = time.monotonic()
        start = Start(workdir, number, hold=stage if stage in HELD else "")
        start.wait_for(lambda: f"] {stage}: running" in start.stdout.read_text(encoding="utf-8")
                       and _files(workdir, f".{stage}-*.tmp") and ready(workdir), f"stage {stage} under way")
        where = f"stopped in {stage} with {sig.name}"
        reached = time.monotonic()
        took[where] = start.stop(sig, where, "finished stages are kept")
        if sig != signal.SIGKILL:  # a SIGKILL leaves its .tmp: the next start removes it
            assert not _files(workdir, ".*.tmp"), f"{where}: temporary output left"
        unfinished = [p.name for p in workdir.iterdir() if STAGE_DIR.match(p.name) and not (p / SUCCESS).is_file()]
        assert not unfinished, f"{where}: published without {SUCCESS}: {unfinished}"
        assert not _files(workdir, f"{stage}-*/{SUCCESS}"), f"{where}: the stage finished anyway"
        left = start.processes_left(30, agents=False)
        assert not left, f"{where}: processes of the run still alive after 30 s: {left}"
        killed.append(start)
        phases.append(f"{where}: {reached - began:5.1f} s to the signal, {took[where]:4.1f} s to the exit, "
                      f"{time.monotonic() - began - took[where] - (reached - began):4.1f} s after")

    began = time.monotonic()
    final = Start(workdir, len(KILLS))
    assert final.proc.wait(timeout=600) == 0, final.text()[-5000:]
    phases.append(f"the last start: {time.monotonic() - began:5.1f} s")
    began = time.monotonic()
    out = final.stdout.read_text(encoding="utf-8")
    assert "[7/7] evaluate: running" in out and out.count("skipped (finished earlier)") == 2 * 6
    last = json.loads((workdir / "last_run.json").read_text(encoding="utf-8"))
    assert last["stages"]["evaluate"]["status"] == "ran"
    train_dir = Path(last["stages"]["train"]["output"])
    assert json.loads((train_dir / "report.json").read_text(encoding="utf-8"))["restarts"] == 2  # resumed twice
    assert last["stages"]["train"]["counts"]["steps"] == 20

    for start in killed:  # by now Ray's agents have given up too
        left = start.processes_left(AGENTS_LINGER_S + 30)
        assert not left, f"processes of a killed run still alive: {left}"
    phases.append(f"waiting for the killed starts' node agents: {time.monotonic() - began:5.1f} s")

    mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    parents = [r for r in runs if r.data.tags[STAGE_TAG] == "pipeline"]
    assert sorted(r.info.status for r in parents) == ["FINISHED"] + ["KILLED"] * len(KILLS)
    errors = sorted(r.data.tags["error"] for r in parents if r.info.status == "KILLED")
    count = {sig: sum(s == sig for _, s, _ in KILLS) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)}
    assert sum(e.startswith("Terminated: SIGTERM") for e in errors) == count[signal.SIGTERM]
    assert sum(e.startswith("KeyboardInterrupt: Ctrl-C") for e in errors) == count[signal.SIGINT]
    assert sum(" ended without closing this run (killed)" in e for e in errors) == count[signal.SIGKILL]
    killed_teacher = [r.data.tags[STAGE_TAG] for r in runs if r.data.tags[STAGE_TAG].startswith("teacher ")
                      and r.info.status == "KILLED"]
    # both directions were under way when SIGTERM came (one run trains both: issue 53), closed with their stage
    assert sorted(killed_teacher) == ["teacher src2tgt", "teacher tgt2src"]

    # A sweep on the finished run's data, stopped by SIGTERM while its one trial trains, then resumed.
    # Started as a user starts it, without the suite's RAY_TMPDIR: Ray's files go to the user's own
    # <temp>/duplex-<uid> (mode 700), not the machine-wide /tmp/ray (issue 55). A short path: Ray's socket names
    # must fit 107 bytes.
    own_tmp = Path(tempfile.mkdtemp(prefix="dpx-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(own_tmp, ignore_errors=True))
    began = time.monotonic()
    sweep = Start(workdir, len(KILLS) + 1, command=("tune",), tmpdir=own_tmp, extra=ONE_TRIAL)
    sweep.wait_for(lambda: registered_under(workdir / "ray_results", "tune-*/**"), "a trial's checkpoint")
    took["stopped in tune with SIGTERM"] = sweep.stop(
        signal.SIGTERM, "stopped in tune with SIGTERM", "finished stages are kept, the sweep published nothing and "
        "kept its state: the same command with --resume continues it")
    assert not _files(workdir, "tune-*/" + SUCCESS) and not _files(workdir, ".*.tmp")
    assert not sweep.processes_left(30, agents=False)
    private = own_tmp / f"duplex-{os.getuid()}"
    assert (private.stat().st_mode & 0o777) == 0o700 and list((private / "ray").glob("session_*/logs"))
    runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    assert [r.info.status for r in runs if r.data.tags[STAGE_TAG] == "tune"] == ["KILLED"]
    phases.append(f"the sweep started and stopped: {time.monotonic() - began:5.1f} s")
    began = time.monotonic()
    resumed = Start(workdir, len(KILLS) + 2, command=("tune", "--resume"), extra=ONE_TRIAL)
    assert resumed.proc.wait(timeout=600) == 0, resumed.text()[-5000:]
    phases.append(f"the sweep resumed to its end: {time.monotonic() - began:5.1f} s")
    began = time.monotonic()
    assert len(_files(workdir, "tune-*/" + SUCCESS)) == 1
    runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    assert [r.info.status for r in runs if r.data.tags[STAGE_TAG] == "tune"] == ["FINISHED"]  # reopened

    # Part two on the finished run: each kind of artifact corrupted, then the stage that consumes it run
    # (in this process: the inputs are checked before Ray starts). One error line naming the file and the
    # fix; nothing published; with the file back, the consumer completes.
    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    outputs = {name: Path(entry["output"]) for name, entry in last["stages"].items()}
    for producer, relative, damage, consumer, problem in [
        ("ingest", "manifest.json", lambda f: f.write_text("{ truncated"), "spm", r"unreadable \(.*\)"),
        ("spm", "spm.model", flip, "tokenize", r"changed \(SHA-256 differs\)"),
        ("tokenize", "train/part-00000.parquet", flip, "teacher", r"changed \(SHA-256 differs\)"),
        ("teacher", "src2tgt/model/model.pt", lambda f: f.write_bytes(f.read_bytes()[:100]), "distill",
         r"has 100 bytes, \d+ were written"),
        ("distill", "train/part-00000.parquet", flip, "train", r"changed \(SHA-256 differs\)"),
        ("train", "model/config.json", lambda f: f.write_text("{}"), "evaluate", r"has 2 bytes, \d+ were written"),
        ("train", "model/extra.pt", lambda f: f.write_bytes(b"planted"), "evaluate", r"not written by stage"),
    ]:
        target = outputs[producer] / relative
        original = target.read_bytes() if target.exists() else None
        damage(target)
        before = sorted(p.name for p in workdir.iterdir())
        argv = ["--config", str(SMOKE), f"workdir={workdir}", *TINY, "--stages", consumer, "--force"]
        assert run_pipeline.main(argv) == 2, (producer, relative)
        err = capsys.readouterr().err.strip().splitlines()
        assert re.match(rf"error: {re.escape(str(target))}: {problem}.* --stages {producer} --force$", err[-1]), err[-1]
        assert sorted(p.name for p in workdir.iterdir()) == before  # nothing published or removed
        target.unlink()
        if original is not None:
            target.write_bytes(original)
    assert run_pipeline.main(["--config", str(SMOKE), f"workdir={workdir}", *TINY, "--stages", "evaluate",
                              "--force"]) == 0
    capsys.readouterr()
    phases.append(f"the corrupted artifacts: {time.monotonic() - began:5.1f} s")
    for where, seconds in took.items():  # shown with -rA
        print(f"{seconds:5.1f} s  {where}")
    print("\n".join(phases))
