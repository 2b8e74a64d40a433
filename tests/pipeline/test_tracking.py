"""MLflow tracking helpers: the tune sweep's runs (SweepTracker) against a local sqlite store, no Ray."""
import contextlib
import json
import os
import pickle
import re
from pathlib import Path

import pytest

from mlflow.tracking import MlflowClient

from pipeline.config import TrackingConfig
from pipeline.tracking.plots import history_panels, plot_history
from pipeline.tracking.store import CACHE_ENV, config_params, flatten, numeric, open_client, store_template
from pipeline.tracking.sweeps import SweepTracker


def test_flatten_numeric_and_config_params():
    nested = {"a": {"b": 1, "c": [1, 2]}, "d": float("nan"), "e": True, "f": "x" * 600}
    assert flatten(nested) == {"a.b": 1, "a.c": [1, 2], "d": nested["d"], "e": True, "f": "x" * 600}
    assert numeric(nested) == {"a.b": 1.0}
    params = config_params(nested)
    assert params["a.c"] == "[1, 2]" and len(params["f"]) == 500


def test_sweep_tracker_opens_tracks_and_closes_runs_by_the_trials_verdicts(tmp_path):
    assert SweepTracker.open(TrackingConfig(enabled=False), tmp_path, "tune-x", {}, "") is None
    tracker = SweepTracker.open(TrackingConfig(experiment="sweeps", run_prefix="base"), tmp_path, "tune-abc",
                                {"train": {"lr": 0.001}}, "train:\n  lr: 0.001\n")
    assert pickle.loads(pickle.dumps(tracker)) == tracker  # Ray ships it to the trials
    client = MlflowClient(tracker.uri)
    assert tracker.uri == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    parent = client.get_run(tracker.parent_run_id)
    assert parent.info.run_name == "base-tune-abc" and parent.data.tags["tune_dir"] == "tune-abc"
    assert parent.data.params == {"train.lr": "0.001"}

    targets = {trial: tracker.trial_run(trial, {"train.lr": lr})
               for trial, lr in (("t1", 0.001), ("t2", 0.002), ("t3", 1e-6), ("t4", 0.5))}
    assert tracker.trial_run("t1", {"train.lr": 99}) == targets["t1"]  # a retried trial gets its run back
    run = client.get_run(targets["t1"]["run_id"])
    assert run.info.run_name == "lr=0.001" and run.data.params == {"train.lr": "0.001"}
    assert run.data.tags["trial_id"] == "t1" and run.data.tags["mlflow.parentRunId"] == tracker.parent_run_id
    tracker.finish_trial(targets["t1"], {"valid_bleu": 3.0, "bleu_src2tgt": 2.0, "bleu_tgt2src": 4.0, "step": 9})
    for trial in ("t3", "t4"):  # Tune stopped t3 (its trainer interrupted); t4 failed
        tracker.tag_error(targets[trial], RuntimeError(f"{trial} interrupted"))

    nan = float("nan")
    rows = [{"trial_id": "t1", "status": "finished", "valid_bleu": 3.0},
            {"trial_id": "t2", "status": "finished", "valid_bleu": 5.0, "bleu_src2tgt": 4.5, "bleu_tgt2src": 5.5},
            {"trial_id": "t3", "status": "stopped early", "valid_bleu": 1.0, "bleu_src2tgt": nan},
            {"trial_id": "t4", "status": "error", "valid_bleu": nan}]
    tracker.close_trials(rows)
    runs = {trial: client.get_run(target["run_id"]) for trial, target in targets.items()}
    assert {t: r.info.status for t, r in runs.items()} == {"t1": "FINISHED", "t2": "FINISHED", "t3": "FINISHED",
                                                         "t4": "FAILED"}
    assert runs["t1"].data.metrics == {"valid_bleu": 3.0, "valid_bleu_src2tgt": 2.0, "valid_bleu_tgt2src": 4.0}
    assert runs["t2"].data.metrics == {"valid_bleu": 5.0, "valid_bleu_src2tgt": 4.5, "valid_bleu_tgt2src": 5.5}
    assert runs["t3"].data.metrics == {"valid_bleu": 1.0} and runs["t3"].data.tags["stopped_early"] == "true"
    assert "error" not in runs["t3"].data.tags  # a stop is not an error
    assert runs["t4"].data.tags["error"] == "RuntimeError: t4 interrupted" and not runs["t4"].data.metrics
    assert not any("stopped_early" in r.data.tags for t, r in runs.items() if t != "t3")

    (tmp_path / "trials.csv").write_text("trial_id\nt1\n", encoding="utf-8")
    tracker.publish([tmp_path / "trials.csv"], {"best_valid_bleu": 5.0, "trials": 4, "failed": 1})
    parent = client.get_run(tracker.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics == {"best_valid_bleu": 5.0, "trials": 4.0, "failed": 1.0}
    assert {a.path for a in client.list_artifacts(tracker.parent_run_id)} == {"config.yaml", "trials.csv"}


def test_a_failed_sweep_closes_every_open_run_failed(tmp_path):
    tracker = SweepTracker.open(TrackingConfig(), tmp_path, "tune-abc", {}, "")
    done, running = tracker.trial_run("t1", {}), tracker.trial_run("t2", {})
    tracker.finish_trial(done, None)
    tracker.close_trials([], failed=True)
    client = MlflowClient(tracker.uri)
    assert client.get_run(done["run_id"]).info.status == "FINISHED"
    assert client.get_run(running["run_id"]).info.status == "FAILED"
    assert client.get_run(tracker.parent_run_id).info.status == "FAILED"


def test_an_interrupted_sweep_is_killed_and_resume_reopens_its_runs(tmp_path):
    tracker = SweepTracker.open(TrackingConfig(), tmp_path, "tune-abc", {}, "")
    stopped, cut = tracker.trial_run("t1", {}), tracker.trial_run("t2", {})
    tracker.close_trials([{"trial_id": "t1", "status": "stopped early"}, {"trial_id": "t2", "status": "unfinished"},
                          {"trial_id": "t3", "status": "not run"}], killed=True)
    client = MlflowClient(tracker.uri)
    assert client.get_run(stopped["run_id"]).data.tags["stopped_early"] == "true"
    assert client.get_run(stopped["run_id"]).info.status == "FINISHED"
    assert client.get_run(cut["run_id"]).info.status == "KILLED"
    assert client.get_run(tracker.parent_run_id).info.status == "KILLED"
    again = SweepTracker.open(TrackingConfig(), tmp_path, "tune-abc", {}, "", resume=True)
    assert again.parent_run_id == tracker.parent_run_id
    assert client.get_run(again.parent_run_id).info.status == "RUNNING"
    assert again.trial_run("t2", {}) == cut and client.get_run(cut["run_id"]).info.status == "RUNNING"
    other = SweepTracker.open(TrackingConfig(), tmp_path, "tune-abc", {}, "")  # no --resume: a new sweep
    assert other.parent_run_id != tracker.parent_run_id


def test_runs_left_running_by_a_killed_process_are_closed_killed_by_the_next_invocation(tmp_path):
    import os
    import subprocess

    from pipeline.tracking.runs import Tracker
    from pipeline.tracking.store import OWNER_HOST, OWNER_PID, ensure_experiment, owner_tags

    client = MlflowClient(f"sqlite:///{tmp_path.resolve()}/mlflow.db")
    experiment = ensure_experiment(client, "duplex", tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process that has ended: what a SIGKILLed pipeline leaves behind

    def parent(tags: dict) -> str:
        return client.create_run(experiment, run_name="pipeline", tags=tags).info.run_id

    killed = parent({**owner_tags(), OWNER_PID: str(gone.pid)})
    stage = client.create_run(experiment, run_name="train", tags={"mlflow.parentRunId": killed}).info.run_id
    alive = parent(owner_tags())  # this very process: still running
    elsewhere = parent({OWNER_HOST: "another-host", OWNER_PID: str(gone.pid)})
    untagged = parent({})

    tracker = Tracker(TrackingConfig(), tmp_path, {"workdir": str(tmp_path)})
    tracker.begin_stage("ingest")
    tracker.close()
    status = {run_id: client.get_run(run_id).info.status for run_id in (killed, stage, alive, elsewhere, untagged)}
    assert status == {killed: "KILLED", stage: "KILLED", alive: "RUNNING", elsewhere: "RUNNING", untagged: "RUNNING"}
    assert "ended without closing" in client.get_run(stage).data.tags["error"]
    mine = client.get_run(tracker.run_id)
    assert mine.info.status == "FINISHED" and mine.data.tags[OWNER_PID] == str(os.getpid())


def test_runs_starting_together_on_a_new_sqlite_store_share_one_experiment(tmp_path):
    """The first client of a sqlite store creates its schema: several runs starting at once must not race in
    MLflow's migrations (an alembic error was seen) or create the experiment twice."""
    import subprocess
    import sys
    import time

    go, store = tmp_path / "go", f"sqlite:///{tmp_path.resolve()}/store/mlflow.db"
    script = ("import sys, time\nfrom pathlib import Path\n"
              "from pipeline.tracking.store import ensure_experiment, open_client\n"
              f"Path({str(tmp_path)!r}, 'ready-' + sys.argv[1]).write_text('')\n"
              f"while not Path({str(go)!r}).exists():\n    time.sleep(0.005)\n"
              f"print(ensure_experiment(open_client({store!r}), 'duplex', Path({str(tmp_path)!r})))\n")
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache")}  # no template yet: the three may each make one
    processes = [subprocess.Popen([sys.executable, "-c", script, str(i)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for i in range(3)]
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready-*"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        go.write_text("")  # release all three at once
        outputs = [process.communicate(timeout=120) for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert [p.returncode for p in processes] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    assert len({out.strip() for out, _ in outputs}) == 1  # one experiment
    assert [path.name for path in (tmp_path / "cache").iterdir()] == [store_template().name]


def _contents(database: Path) -> dict[str, list]:
    """A sqlite file's schema (each statement's lines as a set: MLflow's migrations order a table's constraints
    differently from one run to the next) and every table's rows (the experiments' times left out)."""
    import sqlite3

    def lines(sql: str | None) -> list[str]:
        return sorted(line.strip().rstrip(",").strip() for line in (sql or "").splitlines())

    with contextlib.closing(sqlite3.connect(database)) as db:
        contents = {"schema": sorted((kind, name, lines(sql)) for kind, name, sql in
                                     db.execute("SELECT type, name, sql FROM sqlite_master").fetchall())}
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            cursor = db.execute(f'SELECT * FROM "{table}"')
            columns = [column[0] for column in cursor.description]
            contents[table] = sorted(tuple(value for column, value in zip(columns, row)
                                           if not (table == "experiments" and column.endswith("_time")))
                                     for row in cursor.fetchall())
    return contents


def test_a_new_sqlite_store_is_a_copy_of_the_hosts_template_and_equals_the_store_mlflow_makes(tmp_path, monkeypatch):
    """A new store is this host's migrated empty store copied (made once per MLflow version); what MLflow then
    holds is what it holds in a store it made itself: the same schema and rows, the Default experiment's artifact
    location that of the process's working directory (not the template maker's), the next experiment id 1."""
    from pipeline.tracking import store

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    made = []
    make = store._make_template
    monkeypatch.setattr(store, "_make_template", lambda template: made.append(template) or make(template))
    for name in ("first", "second"):  # the first makes the template, in the `first` directory
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        open_client(f"sqlite:///{tmp_path}/{name}/mlflow.db").search_experiments()
    assert made == [store_template()] and store_template().parent == tmp_path / "cache"
    MlflowClient(f"sqlite:///{tmp_path}/second/mlflow-own.db").search_experiments()  # made by MLflow alone
    copied, own = (_contents(tmp_path / "second" / name) for name in ("mlflow.db", "mlflow-own.db"))
    assert copied == own
    modes = {name: (tmp_path / "second" / name).stat().st_mode for name in ("mlflow.db", "mlflow-own.db")}
    assert modes["mlflow.db"] == modes["mlflow-own.db"], modes  # sqlite's 0644 less the umask, not a temp file's 0600
    assert copied["experiments"] == [(0, "Default", str(tmp_path / "second" / "mlruns" / "0"), "active", "default")]
    assert open_client(f"sqlite:///{tmp_path}/second/mlflow.db").create_experiment("duplex") == "1"
    assert sorted(path.name for path in (tmp_path / "second").iterdir()) == ["mlflow-own.db", "mlflow.db",
                                                                          "mlflow.db.lock"]


@pytest.mark.parametrize("damage", ["a damaged template", "a cache that cannot be written"])
def test_without_a_usable_template_mlflow_makes_the_store(tmp_path, monkeypatch, caplog, damage):
    cache = tmp_path / "cache"
    if damage == "a damaged template":
        cache.mkdir()
        store_template_path = cache / store_template().name
        store_template_path.write_bytes(b"not a sqlite file" * 300)
    else:
        cache.write_text("")  # a file where the directory should be
    monkeypatch.setenv(CACHE_ENV, str(cache))
    monkeypatch.chdir(tmp_path)
    client = open_client(f"sqlite:///{tmp_path}/work/mlflow.db")
    assert client.create_experiment("duplex") == "1"
    assert sorted(path.name for path in (tmp_path / "work").iterdir()) == ["mlflow.db", "mlflow.db.lock"]
    if damage == "a damaged template":
        assert "was refused" in caplog.text and not store_template().exists()


def test_training_plots_put_each_kind_of_loss_on_its_own_panel(tmp_path):
    """The total no longer dwarfs the terms: output losses, auxiliary losses (log scale, zeros
    before they switch on left out) and BLEU per direction each get a panel; a teacher has no aux panel."""
    reder = [{"step": s, "train_total": 30.0, "train_ctc_src2tgt": 9.0, "train_ctc_tgt2src": 8.0,
              "train_fba_src2tgt": 0.0 if s < 20 else 0.8, "train_cc_tgt2src": 0.0 if s < 20 else 5.0} for s in (10, 20)]
    reder += [{"step": 20, "bleu_src2tgt": 0.3, "bleu_tgt2src": 0.5, "valid_bleu": 0.4}]
    assert history_panels(reder) == {"output loss (log scale)": ["train_ctc_src2tgt", "train_ctc_tgt2src"],
                                     "auxiliary losses (log scale)": ["train_cc_tgt2src", "train_fba_src2tgt"],
                                     "validation BLEU (greedy)": ["bleu_src2tgt", "bleu_tgt2src"]}
    teacher = [{"step": 10, "train_total": 6.0, "train_nll_src2tgt": 6.0, "valid_nll_src2tgt": 6.1, "bleu_src2tgt": 0.0}]
    assert list(history_panels(teacher)) == ["output loss (log scale)", "validation BLEU (greedy)"]
    assert plot_history(reder, tmp_path / "training.png").stat().st_size > 10_000


def test_stage_runs_carry_their_config_and_the_experiment_opens_on_its_runs(tmp_path):
    """A stage's run has the config values its directory hash covers as params; the experiment is
    tagged as model development, so MLflow 3's UI opens it on the runs table, not the GenAI traces view."""
    from pipeline.stage import run_stage
    from pipeline.tracking.runs import Tracker
    from pipeline.tracking.store import EXPERIMENT_KIND

    tracker = Tracker(TrackingConfig(enabled=True), tmp_path, {"spm": {"model_type": "bpe"}})
    tracker.begin_stage("spm")
    out = run_stage("spm", tmp_path / "spm-abc", lambda tmp: {"vocab_size": 64},
                    config={"spm": {"model_type": "bpe", "seed": 1}, "vocab_size": 64}, inputs={})
    tables = tmp_path / "translations"
    tables.mkdir()
    (tables / "test.json").write_text('{"source": ["a", "b"], "bleu_src2tgt": [1.5, 0.0]}', encoding="utf-8")
    tracker.log_tables(tables)  # an MLflow table the UI sorts
    # what a training stage read, as MLflow datasets: the distilled train split and the raw valid split
    from pipeline.config import load_config
    from pipeline.tracking.runs import stage_datasets

    def corpus(name: str) -> Path:
        def build(tmp: Path) -> dict:
            for split in ("train", "valid"):
                (tmp / split).mkdir()
                (tmp / split / "part-0.parquet").write_text(f"{name} {split}", encoding="utf-8")
            return {}
        return run_stage(name.split("-")[0], tmp_path / name, build, config={}, inputs={})

    distilled, tokenized = corpus("distill-aaa"), corpus("tokenize-bbb")
    datasets = stage_datasets(load_config(None, ["data.tgt_lang=de"]), "train", {"data": distilled, "tokenize": tokenized})
    assert [(d.name, d.context) for d in datasets] == [("sword-en-de-train-distilled", "training"),
                                                       ("sword-en-de-valid", "validation")]
    assert stage_datasets(load_config(None, []), "teacher", {"data": tokenized})[0].name == "sword-en-es-train-raw"
    assert stage_datasets(load_config(None, []), "evaluate", {"data": tokenized}) == []
    tracker.log_datasets(datasets)
    tracker.end_stage(out, {"vocab_size": 64, "test_bleu_src2tgt": 11.8404722, "length_ratio": 0.987654}, [])
    # Every scored test set its own metrics, BLEU and chrF as reported (two decimals); train and valid
    # (scored into results.json only) none
    row = {"bleu_src2tgt": 11.8404722, "bleu_tgt2src": 9.0, "chrf_src2tgt": 33.333333, "chrf_tgt2src": 30.0,
           "roundtrip_bleu_src": 50.123, "roundtrip_bleu_tgt": 49.0, "sentences": 7}
    tracker.log_results({"split": "test", **row, "sets": {"test": row, "t17": {**row, "bleu_src2tgt": 1.005}, "valid": row}})
    tracker.close()
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("duplex")
    assert experiment.tags[EXPERIMENT_KIND] == "custom_model_development"
    stage = next(r for r in client.search_runs([experiment.experiment_id]) if r.data.tags["duplex.stage"] == "spm")
    assert stage.data.params == {"spm.model_type": "bpe", "spm.seed": "1", "vocab_size": "64"}
    assert stage.data.metrics == {"vocab_size": 64, "test_bleu_src2tgt": 11.84, "length_ratio": 0.987654}
    import mlflow

    assert mlflow.load_table("translations/test.json", run_ids=[stage.info.run_id]).to_dict("list") == \
        {"source": ["a", "b"], "bleu_src2tgt": [1.5, 0.0]}
    assert json.loads(stage.data.tags["mlflow.loggedArtifacts"]) == [{"path": "translations/test.json", "type": "table"}]
    logged = {(i.dataset.name, i.dataset.digest, json.loads(i.dataset.source)["uri"], i.dataset.source_type,
               {t.key: t.value for t in i.tags}["mlflow.data.context"]) for i in stage.inputs.dataset_inputs}
    assert logged == {(d.name, d.digest, str(d.source), "local", d.context) for d in datasets}
    assert len({d.digest for d in datasets}) == 2 and all(len(d.digest) == 12 for d in datasets)
    metrics = client.get_run(tracker.run_id).data.metrics
    assert {key for key in metrics if key.endswith("bleu_src2tgt")} == {"test_bleu_src2tgt", "t17_bleu_src2tgt"}
    assert (metrics["test_bleu_src2tgt"], metrics["t17_bleu_src2tgt"], metrics["t17_chrf_src2tgt"],
            metrics["test_roundtrip_bleu_src"]) == (11.84, round(1.005, 2), 33.33, 50.12)


def test_the_experiment_carries_the_runs_table_view_test_bleu_as_the_installed_ui_reads_it(tmp_path):
    """The experiment is tagged with the saved view "Test BLEU" of its runs table (columns test BLEU
    and chrF both ways, sorted by test BLEU src2tgt, best first), in the form the installed MLflow UI's bundle
    reads: the tag prefix and URL parameter are its constants, the envelope has the fields its reader checks,
    the state only fields its search facets and runs-table state take. An experiment made before the view gets
    it; a view changed in the UI is kept. The run's summary line links to it."""
    import json
    from pathlib import Path

    import mlflow.server

    from pipeline.tracking.store import browse_hint, ensure_experiment
    from pipeline.tracking.views import RUNS_VIEW_KEY, TEST_COLUMNS, runs_page

    bundle = "".join(path.read_text(errors="replace") for path in
                     (Path(mlflow.server.__file__).parent / "js" / "build" / "static" / "js").glob("*.js"))
    assert '="viewStateShareKey"' in bundle and '="mlflow.sharedViewState."' in bundle
    assert "Invalid saved-view envelope: expected an object with a string `name`, number `createdAt`, and string" in bundle
    facets = json.loads(re.search(r'\["searchFilter","orderByKey","orderByAsc"[^\]]*\]', bundle).group())
    table_state = json.loads(re.search(r'\["selectedColumns","columnOrder"[^\]]*\]', bundle).group())

    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    client = MlflowClient(uri)
    old = client.create_experiment("old")  # made before the view was
    assert ensure_experiment(client, "old", tmp_path) == old
    experiment = client.get_experiment(ensure_experiment(client, "duplex", tmp_path))
    for tags in (experiment.tags, client.get_experiment(old).tags):
        envelope = json.loads(tags[f"mlflow.sharedViewState.{RUNS_VIEW_KEY}"])
        assert envelope["name"] == "Test BLEU" and isinstance(envelope["createdAt"], int)
        assert envelope["updatedAt"] == envelope["createdAt"] and isinstance(envelope["state"], str)
        state = json.loads(envelope["state"])
        assert set(state) <= set(facets) | set(table_state)
        assert state["selectedColumns"] == [f"metrics.`{key}`" for key in TEST_COLUMNS]
        assert state["orderByKey"] == "metrics.`test_bleu_src2tgt`" and state["orderByAsc"] is False
    assert TEST_COLUMNS[:2] == ("test_bleu_src2tgt", "test_bleu_tgt2src")

    changed = json.dumps({**envelope, "name": "mine"})
    client.set_experiment_tag(old, f"mlflow.sharedViewState.{RUNS_VIEW_KEY}", changed)
    ensure_experiment(client, "old", tmp_path)
    assert client.get_experiment(old).tags[f"mlflow.sharedViewState.{RUNS_VIEW_KEY}"] == changed

    page = f"#/experiments/{experiment.experiment_id}/runs?viewStateShareKey={RUNS_VIEW_KEY}&workflowType=machine_learning"
    assert runs_page(experiment.experiment_id) == page
    assert browse_hint(uri, "duplex") == f"mlflow ui --backend-store-uri {uri}   then http://127.0.0.1:5000/{page}"
    assert browse_hint(uri, "nothing") == ""
    nowhere = f"sqlite:///{tmp_path.resolve()}/none/mlflow.db"
    assert browse_hint(nowhere, "duplex") == "" and not (tmp_path / "none").exists()  # not created by asking


def test_the_trained_model_is_registered_as_a_pyfunc_that_translates_both_ways(tiny_model_dir, tmp_path, caplog):
    """The train stage's model directory logged as an MLflow pyfunc (its code and the `reder` package
    inside the logged model) and registered; loaded back from the registry it translates each row in the
    direction the row names, as `reder.load` does; a bad row is MLflow's INVALID_PARAMETER_VALUE (HTTP 400
    from `mlflow models serve`), naming the row."""
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException

    import reder
    from pipeline.stage import run_stage
    from pipeline.tracking.runs import Tracker

    tracker = Tracker(TrackingConfig(run_prefix="tiny"), tmp_path, {"data": {"src_lang": "en", "tgt_lang": "de"}},
                      target="train-0123456789ab")
    tracker.begin_stage("train", "train-0123456789ab")
    out = run_stage("train", tmp_path / "train-0123456789ab", lambda tmp: {}, config={}, inputs={})
    tracker.end_stage(out, {}, [], model=tiny_model_dir)
    # The alias @champion goes to the first evaluated version, then only to a version that beats it
    row = {"bleu_src2tgt": 10.0, "bleu_tgt2src": 10.0, "references_sha256": "abc"}
    results = {"split": "test", "src_lang": "en", "tgt_lang": "de", "sets": {"test": row}}
    assert tracker.promote(results, tmp_path / "nowhere") == ""  # no version of that train stage
    assert "moved to version 1: mean test BLEU 10.00" in tracker.promote(results, out)
    assert tracker.promote(results, out) == "models:/reder-en-de@champion is version 1 already"
    tracker.begin_stage("train", "train-second")  # a second model: version 2, worse one way, better on the mean
    second = run_stage("train", tmp_path / "train-second", lambda tmp: {}, config={}, inputs={})
    tracker.end_stage(second, {}, [], model=tiny_model_dir)
    worse = {**results, "sets": {"test": {**row, "bleu_src2tgt": 12.0, "bleu_tgt2src": 8.0}}}  # a tie: stays
    assert tracker.promote(worse, second).startswith("models:/reder-en-de@champion stays version 1: version 2 has mean")
    better = {**results, "sets": {"test": {**row, "bleu_src2tgt": 9.0, "bleu_tgt2src": 12.0}}}
    assert "moved to version 2: mean test BLEU 10.50 (src2tgt 9.00, tgt2src 12.00) beats the holder's 10.00" in \
        tracker.promote(better, second)
    tracker.close()
    client = MlflowClient(tracker.uri)
    assert str(client.get_model_version_by_alias("reder-en-de", "champion").version) == "2"
    assert client.get_model_version("reder-en-de", "1").tags["test_bleu_src2tgt"] == "10.0"
    run = client.get_run(tracker.run_id)
    assert run.info.run_name == "tiny-pipeline-0123456789ab"
    stage = [r for r in client.search_runs([run.info.experiment_id]) if r.data.tags["duplex.stage"] == "train"][-1]
    assert stage.info.run_name == "tiny-train-0123456789ab" and stage.data.tags["model_uri"] == "models:/reder-en-de/1"

    served = mlflow.pyfunc.load_model("models:/reder-en-de/1")
    local = reder.load(tiny_model_dir)
    # reder.load and the Serve backend take the alias's URI (MLflow from the environment's tracking URI)
    from pipeline.serve import load_backend

    mlflow.set_tracking_uri(tracker.uri)
    by_alias = reder.load("models:/reder-en-de@champion")
    assert by_alias.translate("the cat", "en", "de") == local.translate("the cat", "en", "de")
    assert load_backend("models:/reder-en-de@champion", "torch", "cpu", 1).languages == local.languages
    rows = pd.DataFrame([{"text": "the cat", "src": "en", "tgt": "de"}, {"text": "a dog ran", "src": "de", "tgt": "en"},
                         {"text": "the bird", "src": "en", "tgt": "de"}])
    greedy = [local.translate("the cat", "en", "de"), local.translate("a dog ran", "de", "en"),
              local.translate("the bird", "en", "de")]
    assert served.predict(rows) == greedy
    beam3 = [local.translate("the cat", "en", "de", beam=3), local.translate("a dog ran", "de", "en", beam=3),
             local.translate("the bird", "en", "de", beam=3)]
    assert served.predict(rows, params={"beam": 3}) == beam3 != greedy
    # the decoders by reder/decoding/'s names: decoder "beam" with beam 3 is reder.load's translate(..., beam=3)
    assert served.predict(rows, params={"beam": 3, "decoder": "beam"}) == beam3
    for bad, params, message in [
        ({"text": "the cat", "src": "en", "tgt": "fr"}, None, "row 1: this model translates en->de and de->en, not en->fr"),
        ({"text": "  ", "src": "en", "tgt": "de"}, None, "row 1: text is empty"),
        ({"text": "x" * 2001, "src": "en", "tgt": "de"}, None, "row 1: text has 2001 characters, more than 2000"),
        ({"text": "the\rcat", "src": "en", "tgt": "de"}, {"strict": True}, "row 1: text U+000D (CARRIAGE RETURN) at character 4"),
        ({"text": "the\u2029cat", "src": "en", "tgt": "de"}, {"strict": True}, "row 1: text U+2029 (PARAGRAPH SEPARATOR) at character 4"),
        ({"text": "the \x07cat", "src": "en", "tgt": "de"}, {"strict": True}, "row 1: text U+0007 (a control character) at character 5"),
        ({"text": "the cat", "src": "en", "tgt": "de"}, {"beam": 0}, "params.beam: must be >= 1, got 0"),
        ({"text": "the cat", "src": "en", "tgt": "de"}, {"decoder": "viterbi"},
         "row 0: decoder 'viterbi': a CTC REDER decodes with greedy, beam"),
    ]:
        with pytest.raises(MlflowException, match=re.escape(message)) as caught:
            served.predict(pd.DataFrame([{"text": "ok", "src": "en", "tgt": "de"}, bad]), params=params)
        assert caught.value.error_code == "INVALID_PARAMETER_VALUE"
    # Not strict (the default): such a row is mended and translated, and a warning names it.
    mended = pd.DataFrame([{"text": "ok", "src": "en", "tgt": "de"}, {"text": "the\u2029cat", "src": "en", "tgt": "de"}])
    with caplog.at_level("WARNING"):
        assert served.predict(mended) == [local.translate("ok", "en", "de"), local.translate("the cat", "en", "de")]
    assert "row 1: text U+2029 (PARAGRAPH SEPARATOR) at character 4 replaced by a space" in caplog.text


def test_kept_checkpoints_are_logged_models_ranked_by_validation_bleu_beside_the_registered_model(tiny_model_dir, tmp_path):
    """Each checkpoint a training stage kept is an MLflow LoggedModel by reference (no copy: its path a param), with
    its step and its validation scores linked to it and to the run's validation dataset, an output of the stage's
    run at its step; `mlflow.search_logged_models` ranks them by valid_bleu. The points the workers logged into the
    run are the ones linked: the run's history keeps one point per validation. The registered version's source
    is the averaged model's pyfunc LoggedModel."""
    import mlflow
    from ray.train import Checkpoint

    from pipeline.stage import run_stage
    from pipeline.tracking.runs import CHECKPOINT_MODEL_TYPE, Dataset, Tracker
    from pipeline.metrics import shown
    from pipeline.training.raytrain import kept_checkpoint

    directories = {step: tmp_path / "ray_results" / f"checkpoint_{step}" for step in (10, 20, 30)}
    bleus = {10: (4.0, 6.0), 20: (9.0, 8.0), 30: (7.0, 6.5)}  # as MLflow shows them; the reports have more digits
    reports = {step: {"step": step, "loss": 3.5, "bleu_src2tgt": bleus[step][0] + 0.00123, "bleu_tgt2src": bleus[step][1],
                      "valid_bleu": sum(bleus[step]) / 2 + 0.000615, "valid_length_ratio_src2tgt": 0.9,
                      "blank_penalty_src2tgt": 0.5} for step in directories}
    kept = []
    for step, directory in directories.items():
        directory.mkdir(parents=True)
        (directory / "model.pt").write_bytes(b"weights")
        kept.append(kept_checkpoint(Checkpoint.from_directory(str(directory)), reports[step]))
    assert kept[0] == {"step": 10, "uri": str(directories[10]), "validation": {  # not the loss, not the penalty
        "valid_bleu_src2tgt": 4.0, "valid_bleu_tgt2src": 6.0, "valid_bleu": 5.0, "valid_length_ratio_src2tgt": 0.9}}

    assert Tracker(TrackingConfig(enabled=False), tmp_path, {}).log_checkpoints(kept) == []
    tracker = Tracker(TrackingConfig(run_prefix="tiny"), tmp_path, {"data": {"src_lang": "en", "tgt_lang": "de"}},
                      target="train-0123456789ab")
    tracker.begin_stage("train", "train-0123456789ab")
    valid = Dataset("multi30k-en-de-valid", "0123abcd", tmp_path / "tokenize-x" / "valid", "validation")
    tracker.log_datasets([Dataset("multi30k-en-de-train-raw", "99aa", tmp_path / "tokenize-x" / "train", "training"), valid])
    client = MlflowClient(tracker.uri)
    for step in (5, 10, 15, 20, 25, 30):  # what rank 0 logs: BLEU at each validation, not the length ratio
        client.log_metric(tracker.stage_run_id, "train_total", 1.0, step=step)
        if step in reports:
            for key in ("bleu_src2tgt", "bleu_tgt2src", "valid_bleu"):
                client.log_metric(tracker.stage_run_id, key if key == "valid_bleu" else f"valid_{key}",
                                  shown(key, reports[step][key]), step=step)
    ids = tracker.log_checkpoints(list(reversed(kept)))
    out = run_stage("train", tmp_path / "train-0123456789ab", lambda tmp: {}, config={}, inputs={})
    tracker.end_stage(out, {"steps": 30}, [], model=tiny_model_dir)
    tracker.close()

    mlflow.set_tracking_uri(tracker.uri)
    stage = next(r for r in client.search_runs([client.get_experiment_by_name("duplex").experiment_id])
                 if r.data.tags["duplex.stage"] == "train")
    ranked = mlflow.search_logged_models(
        experiment_ids=[stage.info.experiment_id], filter_string=f"model_type = '{CHECKPOINT_MODEL_TYPE}'",
        order_by=[{"field_name": "metrics.valid_bleu", "ascending": False}], output_format="list")
    assert [m.name for m in ranked] == [f"train-0123456789ab-step-{step}" for step in (20, 30, 10)]
    assert sorted(m.model_id for m in ranked) == sorted(ids)
    for model in ranked:
        step = int(model.params["step"])
        assert model.params["checkpoint"] == str(directories[step]) and model.source_run_id == stage.info.run_id
        assert model.tags["mlflow.model.isExternal"] == "true"  # by reference: MLflow holds no copy
        metrics = {m.key: m for m in model.metrics}
        assert set(metrics) == {"valid_bleu_src2tgt", "valid_bleu_tgt2src", "valid_bleu", "valid_length_ratio_src2tgt"}
        assert (metrics["valid_bleu_src2tgt"].value, metrics["valid_bleu_tgt2src"].value) == bleus[step]
        assert {(m.step, m.dataset_name, m.dataset_digest) for m in metrics.values()} == {(step, valid.name, valid.digest)}
    assert {(o.model_id, o.step) for o in client.get_run(stage.info.run_id).outputs.model_outputs} >= \
        {(m.model_id, int(m.params["step"])) for m in ranked}
    for key in ("valid_bleu_src2tgt", "valid_bleu"):  # the workers' points, linked, not logged twice
        assert [m.step for m in client.get_metric_history(stage.info.run_id, key)] == [10, 20, 30], key
    assert sorted(m.step for m in client.get_metric_history(stage.info.run_id, "valid_length_ratio_src2tgt")) == \
        [10, 20, 30]  # none in the run: logged there with the model
    on_valid = mlflow.search_logged_models(
        experiment_ids=[stage.info.experiment_id], datasets=[{"dataset_name": valid.name, "dataset_digest": valid.digest}],
        order_by=[{"field_name": "metrics.valid_bleu", "ascending": False, "dataset_name": valid.name}],
        output_format="list")
    assert [m.model_id for m in on_valid] == [m.model_id for m in ranked]
    # the registered version: the averaged model's own LoggedModel (the pyfunc), not a checkpoint's
    source = client.get_model_version("reder-en-de", "1").source
    assert source.startswith("models:/m-") and source.removeprefix("models:/") not in ids
    assert mlflow.get_logged_model(source.removeprefix("models:/")).source_run_id == stage.info.run_id


def test_the_alias_rule_counts_both_directions_and_compares_only_scores_on_the_same_references():
    from pipeline.tracking.registry import beats

    def tags(forward: float, backward: float, references: str = "r") -> dict[str, str]:
        return {"test_bleu_src2tgt": str(forward), "test_bleu_tgt2src": str(backward), "test_references_sha256": references}

    assert beats(tags(1, 1), None)[0]
    assert beats(tags(20, 11), tags(10, 20))[0] and not beats(tags(20, 10), tags(10, 20))[0]  # mean; a tie keeps it
    assert not beats(tags(30, 30), tags(10, 10, "other"))[0]  # other references: not comparable
    assert not beats(tags(30, 30), {"test_bleu_src2tgt": "1"})[0]  # a holder set by hand, unscored


def test_mlflow_models_serve_translates_both_ways_from_one_endpoint(tiny_model_dir, tmp_path):
    """The registered model behind `mlflow models serve` (loopback only): one POST /invocations carries rows in
    both directions; a row for a pair the model does not translate is HTTP 400 naming the row."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request
    from pathlib import Path

    import mlflow

    import reder
    from pipeline.tracking.registry import log_translator
    from tests.conftest import free_port

    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    # not the experiment id an earlier test left active in another store; its artifacts under tmp_path, not ./mlruns
    mlflow.set_experiment(experiment_id=mlflow.create_experiment("serve", (tmp_path / "mlartifacts").as_uri()))
    with mlflow.start_run():
        log_translator(tiny_model_dir, ("en", "de"), "reder-en-de")
    port = free_port()
    # the scoring server runs `uvicorn` from PATH: the venv's, as with an activated venv
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/reder-en-de/1",
                               "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                              cwd=tmp_path)  # not the repository: `reder` comes from the logged model's copy

    def post(body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "mlflow models serve did not answer /ping in 90 s"
            time.sleep(0.5)
        rows = [{"text": "the cat", "src": "en", "tgt": "de"}, {"text": "a dog ran", "src": "de", "tgt": "en"}]
        status, body = post({"dataframe_records": rows, "params": {"beam": 2}})
        local = reder.load(tiny_model_dir)
        assert status == 200 and body["predictions"] == [local.translate("the cat", "en", "de", beam=2),
                                                          local.translate("a dog ran", "de", "en", beam=2)]
        # the decoders by reder/decoding/'s names: decoder "beam" with beam 3 is reder.load's translate(..., beam=3)
        beam_rows = [*rows, {"text": "the bird", "src": "en", "tgt": "de"}]
        status, body = post({"dataframe_records": beam_rows, "params": {"beam": 3, "decoder": "beam"}})
        assert status == 200 and body["predictions"] == [local.translate(row["text"], row["src"], row["tgt"], beam=3)
                                                          for row in beam_rows]
        status, body = post({"dataframe_records": [rows[0], {"text": "the cat", "src": "en", "tgt": "fr"}]})
        assert status == 400 and "row 1: this model translates en->de and de->en, not en->fr" in body["message"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
