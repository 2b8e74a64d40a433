"""The fault drill: the pipeline killed inside every stage and run again; then each kind of
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
MLflow run is left RUNNING — each stopped start's runs are KILLED with the reason in their `error` tag. The
finished run then serves the corruption checks (see the test's second part). A sweep stopped while it trains is
tests/pipeline/test_tune.py's.
"""
from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

import run_pipeline
from pipeline.stage import SUCCESS
from pipeline.tracking.store import STAGE_TAG
from tests.checkpoints import registered_under, resumed
from tests.starts import Start, processes_of

REPO = Path(run_pipeline.__file__).resolve().parent
SMOKE = REPO / "configs" / "smoke.yaml"
TINY = ["tracking.enabled=true", "teacher.train.max_steps=4", "teacher.train.validate_every=2",
        "train.max_steps=20", "train.validate_every=5", "train.num_workers=1", "train.keep_checkpoints=2",
        "train.average_best=1", "evaluate.max_sentences=10", "evaluate.latency_sentences=2",
        "evaluate.throughput_batch=4",
        # validations and evaluate's penalty tuning on 10 sentences, not the smoke config's 50, and no teacher rows in
        # evaluate (teachers of 4 updates decode to their length limit): what is stopped is the same, in less time
        "train.valid_max_sentences=10", "teacher.train.valid_max_sentences=10", "evaluate.teacher_baseline=false",
        # Ray started without its dashboard (2-3 s and 4-5 CPU-s less a start on 2 cores), but where `tiny_start` keeps it
        "ray.dashboard=false"]
HELD = ("ingest", "spm")
STAGE_DIR = re.compile(r"^[a-z]+-[0-9a-f]{12}$")


def _files(workdir: Path, pattern: str) -> list[Path]:
    return list(workdir.glob(pattern))


# When each start is stopped: the stage's temporary directory exists (its build began), and then (`ready`,
# given the workdir)... a Ray Train stage once it has a registered checkpoint (the train stage's second stop:
# one saved after it resumed). SIGINT is Ctrl-C: sent to the run's process group. Each kind of signal reaches
# a Ray Data stage and a Ray Train fit.
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
# After a SIGKILL Ray's two node agents see their raylet die and try to tell the (dead) GCS, which Ray gives
# 60 s (`publish_error_to_driver`'s fixed timeout, whatever RAY_gcs_rpc_server_reconnect_timeout_s says):
# the last SIGKILL comes two starts before the final one, so that their minute passes while those run.
AGENTS_LINGER_S = 60


# The starts stopped by SIGKILL keep Ray's dashboard (its module processes must go with the run too); the others start
# their Ray without it (TINY), which the drill checks as it goes.
DASHBOARD_KEPT = signal.SIGKILL
DASHBOARD_MODULE = "ray-dashboard-"  # the title of each of the dashboard's module processes


def tiny_start(workdir: Path, number: int, hold: str = "", dashboard: bool = False) -> Start:
    """One start of the tiny run, its output beside the workdir."""
    return Start(["--config", str(SMOKE), f"workdir={workdir}", *TINY, *(["ray.dashboard=true"] if dashboard else [])],
                 workdir.parent / f"start{number}", hold=hold)


@pytest.mark.slow
def test_killed_inside_every_stage_then_run_again_and_corrupted_artifacts_are_refused(tmp_path, capsys):
    import mlflow

    workdir = tmp_path / "work"
    killed: list[Start] = []
    took: dict[str, float] = {}  # seconds from the signal to the run's exit
    phases: list[str] = []  # where the suite's time goes (shown with -rA): start to signal, signal to exit, the rest
    for number, (stage, sig, ready) in enumerate(KILLS):
        began = time.monotonic()
        start = tiny_start(workdir, number, hold=stage if stage in HELD else "", dashboard=sig == DASHBOARD_KEPT)
        start.wait_for(lambda: f"] {stage}: running" in start.stdout.read_text(encoding="utf-8")
                       and _files(workdir, f".{stage}-*.tmp") and ready(workdir), f"stage {stage} under way")
        where = f"stopped in {stage} with {sig.name}"
        if stage not in HELD:  # Ray is up: with its dashboard's modules only where kept
            modules = [p for p in processes_of(start.mark) if DASHBOARD_MODULE in p]
            assert bool(modules) == (sig == DASHBOARD_KEPT), f"{where}: the dashboard's modules: {modules}"
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
    final = tiny_start(workdir, len(KILLS))
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
    # both directions were under way when SIGTERM came (one run trains both), closed with their stage
    assert sorted(killed_teacher) == ["teacher src2tgt", "teacher tgt2src"]

    began = time.monotonic()
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
