"""Ray Tune sweeps: the space, trial configs, and (slow) real sweeps of the smoke config through Ray."""
import csv
import math
import os
import random
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

import run_pipeline
from pipeline import signals
from pipeline.config import ConfigError, load_config
from pipeline.stages import tune
from pipeline.tracking.store import STAGE_TAG
from pipeline.tracking.sweeps import trial_name
from tests.checkpoints import registered_under
from tests.pipeline.test_raytrain import make_group, wait_for_cpus
from tests.starts import Start

SMOKE = Path(run_pipeline.__file__).resolve().parent / "configs" / "smoke.yaml"


def test_the_space_is_checked_when_the_config_loads():
    with pytest.raises(ConfigError, match=r"tune.space.loss.lambda_cc: expected one of"):
        load_config(SMOKE, ["tune.space={loss.lambda_cc: {between: [0, 1]}}"])
    with pytest.raises(ConfigError, match=r"low must be > 0 \(use zero: p for 0\)"):
        load_config(SMOKE, ["tune.space={loss.lambda_cc: {loguniform: [0, 1]}}"])
    with pytest.raises(ConfigError, match="not a training key"):
        load_config(SMOKE, ["tune.space={data.max_chars: {choice: [10, 20]}}"])
    with pytest.raises(ConfigError, match=r"^tune\.space\.model: not a training key"):  # a section, not a key
        load_config(SMOKE, ["tune.space={model: {choice: [1]}}"])
    with pytest.raises(ConfigError, match="unknown key 'loss.lambda_xyz'"):
        load_config(SMOKE, ["tune.space={loss.lambda_xyz: {choice: [1]}}"])
    with pytest.raises(ConfigError, match="tokenize filtered"):
        load_config(SMOKE, ["tune.space={model.upsample_ratio: {choice: [1, 2]}}"])
    cfg = load_config(SMOKE, ["tune.space={model.upsample_ratio: {choice: [2, 3]}, loss.lambda_fba: "
                              "{loguniform: [0.01, 1.0], zero: 0.25}}"])
    assert set(cfg.tune.space) == {"model.upsample_ratio", "loss.lambda_fba"}


def test_trial_config_applies_dotted_values_and_validates():
    base = load_config(SMOKE)
    cfg = tune.trial_config(base, {"model.upsample_ratio": 3, "loss.lambda_cc": 0.5, "train.lr": 1e-3})
    assert (cfg.model.upsample_ratio, cfg.loss.lambda_cc, cfg.train.lr) == (3, 0.5, 1e-3)
    assert cfg.model.d_model == base.model.d_model and base.loss.lambda_cc == 0.1  # the base is untouched
    with pytest.raises(ConfigError, match=r"^loss\.lambda_fba: must be >= 0, got -1\.0$"):
        tune.trial_config(base, {"loss.lambda_fba": -1.0})
    # Found by the Multi30k CPU sweep: a trial above the smallest swept ratio was refused by the base's space.
    sweep = load_config(SMOKE, ["tune.space={model.upsample_ratio: {grid: [2, 3]}}"])
    trial = tune.trial_config(sweep, {"model.upsample_ratio": 3})
    assert trial.model.upsample_ratio == 3 and trial.tune.space == {} and sweep.tune.space


def test_log_uniform_with_zero_samples_zero_at_its_rate_and_log_uniformly_otherwise():
    random.seed(0)
    values = [tune._log_uniform_or_zero(0.01, 1.0, 0.25) for _ in range(20_000)]
    zeros = sum(v == 0.0 for v in values)
    assert abs(zeros / len(values) - 0.25) < 0.015
    rest = sorted(v for v in values if v)
    assert 0.01 <= rest[0] and rest[-1] <= 1.0
    assert abs(math.log10(rest[len(rest) // 2]) - (-1.0)) < 0.05  # median of log-uniform: geometric mean
    below = sum(v < 0.1 for v in rest) / len(rest)
    assert abs(below - 0.5) < 0.02  # half the mass in each decade


@pytest.mark.slow
def test_three_trial_sweep_tracks_every_trial_and_writes_a_trainable_best_yaml(smoke_data, capsys, ray_session,
                                                                              request):
    """One trial at a time, in grid order, with ASHA on a configured metric that separates the trials
    even on the tiny smoke data (validation BLEU there is noise around 0.3): the training CTC loss. The
    third trial (an lr that cannot learn in 20 steps) is worse than both others at the step-20 rung and
    is stopped there; the first always runs to the end. The first invocation runs out of its time budget
    (the stall watchdog) part-way: nothing is published. --resume, started from a shell as a user starts it,
    is stopped by SIGTERM while a trial trains; --resume again finishes the same sweep."""
    tmp_path = smoke_data  # with the smoke config's data stages finished (tests/pipeline/conftest.py)
    import ray

    args = ["tune", "--config", str(SMOKE), f"workdir={tmp_path}", "distill.enabled=false", "tracking.enabled=true",
            "train.num_workers=1",
            "tune.space={train.lr: {grid: [0.001, 0.002, 0.000001]}}", "tune.max_concurrent=1",
            "tune.grace_period=20", "tune.metric=train_ctc_src2tgt", "tune.mode=min", "train.valid_max_sentences=10"]
    began = time.monotonic()
    assert run_pipeline.main(args + ["tune.time_budget_s=15"]) == 2
    phases = [f"the sweep out of its time budget: {time.monotonic() - began:5.1f} s"]  # shown with -rA
    err = capsys.readouterr().err
    assert "tune.time_budget_s=15 ran out with " in err and "add --resume to continue it" in err, err
    assert not list(tmp_path.glob("tune-*"))  # nothing published: no _SUCCESS, trials.csv or best.yaml
    assert run_pipeline.main(args) == 2  # the unfinished sweep is not silently started over
    assert "add --resume to continue it, or --force to start it over" in capsys.readouterr().err
    began = time.monotonic()
    _resume_then_stop_it_with_sigterm_while_it_trains(args, tmp_path, request, phases)
    began = time.monotonic()
    assert run_pipeline.main(args + ["--resume"]) == 0
    phases.append(f"resumed to its end: {time.monotonic() - began:5.1f} s")
    out = capsys.readouterr().out
    assert "tune: 3 trials (" in out and "failed" not in out.split("tune: 3 trials")[1].split(")")[0]
    # every trial's CPUs back: a removed group's CPUs come back within moments
    wait_for_cpus(ray.cluster_resources()["CPU"], timeout_s=10.0, explain=_holders)
    tune_dir = next(tmp_path.glob("tune-*"))
    with open(tune_dir / "trials.csv", newline="") as handle:
        rows = {float(r["train.lr"]): r for r in csv.DictReader(handle)}
    assert set(rows) == {0.002, 0.001, 0.000001}
    assert rows[0.000001]["status"] == "stopped early" and 20 <= int(rows[0.000001]["steps"]) < 30
    assert rows[0.001]["status"] == "finished"
    assert {row["seed"] for row in rows.values()} == {"1"}  # one sample: the config's seed
    best_row = min(rows.values(), key=lambda r: float(r["train_ctc_src2tgt"]))
    best = load_config(tune_dir / "best.yaml")
    assert best.train.lr == float(best_row["train.lr"]) and best.train.lr > 0.000001
    assert best.model == load_config(SMOKE).model and best.workdir == str(tmp_path)
    assert (tune_dir / "bleu_vs_params.png").stat().st_size > 1000

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
    parents = [r for r in runs if r.data.tags[STAGE_TAG] == "tune"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].info.run_name == f"smoke-{tune_dir.name}"
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(trials) == 3
    assert {r.info.run_name for r in trials} == {"lr=0.001", "lr=0.002", "lr=1e-06"}
    for run in trials:
        assert run.info.status == "FINISHED", run.data.tags  # stopped trials are closed too
        assert {"valid_bleu_src2tgt", "valid_bleu_tgt2src", "valid_bleu"} <= set(run.data.metrics)
        assert "train.lr" in run.data.params
        assert len(mlflow.MlflowClient().get_metric_history(run.info.run_id, "train_total")) >= 2  # per step
    assert parents[0].data.metrics["best_train_ctc_src2tgt"] == pytest.approx(float(best_row["train_ctc_src2tgt"]))
    stopped = [r for r in trials if r.data.tags.get("stopped_early") == "true"]
    assert 1 <= len(stopped) == parents[0].data.metrics["stopped_early"] <= 2
    assert "1e-06" in {r.data.params["train.lr"] for r in stopped}

    assert run_pipeline.main(args) == 0  # finished: not swept again
    assert next(tmp_path.glob("tune-*")) == tune_dir
    began = time.monotonic()
    _compare_view_in_chromium(f"sqlite:///{tmp_path}/mlflow.db", runs)
    phases.append(f"the compare view in Chromium: {time.monotonic() - began:5.1f} s")
    print("\n".join(phases))


def _resume_then_stop_it_with_sigterm_while_it_trains(args: list[str], workdir: Path, request,
                                                      phases: list[str]) -> None:
    """`run_pipeline.py <args> --resume` as a subprocess with a Ray of its own, as a user starts it: without the
    suite's RAY_TMPDIR its Ray files go to the user's own <temp>/duplex-<uid> (mode 700), not the machine-wide
    /tmp/ray (a short temporary directory: Ray's socket names must fit 107 bytes). SIGTERM once a trial has
    registered a new checkpoint: the sweep ends within STOP_S with exit 143 and one line saying --resume
    continues it, publishes nothing, leaves no process, and its MLflow run is KILLED."""
    import mlflow

    own_tmp = Path(tempfile.mkdtemp(prefix="dpx-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(own_tmp, ignore_errors=True))
    before = set(registered_under(workdir / "ray_results", "tune-*/**"))
    began = time.monotonic()
    sweep = Start([*args, "--resume"], own_tmp / "sweep", tmpdir=own_tmp)
    sweep.wait_for(lambda: set(registered_under(workdir / "ray_results", "tune-*/**")) - before,
                   "a trial's new checkpoint")
    phases.append(f"resumed from a shell, to a new checkpoint: {time.monotonic() - began:5.1f} s")
    sweep.stop(signal.SIGTERM, "stopped in tune with SIGTERM", "finished stages are kept, the sweep published "
               "nothing and kept its state: the same command with --resume continues it")
    assert not list(workdir.glob("tune-*/_SUCCESS")) and not list(workdir.glob(".*.tmp"))
    assert not sweep.processes_left(30, agents=False)
    private = own_tmp / f"duplex-{os.getuid()}"
    assert (private.stat().st_mode & 0o777) == 0o700 and list((private / "ray").glob("session_*/logs"))
    mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    assert [r.info.status for r in runs if r.data.tags[STAGE_TAG] == "tune"] == ["KILLED"]


def _compare_view_in_chromium(store: str, runs: list) -> None:
    """The sweep's trials in MLflow's compare view, read by headless Chromium (bench/mlflow_ui.py), show
    each trial by name, the swept parameter and the sweep's metric (the view lists only the metrics that differ
    between the trials; on the smoke data the validation BLEUs may not). Without Chromium the test is skipped,
    saying so, but under CI=true (.ci/run installs Chromium) it fails."""
    from bench import mlflow_ui

    if mlflow_ui.chromium() is None:
        reason = ("the compare view was not checked: chromium is not installed (Debian: apt-get install -y chromium; "
                  ".ci/run installs it where apt can)")
        if os.environ.get("CI"):
            pytest.fail(f"CI must check the compare view: {reason}")
        pytest.skip(reason)
    trials = mlflow_ui.sweep_trials(runs)
    assert len(trials) == 3
    with mlflow_ui.mlflow_ui(store) as base:
        page = base + mlflow_ui.compare_link(trials[0].info.experiment_id, tuple(run.info.run_id for run in trials))
        dom = mlflow_ui.browse(page)
    assert mlflow_ui.missing_texts(dom, mlflow_ui.compare_texts(trials, ("train_ctc_src2tgt",))) == [], page


@pytest.mark.parametrize("ci", ["", "true"])
def test_without_chromium_the_compare_view_is_skipped_saying_why_and_under_ci_fails(monkeypatch, ci):
    """The sweep test's browser check never passes unchecked: without Chromium it skips with the reason, and under
    CI=true, where Chromium is installed, it fails."""
    from bench import mlflow_ui

    monkeypatch.setattr(mlflow_ui, "chromium", lambda: None)
    monkeypatch.setenv("CI", ci)
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(outcome, match="chromium is not installed"):
        _compare_view_in_chromium("sqlite:///unused.db", [])


@pytest.mark.slow
def test_a_failing_trial_does_not_stop_the_sweep(smoke_data, capsys, ray_session):
    tmp_path = smoke_data  # with the smoke config's data stages finished (tests/pipeline/conftest.py)
    args = ["tune", "--config", str(SMOKE), f"workdir={tmp_path}", "distill.enabled=false", "tracking.enabled=false",
            "train.num_workers=1",
            "train.max_steps=10", "train.validate_every=5", "train.max_failures=0", "tune.grace_period=5",
            "tune.space={train.fail_at_step: {grid: [0, 3]}}"]
    assert run_pipeline.main(args) == 0
    out = capsys.readouterr().out
    assert "tune: 2 trials (1 finished, 1 failed)" in out and "fault drill" in out
    with open(next(tmp_path.glob("tune-*")) / "trials.csv", newline="") as handle:
        rows = {r["train.fail_at_step"]: r for r in csv.DictReader(handle)}
    assert rows["3"]["status"] == "error" and "fault drill" in rows["3"]["error"]
    assert rows["0"]["status"] == "finished" and float(rows["0"]["valid_bleu"]) >= 0


def test_after_a_sweep_a_trial_group_the_driver_still_holds_is_removed_and_said(ray_session, caplog):
    """A CI flake (a CPU still held 10 s after a resumed sweep returned): after the fit, a placement
    group this job's driver made (Tune's trial groups) still there once the wait is over is removed too."""
    import ray

    job = ray.get_runtime_context().get_job_id()
    full = ray.cluster_resources()["CPU"]
    make_group(1.0)  # made by the driver, as Tune makes a trial's
    assert ray.available_resources().get("CPU", 0) <= full - 1
    with caplog.at_level("WARNING", logger="pipeline.stages.tune"):
        tune._release_all(job, timeout_s=1.0)
    assert "removed 1 Tune trial placement group(s) still held 1 s after the sweep" in caplog.text
    wait_for_cpus(full)
    # an interrupted sweep (Ctrl-C, SIGTERM) does not wait: its stop has 10 s in all (tests/faults)
    make_group(1.0)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="pipeline.stages.tune"):
        tune._release_all(job, timeout_s=0.0)
    assert time.monotonic() - started < 1.0
    assert "removed 1 Tune trial placement group(s) still held when the sweep was interrupted" in caplog.text
    wait_for_cpus(full)


def test_after_a_sweep_a_controller_still_alive_is_waited_for_and_the_group_it_makes_then_released(ray_session):
    """A CI failure: a CPU held after a resumed sweep by a Ray Train group whose creator was dead, made after
    the wait had counted no groups. A controller of this job still alive is waited for (here it makes its group
    2 s in and is killed, as Tune kills a trial, 4 s in); then its group is released."""
    import threading

    import ray

    job = ray.get_runtime_context().get_job_id()
    full = ray.cluster_resources()["CPU"]
    controller = ray.remote(num_cpus=0)(type("TrainController", (), {
        "make": lambda self, cpus, delay: (time.sleep(delay), make_group(cpus))[1]})).remote()
    ray.get(controller.__ray_ready__.remote(), timeout=60)
    controller.make.remote(1.0, 2.0)
    killer = threading.Timer(4.0, ray.kill, (controller,))
    killer.start()
    started = time.monotonic()
    try:
        tune._release_all(job, timeout_s=30.0)
    finally:
        killer.join()
    assert 4.0 <= time.monotonic() - started < 30.0
    assert not tune._live_trial_actors(job)
    wait_for_cpus(full, timeout_s=5.0)


def test_after_a_sweep_a_group_registered_after_a_clean_reading_is_still_released(ray_session, caplog):
    """A group registered after a reading that found nothing (a controller killed while creating it has it
    registered after its death: bench/orphan_race.py) is seen within the settle window and released; one clean
    reading does not end the wait. Here the driver makes it 1 s in."""
    import threading

    import ray

    job = ray.get_runtime_context().get_job_id()
    full = ray.cluster_resources()["CPU"]
    late = threading.Timer(1.0, make_group, (1.0,))
    late.start()
    try:
        with caplog.at_level("WARNING", logger="pipeline.stages.tune"):
            tune._release_all(job, timeout_s=4.0)
    finally:
        late.join()
    assert "removed 1 Tune trial placement group(s) still held 4 s after the sweep" in caplog.text
    wait_for_cpus(full, timeout_s=5.0)


def test_ctrl_c_or_sigterm_during_a_sweep_stops_it_gracefully_then_raises_the_signal_s_error():
    """Tune's own stop (SIGUSR1: experiment state saved, trials stopped) on the first signal; once fit has
    returned, the error the signal's previous handler raises (pipeline.signals' Terminated for SIGTERM)."""
    import os
    import signal

    stops = []
    old_usr1 = signal.getsignal(signal.SIGUSR1)
    old_term = signal.signal(signal.SIGTERM, signals._raise_terminated)
    try:
        with pytest.raises(KeyboardInterrupt):  # before Tune's loop started: at once
            with tune._graceful_interrupts():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100):
                    pass
        for signum, error in ((signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, signals.Terminated)):
            with tune._graceful_interrupts() as interrupted:
                signal.signal(signal.SIGUSR1, lambda *_: stops.append("tune stops"))  # as tune.run does
                os.kill(os.getpid(), signum)
                for _ in range(100):  # the handlers run between bytecodes
                    if stops and interrupted:
                        break
            assert stops.pop() == "tune stops" and len(interrupted) == 1
            with pytest.raises(error):
                interrupted[0]()
        assert signal.getsignal(signal.SIGTERM) is signals._raise_terminated  # restored
        assert signal.getsignal(signal.SIGUSR1) is old_usr1
    finally:
        signal.signal(signal.SIGUSR1, old_usr1)
        signal.signal(signal.SIGTERM, old_term)


def test_repeats_of_a_point_train_with_their_own_seeds():
    """`tune --samples 3` over two choices once drew one point twice and trained it twice with one seed. Tune
    numbers trials in draw order, each sample drawing the grid once: a trial's seed is train.seed + its sample."""
    issue = load_config(SMOKE, ["tune.space={model.upsample_ratio: {choice: [2, 3]}, loss.lambda_cc: {choice: [0.0, 0.1]}}",
                                "tune.num_samples=3", "train.seed=7"])
    assert [tune.trial_seed(issue, f"ab12c_{k:05d}") for k in range(3)] == [7, 8, 9]  # every draw its own seed
    grid = load_config(SMOKE, ["tune.num_samples=2", "train.seed=7"])  # lambda_fba: a 3-point grid, twice
    assert [tune.trial_seed(grid, f"ab12c_{k:05d}") for k in range(6)] == [7, 7, 7, 8, 8, 8]
    assert tune.trial_values(grid, {"loss.lambda_fba": 0.1}, ["loss.lambda_fba"], "ab12c_00004") == \
        {"loss.lambda_fba": 0.1, "train.seed": 8}
    once = load_config(SMOKE, [])  # one sample: every trial the config's seed, named by its values alone
    assert tune.trial_values(once, {"loss.lambda_fba": 0.1}, ["loss.lambda_fba"], "ab12c_00002") == {"loss.lambda_fba": 0.1}
    searched = tune.trial_seed(issue, "3f2a9c1d")  # a searcher's id (optuna): a seed from the id
    assert searched != 7 and searched == tune.trial_seed(issue, "3f2a9c1d")
    swept = load_config(SMOKE, ["tune.space={train.seed: {grid: [1, 2]}}", "tune.num_samples=2"])
    assert tune.trial_seed(swept, "ab12c_00003") == swept.train.seed  # a swept seed is the trial's own value
    assert tune.trial_values(swept, {"train.seed": 2}, ["train.seed"], "ab12c_00003") == {"train.seed": 2}
    assert trial_name({"loss.lambda_cc": 0.1, "train.seed": 8}) == "λcc=0.1 seed=8"


def test_trial_runs_are_named_by_their_values():
    from pipeline.tracking.sweeps import trial_name

    assert trial_name({"train.lr": 0.002, "loss.lambda_fba": 0.1}) == "λfba=0.1 lr=0.002"
    assert trial_name({"loss.lambda_cc": 0.123456789, "model.upsample_ratio": 3}) == "λcc=0.1235 upsample=3"


def test_a_trial_that_never_reported_is_not_run_one_tune_did_not_end_unfinished_one_ended_by_its_own_rule_finished():
    from types import SimpleNamespace

    cfg = load_config(SMOKE)
    frame = __import__("pandas").DataFrame([{"step": 10, "valid_bleu": 0.3}])
    never = SimpleNamespace(metrics_dataframe=None, error=None, path="/x/t0", metrics={}, config={})
    cut = SimpleNamespace(metrics_dataframe=frame, error=None, path="/x/t1", metrics={}, config={})
    assert tune._row(never, [], cfg)["status"] == "not run"
    assert tune._row(cut, [], cfg, ended=False)["status"] == "unfinished"
    assert tune._row(cut, [], cfg, ended=True)["status"] == "stopped early"
    # a trial that its own time cap or patience ended before max_steps, Tune marking it ended: "finished"
    for rule in ("max_time", "patience"):
        own = __import__("pandas").DataFrame([{"step": 10, "valid_bleu": 0.3, "stopped_by": None},
                                              {"step": 12, "valid_bleu": 0.4, "stopped_by": rule}])
        timed = SimpleNamespace(metrics_dataframe=own, error=None, path="/x/t2", metrics={}, config={})
        assert tune._row(timed, [], cfg, ended=True)["status"] == "finished"
        assert tune._row(timed, [], cfg, ended=False)["status"] == "unfinished"
    rows = [{"status": s} for s in ("finished", "finished", "stopped early", "error", "not run")]
    assert tune._counts(rows) == "2 finished, 1 stopped early, 1 failed, 1 not run"


def test_a_trial_whose_last_reports_never_reached_tune_is_read_from_its_ray_train_record(tmp_path):
    """A sweep stopped just as a trial finished: Tune saw the trial's reports up to step 20 of 30 only, its Ray
    Train run's newest checkpoint holds them all (an older one, and a newer one whose history was cut, beside
    it). The row is the trial's: finished at 30, with its best validation, which Tune never saw."""
    import json
    from types import SimpleNamespace

    from pipeline.training import raytrain

    cfg = load_config(SMOKE, ["train.max_steps=30"])
    seen = __import__("pandas").DataFrame([{"step": 10, "valid_bleu": 0.3}, {"step": 20, "valid_bleu": 0.4}])
    result = SimpleNamespace(metrics_dataframe=seen, error=None, path="/x/t1", metrics={}, config={})
    run = tmp_path / tune.trial_run("t1")
    history = [{"step": 10, "valid_bleu": 0.3}, {"step": 20, "valid_bleu": 0.4},
               {"step": 25, "resumed_from": 25}, {"step": 30, "valid_bleu": 0.7, "bleu_src2tgt": 0.6}]
    for name, entries in (("checkpoint_2026-01-01_00-00-01.000000", history[:2]),
                          ("checkpoint_2026-01-01_00-00-02.000000", history)):
        (run / name).mkdir(parents=True)
        (run / name / "history.json").write_text(json.dumps(entries))
    (run / "checkpoint_2026-01-01_00-00-03.000000").mkdir()
    (run / "checkpoint_2026-01-01_00-00-03.000000" / "history.json").write_text('[{"step": 3')  # cut by a kill
    assert raytrain.recorded_history(run) == history
    assert raytrain.recorded_history(tmp_path / "none") == []
    row = tune._row(result, [], cfg, ended=True, recorded=raytrain.recorded_history(run))
    assert (row["status"], row["steps"], row["valid_bleu"], row["bleu_src2tgt"]) == ("finished", 30, 0.7, 0.6)
    assert tune._row(result, [], cfg, ended=True)["status"] == "stopped early"  # Tune's reports alone


def test_a_trial_that_can_never_be_placed_is_an_error_before_the_sweep(ray_session):
    cfg = load_config(SMOKE, ["train.num_workers=1", "train.cpus_per_worker=3", "train.start_timeout_s=1"])
    with pytest.raises(tune.StageError, match=r"cannot hold 1 worker\(s\) \(CPU: need 3, cluster has 2\)"):
        tune.check_trial_fits(cfg)
    tune.check_trial_fits(load_config(SMOKE, ["train.num_workers=1"]))  # fits: no error, no wait


def test_fractional_gpu_trials_pack_on_one_gpu_and_bad_fractions_are_config_errors(monkeypatch):
    """`train.gpus_per_worker: 0.25` runs four trials at once on one GPU (Ray schedules
    fractional GPU requests); a fraction over 1 and a fractional DDP group (two ranks on one GPU) are errors."""
    import ray

    gpu = ["train.use_gpu=true", "train.num_workers=1", "train.cpus_per_worker=2"]
    nodes = [{"Alive": True, "Resources": {"CPU": 16.0, "GPU": 1.0, "memory": 64 * 2**30}}]
    monkeypatch.setattr(ray, "cluster_resources", lambda: nodes[0]["Resources"])
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    for fraction, concurrent in ((1.0, 1), (0.5, 2), (0.25, 4), (0.3, 3)):
        cfg = load_config(SMOKE, gpu + [f"train.gpus_per_worker={fraction}"])
        assert tune._concurrency(cfg) == concurrent
        tune.check_trial_fits(cfg)  # one worker's bundle fits the node
    assert tune._concurrency(load_config(SMOKE, gpu + ["train.gpus_per_worker=0.1"])) == 8  # then CPUs: 16 / 2
    with pytest.raises(ConfigError, match=r"^train\.gpus_per_worker: must be a fraction of one GPU \(<= 1\) or "
                                          r"whole GPUs, got 1\.5$"):
        load_config(SMOKE, gpu + ["train.gpus_per_worker=1.5"])
    load_config(SMOKE, ["train.use_gpu=true", "train.num_workers=2", "train.gpus_per_worker=0.5"])  # gloo: fine
    load_config(SMOKE, ["train.use_gpu=true", "train.num_workers=2", "train.gpus_per_worker=2"])  # whole GPUs: fine


def _holders() -> str:
    """What may hold a CPU when the check above fails (a CI flake): the placement groups not removed,
    with their creator and state, and the live actors with their class and resources."""
    import ray
    from ray.util.state import list_actors

    groups = [{k: g.get(k) for k in ("placement_group_id", "name", "state", "bundles", "creator_job_id",
                                     "is_detached")} for g in ray.util.placement_group_table().values()
              if g.get("state") != "REMOVED"]
    actors = [{k: getattr(a, k, None) for k in ("class_name", "state", "pid", "placement_group_id", "required_resources")}
              for a in list_actors(address=ray.get_runtime_context().gcs_address, filters=[("state", "=", "ALIVE")],
                                   detail=True)]
    return f"CPUs held after the sweep; placement groups not removed: {groups}; live actors: {actors}"
