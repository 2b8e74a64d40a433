"""MLflow tracking: one parent run per pipeline invocation, one nested run per stage that runs.

The parent run carries the whole config flattened as params, the resolved config YAML and the headline
test results (`test_bleu_src2tgt`, `test_bleu_tgt2src`, chrF, round-trip BLEU). Each stage's nested run
carries its counts as metrics and its reports as artifacts; the train stage's run also gets the per-step
metrics (logged by rank 0 of the Ray Train worker group straight into that run; validation BLEU as
`valid_bleu_*`), the SentencePiece model, a PNG of the loss terms and validation BLEU, and the final averaged
model as a registered MLflow model that translates (`log_translator`, pipeline/mlflow_model.py); the evaluate
stage's run gets the hypotheses and results.json. Runs are named `<run_prefix>-<stage directory>` and tagged
`duplex.stage` (`run_name`, `STAGE_TAG`).

A tune sweep has its own parent run `<run_prefix>-tune-<hash>` with one nested run per trial (`SweepTracker`).

The store defaults to an embedded sqlite file in the workdir (`sqlite:///<workdir>/mlflow.db`, artifacts
in `<workdir>/mlartifacts`); `tracking.uri` or $MLFLOW_TRACKING_URI point at a server instead. Browse the
local store with `mlflow ui --backend-store-uri sqlite:///<workdir>/mlflow.db`; the experiment carries a saved
view of its runs table, "Test BLEU" (`runs_view`, opened by `runs_page`'s link, which a run's summary prints).
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from pipeline.config import TrackingConfig
from pipeline.metrics import shown, test_splits
from pipeline.stage import read_manifest

log = logging.getLogger(__name__)

HEADLINE = ("bleu_src2tgt", "bleu_tgt2src", "chrf_src2tgt", "chrf_tgt2src", "roundtrip_bleu_src", "roundtrip_bleu_tgt")
TRIAL_METRICS = ("valid_bleu", "bleu_src2tgt", "bleu_tgt2src")  # a sweep's trial runs: their best validation


def validation_metric(key: str) -> str:
    """The MLflow name of a training report's key: validation BLEU (`bleu_src2tgt`) gets the `valid_` prefix
    (`valid_bleu_src2tgt`), so that no metric name means validation in one run and test in another (the
    evaluate stage's and the parent run's are `test_...`)."""
    return f"valid_{key}" if key.startswith("bleu_") else key


def tracking_uri(cfg: TrackingConfig, workdir: Path) -> str:
    return cfg.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(workdir).resolve()}/mlflow.db"


def open_client(uri: str) -> Any:
    """An MlflowClient for `uri`. Creating the first client of a new sqlite store creates its schema (MLflow
    opens the store eagerly): under a lock beside the database, so runs starting at once on a new store do
    not race in MLflow's migrations (an alembic error was seen)."""
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines: schema migrations, example checks
    with _store_lock(uri):
        return MlflowClient(uri)


# MLflow 3's UI opens an experiment of this kind on its runs table (not on the GenAI traces view) — when its
# "GenAI / Model training" toggle is off. MLflow 3.17 shows the toggle and then ignores this tag: its experiment
# page opens on the GenAI overview unless the URL says `?workflowType=machine_learning` (seen in headless
# Chromium, bench/mlflow_ui.py). Kept for the versions that read it.
EXPERIMENT_KIND = "mlflow.experimentKind"

# The runs table's saved view "Test BLEU": MLflow 3.17's experiment page restores the view saved as the
# experiment tag `mlflow.sharedViewState.<key>` when its URL says `?viewStateShareKey=<key>` (`runs_page`), and
# lists it under "Views". Its state: the metric columns TEST_COLUMNS (the table's default columns — Source,
# Models, Dataset — left out: four metric columns fit beside the run names) and the sort, by test BLEU src2tgt,
# best first (sorted by a metric, the table lists the stage runs flat, each with its name, instead of folded
# under their pipeline run). The tag's value is the UI's envelope {name, createdAt, updatedAt, state}, `state`
# being the JSON of the view's search facets and UI state (the UI also reads it deflated: "deflate;<base64>").
RUNS_VIEW_KEY = "duplex-test-bleu"
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
TEST_COLUMNS = ("test_bleu_src2tgt", "test_bleu_tgt2src", "test_chrf_src2tgt", "test_chrf_tgt2src")


def runs_view(created_ms: int) -> dict[str, str]:
    """The experiment tag of the saved view "Test BLEU" ({tag: value}), saved at `created_ms` (Unix ms)."""
    state = {"orderByKey": f"metrics.`{TEST_COLUMNS[0]}`", "orderByAsc": False,
             "selectedColumns": [f"metrics.`{key}`" for key in TEST_COLUMNS]}
    envelope = {"name": "Test BLEU", "createdAt": created_ms, "updatedAt": created_ms, "state": json.dumps(state)}
    return {SHARED_VIEW_PREFIX + RUNS_VIEW_KEY: json.dumps(envelope)}


def runs_page(experiment_id: str) -> str:
    """The URL fragment (after `http://host:port/`) of the experiment's runs table in the saved view "Test BLEU",
    in the "Model training" pages (`workflowType`: without it 3.17 opens the GenAI overview)."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={RUNS_VIEW_KEY}&workflowType=machine_learning"


def browse_hint(uri: str, experiment: str) -> str:
    """How to see experiment `experiment` of store `uri` in the MLflow UI, for the end of a run's summary: for a
    sqlite store the `mlflow ui` command and its runs page in the saved view "Test BLEU" (`runs_page`), for a
    server its runs page; "" when the store has no such experiment or is another kind."""
    if not uri.startswith(("sqlite:///", "http://", "https://")) or (
            uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file()):  # opening it would create it
        return ""
    try:
        experiment_id = getattr(open_client(uri).get_experiment_by_name(experiment), "experiment_id", None)
    except Exception as error:  # a hint: a server gone since the run is no reason to fail a finished run
        log.warning("no MLflow link: %s", error)
        return ""
    if experiment_id is None:
        return ""
    if uri.startswith("sqlite:///"):
        return f"mlflow ui --backend-store-uri {uri}   then http://127.0.0.1:5000/{runs_page(experiment_id)}"
    return f"{uri.rstrip('/')}/{runs_page(experiment_id)}"


def ensure_experiment(client: Any, name: str, workdir: Path) -> str:
    """The id of experiment `name`, created if missing (under the store's lock: two runs starting at once
    create it once) and tagged with the saved view "Test BLEU" if it lacks it (an experiment made before it
    was; a view changed by hand is left alone). With the embedded sqlite store its artifacts go to
    <workdir>/mlartifacts; a server keeps its own artifact store (`--artifacts-destination`)."""
    local = client.tracking_uri.startswith("sqlite:///")
    view = runs_view(int(time.time() * 1000))
    with _store_lock(client.tracking_uri):
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            return client.create_experiment(name, artifact_location=(Path(workdir).resolve() / "mlartifacts").as_uri()
                                            if local else None, tags={EXPERIMENT_KIND: "custom_model_development", **view})
        for key, value in view.items():
            if key not in experiment.tags:
                client.set_experiment_tag(experiment.experiment_id, key, value)
        return experiment.experiment_id


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """An exclusive lock on `<database>.lock` for a sqlite store URI (nothing for a server)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    database = Path(uri[len("sqlite:///"):])
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def child_run(target: dict[str, str] | None, name: str, tags: dict[str, str] | None = None) -> dict[str, str] | None:
    """A run nested under `target`'s run (same store) for one part of a stage — a teacher direction, a
    sweep's trial — as a worker target ({"uri", "run_id"}); None when tracking is off."""
    if target is None:
        return None
    from mlflow.tracking import MlflowClient

    client = MlflowClient(target["uri"])
    parent = client.get_run(target["run_id"])
    run = client.create_run(parent.info.experiment_id, run_name=name,
                            tags={"mlflow.parentRunId": target["run_id"], **(tags or {})})
    return {"uri": target["uri"], "run_id": run.info.run_id}


def finish_child_run(target: dict[str, str] | None, counts: dict[str, Any]) -> None:
    """Log `counts` as metrics (their words, such as `stopped_by` and `device`, as tags) on a child run and close it."""
    if target is None:
        return
    from mlflow.tracking import MlflowClient

    client = MlflowClient(target["uri"])
    for key, value in numeric(counts).items():
        client.log_metric(target["run_id"], key, value)
    for key, value in words(counts).items():
        client.set_tag(target["run_id"], key, value)
    client.set_terminated(target["run_id"], status="FINISHED")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and scalars stay leaves."""
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in value.items():
        flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def config_params(config: dict[str, Any]) -> dict[str, str]:
    """A nested config as MLflow params: dotted keys, values as text cut to MLflow's 500 characters."""
    return {key: str(value)[:500] for key, value in flatten(config).items()}


def numeric(values: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a (flattened) dict, as floats: what MLflow can take as metrics (BLEU and chrF at two
    decimals, `pipeline.metrics.shown`)."""
    out = {}
    for key, value in flatten(values).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf"):
            out[key] = shown(key, float(value))
    return out


def words(values: dict[str, Any]) -> dict[str, str]:
    """The text values of a (flattened) dict: what a run records as tags (a training stage's `stopped_by`, its
    `device`), MLflow metrics being numbers."""
    return {key: value[:5000] for key, value in flatten(values).items() if isinstance(value, str)}


def history_panels(history: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The curves of `plot_history`, by panel: the output loss per direction (CTC, DAG or the teachers'
    NLL, with validation NLL), the auxiliary losses (FBA, CC; absent for teachers) and validation BLEU per
    direction. The weighted total is left out: it only sums the others."""
    keys = sorted({k for h in history for k in h})
    aux = [k for k in keys if k.startswith(("train_fba_", "train_cc_"))]
    output = [k for k in keys if (k.startswith("train_") and k not in aux and k != "train_total")
              or k.startswith("valid_nll_")]
    bleu = [k for k in ("bleu_src2tgt", "bleu_tgt2src") if k in keys]
    panels = {"output loss (log scale)": output, "auxiliary losses (log scale)": aux, "validation BLEU (greedy)": bleu}
    return {title: curves for title, curves in panels.items() if curves}


def plot_history(history: list[dict[str, Any]], path: Path) -> Path:
    """PNG, one panel per group of `history_panels`, side by side; legends beside the curves' ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = history_panels(history)
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False, sharex=True)
    for axis, (title, curves) in zip(axes[0], panels.items()):
        logarithmic = "log scale" in title
        for key in curves:  # on a log scale, the zeros before the auxiliary losses switch on are left out
            points = [(h["step"], h[key]) for h in history if key in h and h[key] == h[key]
                      and (h[key] > 0 or not logarithmic)]
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o" if "bleu" in key else None,
                      markersize=3, label=key.removeprefix("train_"))
        if logarithmic:
            axis.set_yscale("log")
        else:
            axis.ticklabel_format(axis="y", useOffset=False, style="plain")
        axis.set(xlabel="step", title=title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="best", framealpha=0.6)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


OWNER_HOST, OWNER_PID = "duplex.host", "duplex.pid"  # tags of the process that opened a parent run


def owner_tags() -> dict[str, str]:
    """Tags naming this process, so a later invocation can tell that a RUNNING run's process is gone."""
    return {OWNER_HOST: socket.gethostname(), OWNER_PID: str(os.getpid())}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def close_orphans(client: Any, experiment_id: str) -> list[str]:
    """Mark KILLED the parent runs left RUNNING by a process of this host that no longer exists (a SIGKILL,
    a lost machine), with every run still RUNNING under them; returns their ids. Runs of live processes
    and of other hosts are left alone."""
    host = socket.gethostname()
    closed = []
    for run in client.search_runs([experiment_id], f"attributes.status = 'RUNNING' and tags.`{OWNER_HOST}` = '{host}'"):
        pid = run.data.tags.get(OWNER_PID, "")
        if pid.isdigit() and not _alive(int(pid)):
            closed += close_tree(client, experiment_id, run.info.run_id, "KILLED",
                                 f"process {pid} on {host} ended without closing this run (killed)")
    return closed


def close_tree(client: Any, experiment_id: str, run_id: str, status: str, error: str) -> list[str]:
    """End `run_id` and every run still RUNNING under it (children, grandchildren) with `status`, each
    tagged `error`; returns their ids."""
    closed, pending = [], [run_id]
    while pending:
        current = pending.pop()
        pending += [child.info.run_id for child in client.search_runs(
            [experiment_id], f"attributes.status = 'RUNNING' and tags.mlflow.parentRunId = '{current}'")]
        client.set_tag(current, "error", error[:5000])
        client.set_terminated(current, status)
        closed.append(current)
    return closed


STAGE_TAG = "duplex.stage"  # what a run is: "pipeline" (an invocation), a stage's name, "tune", "trial"


def run_name(cfg: TrackingConfig, *parts: str) -> str:
    """`<run_prefix>-<parts...>`, e.g. `smoke-train-6e5c497f3bce`, `smoke-pipeline-1a2b3c4d5e6f`."""
    return "-".join(part for part in (cfg.run_prefix, *parts) if part)


class Tracker:
    """Opens the parent run at the first stage that actually runs (a run that skips everything opens
    nothing); a stage that fails leaves both runs FAILED with the error. The parent run is tagged with this
    process's host and pid: the next invocation closes KILLED what a killed process left RUNNING
    (`close_orphans`). Disabled: every method does nothing."""

    def __init__(self, cfg: TrackingConfig, workdir: Path, config: dict[str, Any], config_yaml: str = "",
                 target: str = "") -> None:
        """`target`: the directory name of the invocation's last stage (`evaluate-<hash>`), whose hash names
        the parent run."""
        self.cfg = cfg
        self.workdir = Path(workdir).resolve()
        self.uri = tracking_uri(cfg, workdir)
        self.config = config
        self.config_yaml = config_yaml
        self.target = target
        self.run_id: str | None = None
        self.stage_run_id: str | None = None
        self.stage: str = ""

    def begin_stage(self, stage: str, directory: str = "") -> None:
        """Start the nested run of `stage`, named by its output `directory` (and the parent run, the first time)."""
        if not self.cfg.enabled:
            return
        import mlflow

        if self.run_id is None:
            mlflow.set_tracking_uri(self.uri)
            client = open_client(self.uri)
            close_orphans(client, ensure_experiment(client, self.cfg.experiment, self.workdir))
            mlflow.set_experiment(self.cfg.experiment)
            digest = self.target.rsplit("-", 1)[-1] if "-" in self.target else ""
            self.run_id = mlflow.start_run(run_name=run_name(self.cfg, "pipeline", digest),
                                           tags={STAGE_TAG: "pipeline", **owner_tags()}).info.run_id
            mlflow.log_params(config_params(self.config))
            if self.config_yaml:
                mlflow.log_text(self.config_yaml, "config.yaml")
        self.stage = stage
        self.stage_run_id = mlflow.start_run(run_name=run_name(self.cfg, directory or stage), nested=True,
                                             tags={STAGE_TAG: stage}).info.run_id

    def worker_target(self) -> dict[str, Any] | None:
        """Where Ray workers log their per-step metrics (absolute URI, the current stage's run), and how often the
        first worker of each node samples the system metrics into it (`system_metrics_s`, 0: never)."""
        if not self.cfg.enabled or self.stage_run_id is None:
            return None
        interval = self.cfg.system_metrics_interval_s if self.cfg.system_metrics else 0
        return {"uri": self.uri, "run_id": self.stage_run_id, "system_metrics_s": interval}

    def end_stage(self, output: Path, counts: dict[str, Any], artifacts: list[Path], model: Path | None = None) -> None:
        """Close the stage's nested run with its config (the manifest's: what its hash covers) as params, its
        counts as metrics and files/directories as artifacts; `model`, a model directory, is logged as the
        pyfunc that translates (`log_translator`) and registered as `tracking.registered_model`."""
        if self.stage_run_id is None:
            return
        import mlflow

        mlflow.set_tag("output", str(output))
        mlflow.log_params(config_params(read_manifest(output)["config"]))  # what this stage's hash covers
        mlflow.log_metrics(numeric(counts))
        mlflow.set_tags(words(counts))
        for path in artifacts:
            if path.is_file():
                mlflow.log_artifact(str(path))
            elif path.is_dir():
                mlflow.log_artifacts(str(path), artifact_path=path.name)
        if model is not None:
            languages = (self.config["data"]["src_lang"], self.config["data"]["tgt_lang"])
            registered = self.cfg.registered_model.format(src=languages[0], tgt=languages[1])
            with contextlib.redirect_stderr(io.StringIO()):  # MLflow prints "Successfully registered model ..."
                info = log_translator(model, languages, registered)
            uri = f"models:/{registered}/{info.registered_model_version}" if registered else info.model_uri
            if registered:  # which version this train stage's model is, for the alias after its evaluation
                mlflow.MlflowClient(self.uri).set_model_version_tag(registered, str(info.registered_model_version),
                                                                    TRAIN_DIR_TAG, str(output))
            mlflow.set_tag("model_uri", uri)
            log.info("%s: model logged to MLflow as %s (a pyfunc that translates both ways)", self.stage, uri)
        mlflow.end_run(status="FINISHED")
        self.stage_run_id = None

    def log_datasets(self, datasets: list[Dataset]) -> None:
        """Log `datasets` as the current stage run's inputs (mlflow.log_input of a metadata-only dataset: its name,
        digest and source, the runs table's Dataset column; the data stays in the workdir)."""
        if self.stage_run_id is None:
            return
        import warnings

        import mlflow
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        for dataset in datasets:
            with warnings.catch_warnings():  # "can be interpreted in multiple ways": both are the local source
                warnings.simplefilter("ignore", UserWarning)
                source = resolve_dataset_source(str(dataset.source))
            mlflow.log_input(MetaDataset(source, name=dataset.name, digest=dataset.digest), context=dataset.context)

    def log_tables(self, directory: Path) -> None:
        """Log every `<name>.json` of `directory` (a dict of columns) into the current stage's run as an MLflow table
        `<directory name>/<name>.json` (the evaluate stage's translations: the UI shows them sortable)."""
        if self.stage_run_id is None or not directory.is_dir():
            return
        import mlflow

        for path in sorted(directory.glob("*.json")):
            mlflow.log_table(json.loads(path.read_text(encoding="utf-8")), f"{directory.name}/{path.name}",
                             run_id=self.stage_run_id)

    def log_results(self, results: dict[str, Any]) -> None:
        """Headline metrics on the parent run (the current stage run gets them from its counts)."""
        if self.run_id is None:
            return
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.uri)
        sets = results.get("sets", {results["split"]: results})  # a results.json from before the named test sets: one split
        for split in test_splits(results):
            for key in HEADLINE:
                if key in sets[split]:
                    client.log_metric(self.run_id, f"{split}_{key}", shown(key, float(sets[split][key])))
        for key in ("bleu_signature", "chrf_signature"):
            if key in results:
                client.set_tag(self.run_id, key, results[key])

    def promote(self, results: dict[str, Any], train_dir: Path) -> str:
        """Record an evaluation's test scores on the registered version of `train_dir`'s model and move
        `tracking.alias` to it when it beats the holder (`beats`); returns what was done, "" when there is no
        registered version or no alias."""
        if self.run_id is None or not self.cfg.alias or not self.cfg.registered_model:
            return ""
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        name = self.cfg.registered_model.format(src=results["src_lang"], tgt=results["tgt_lang"])
        client = MlflowClient(self.uri)
        try:
            versions = [v for v in client.search_model_versions(f"name = '{name}'")
                        if v.tags.get(TRAIN_DIR_TAG) == str(train_dir)]
        except MlflowException:  # no such registered model
            return ""
        if not versions:
            return ""
        version = max(versions, key=lambda v: int(v.version))
        split = results["split"]
        row = results.get("sets", {}).get(split, results)
        scores = {ALIAS_TAGS[0]: row["bleu_src2tgt"], ALIAS_TAGS[1]: row["bleu_tgt2src"],
                  ALIAS_TAGS[2]: row.get("references_sha256", ""), "test_split": split}
        for key, value in scores.items():
            client.set_model_version_tag(name, version.version, key, str(value))
        try:
            holder = client.get_model_version_by_alias(name, self.cfg.alias)
        except MlflowException:
            holder = None
        if holder is not None and holder.version == version.version:
            return f"models:/{name}@{self.cfg.alias} is version {version.version} already"
        better, why = beats({k: str(v) for k, v in scores.items()}, holder.tags if holder is not None else None)
        where = f"models:/{name}@{self.cfg.alias}"
        if not better:
            message = f"{where} stays version {holder.version}: version {version.version} {why}"
        else:
            client.set_registered_model_alias(name, self.cfg.alias, version.version)
            message = f"{where} moved to version {version.version}: {why}"
        client.set_tag(self.run_id, "alias", message)
        log.info("%s", message)
        return message

    def close(self, failed: bool = False, error: str = "", killed: bool = False) -> None:
        """End the open runs; a failure marks them FAILED (`killed`, an interruption: KILLED) with the error
        text as the `error` tag."""
        if self.run_id is None:
            return
        import mlflow

        status = "KILLED" if killed else "FAILED" if failed else "FINISHED"
        if error:
            mlflow.set_tag("error", error[:5000])  # the innermost open run: the failing stage's
            if self.stage_run_id is not None:
                mlflow.MlflowClient(self.uri).set_tag(self.run_id, "error", error[:5000])
        if self.stage_run_id is not None:
            if failed or killed:  # with the runs the stage opened under its own (a teacher direction's)
                close_tree(mlflow.MlflowClient(self.uri), mlflow.active_run().info.experiment_id,
                           self.stage_run_id, status, error or status)
            mlflow.end_run(status=status)
            self.stage_run_id = None
        mlflow.end_run(status=status)


@dataclass(frozen=True)
class Dataset:
    """A corpus a run read, as MLflow records it (`Tracker.log_datasets`): `name` (`multi30k-en-de-train-distilled`),
    `digest` (of its files), `source` (its directory or file) and `context` (training, validation, evaluation)."""

    name: str
    digest: str
    source: Path
    context: str


def stage_datasets(cfg: Any, stage: str, inputs: dict[str, Path]) -> list[Dataset]:
    """What a training stage's run read (`inputs`: its input directories by label): the train split, `raw` (the
    tokenized corpus) or `distilled` (the teachers' KD pairs), and the validation split; none for other stages."""
    from pipeline.stage import split_digest

    if stage not in ("teacher", "train", "cmlm") or stage == "teacher" and cfg.teacher.src2tgt_checkpoint:
        return []  # not a training stage, or teachers given, not trained
    corpus = f"{cfg.data.source}-{cfg.data.src_lang}-{cfg.data.tgt_lang}"
    data = inputs["data"]
    kind = "distilled" if data.name.startswith("distill-") else "raw"
    valid = inputs.get("tokenize", data)  # teacher: its data is tokenize's
    return [Dataset(f"{corpus}-train-{kind}", split_digest(data, "train"), data / "train", "training"),
            Dataset(f"{corpus}-valid", split_digest(valid, "valid"), valid / "valid", "validation")]


TRAIN_DIR_TAG = "duplex.train_dir"  # a registered version's tag: the train stage output its model came from
# A registered version's tags after its evaluation: its test BLEU both ways and the SHA-256 of the test references
ALIAS_TAGS = ("test_bleu_src2tgt", "test_bleu_tgt2src", "test_references_sha256")


def beats(new: dict[str, str], holder: dict[str, str] | None) -> tuple[bool, str]:
    """Whether a version with test scores `new` (ALIAS_TAGS) takes the alias from `holder` (its version tags; None:
    no version holds the alias), and why. The rule (docs/USAGE.md): both directions count, as their mean (the
    sweep's valid_bleu is the same mean); the new version must be strictly better on the same references (a tie
    keeps the holder); a holder without test scores (set by hand) or scored on other references is not beaten:
    it keeps the alias, a person moves it (`mlflow.MlflowClient().set_registered_model_alias`)."""
    def mean(tags: dict[str, str]) -> float:
        return (float(tags[ALIAS_TAGS[0]]) + float(tags[ALIAS_TAGS[1]])) / 2

    ours = f"mean test BLEU {mean(new):.2f} (src2tgt {float(new[ALIAS_TAGS[0]]):.2f}, tgt2src {float(new[ALIAS_TAGS[1]]):.2f})"
    if holder is None:
        return True, f"{ours}; no version held the alias"
    if not all(key in holder for key in ALIAS_TAGS):
        return False, f"has {ours}; the holder has no test scores to compare with"
    if holder[ALIAS_TAGS[2]] != new[ALIAS_TAGS[2]]:
        return False, f"has {ours}, scored on other test references than the holder"
    if mean(new) > mean(holder):
        return True, f"{ours} beats the holder's {mean(holder):.2f}"
    return False, f"has {ours}, not above the holder's {mean(holder):.2f}"


def log_translator(model_dir: Path, languages: tuple[str, str], registered_name: str = "") -> Any:
    """Log a model directory into the active run as an MLflow pyfunc that translates (pipeline/mlflow_model.py,
    the `reder` package beside it), registered as `registered_name` when given; returns MLflow's ModelInfo.
    The input example (a sentence each way) is translated by the logged model as MLflow saves it."""
    import importlib.metadata

    import mlflow
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    import reder

    signature = ModelSignature(inputs=Schema([ColSpec("string", name) for name in ("text", "src", "tgt")]),
                               outputs=Schema([ColSpec("string")]),
                               params=ParamSchema([ParamSpec("beam", "long", 1), ParamSpec("decoder", "string", "greedy"),
                                                   ParamSpec("strict", "boolean", False)]))
    example = [{"text": "Hello.", "src": src, "tgt": tgt} for src, tgt in (languages, languages[::-1])]
    requirements = [f"{name}=={importlib.metadata.version(name)}" for name in ("torch", "sentencepiece", "mlflow")]
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per file of a tiny copy
    return mlflow.pyfunc.log_model(name="translator", python_model=str(Path(__file__).with_name("mlflow_model.py")),
                                   artifacts={"model": str(model_dir)}, code_paths=[str(Path(reder.__file__).parent)],
                                   signature=signature, input_example=example, pip_requirements=requirements,
                                   registered_model_name=registered_name or None)


# Short names of common searched keys in trial run names; any other key goes by its last part.
SHORT_KEYS = {"loss.lambda_fba": "λfba", "loss.lambda_cc": "λcc", "model.upsample_ratio": "upsample",
              "loss.aux_start_step": "aux_start", "train.seed": "seed"}


def trial_name(params: dict[str, Any]) -> str:
    """A trial's run name from its sampled values, e.g. `lr=0.002 λfba=0.1` (4 significant digits)."""
    def value(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return " ".join(f"{SHORT_KEYS.get(k, k.rsplit('.', 1)[-1])}={value(v)}" for k, v in sorted(params.items())) or "trial"


@dataclass(frozen=True)
class SweepTracker:
    """The MLflow runs of a tune sweep: a parent run "tune" (the base config as params) and one nested run
    per trial, named by its values (`lr=0.002 λfba=0.1`; tag `trial_id`, its sampled values as params, its per-step training metrics and
    best validation). Trials stopped early are closed FINISHED with the tag `stopped_early`, failed ones
    FAILED with the tag `error`. Only strings inside: Ray ships it to the trials."""

    uri: str
    experiment_id: str
    parent_run_id: str

    @classmethod
    def open(cls, cfg: TrackingConfig, workdir: Path, name: str, config: dict[str, Any],
             config_yaml: str, resume: bool = False) -> SweepTracker | None:
        """Start the sweep's parent run (tag `tune_dir` = `name`); with `resume`, reopen the latest such run
        (an interrupted sweep's) instead. None when tracking is off."""
        if not cfg.enabled:
            return None
        uri = tracking_uri(cfg, workdir)
        client = open_client(uri)
        experiment_id = ensure_experiment(client, cfg.experiment, workdir)
        close_orphans(client, experiment_id)
        earlier = client.search_runs([experiment_id], f"tags.tune_dir = '{name}' and tags.`{STAGE_TAG}` = 'tune'",
                                     order_by=["attributes.start_time DESC"], max_results=1) if resume else []
        if earlier:
            parent = earlier[0].info.run_id
            client.update_run(parent, "RUNNING")
            for key, value in owner_tags().items():
                client.set_tag(parent, key, value)
            return cls(uri, experiment_id, parent)
        parent = client.create_run(experiment_id, run_name=run_name(cfg, name),
                                   tags={"tune_dir": name, STAGE_TAG: "tune", **owner_tags()}).info.run_id
        for key, value in config_params(config).items():
            client.log_param(parent, key, value)
        client.log_text(parent, config_yaml, "config.yaml")
        return cls(uri, experiment_id, parent)

    def trial_run(self, trial_id: str, params: dict[str, Any]) -> dict[str, str]:
        """The worker target ({"uri", "run_id"}) of trial `trial_id`'s run: created with `params` the first
        time, the same run again (RUNNING again) when Tune retries or a --resume continues the trial."""
        client = self._client()
        found = client.search_runs([self.experiment_id],
                                   f"tags.trial_id = '{trial_id}' and tags.mlflow.parentRunId = '{self.parent_run_id}'")
        if found:
            if found[0].info.status != "RUNNING":
                client.update_run(found[0].info.run_id, "RUNNING")
            return {"uri": self.uri, "run_id": found[0].info.run_id}
        target = child_run({"uri": self.uri, "run_id": self.parent_run_id}, trial_name(params),
                           {"trial_id": trial_id, STAGE_TAG: "trial"})
        for key, value in params.items():
            client.log_param(target["run_id"], key, value)
        return target

    def tag_error(self, target: dict[str, str], error: BaseException) -> None:
        """Tag a trial's run with the error that interrupted it; the run stays open (see `close_trials`)."""
        self._client().set_tag(target["run_id"], "error", f"{type(error).__name__}: {error}"[:5000])

    def finish_trial(self, target: dict[str, str], best: dict[str, Any] | None) -> None:
        """Close a trial's run FINISHED with the BLEU of its best validation report (if any)."""
        finish_child_run(target, {validation_metric(key): float(best[key]) for key in TRIAL_METRICS if best and key in best})

    def close_trials(self, rows: list[dict[str, Any]], failed: bool = False, killed: bool = False) -> None:
        """Close the trial runs still open by Tune's verdict, `rows` being the sweep's trials (trial_id, status
        "finished", "stopped early", "error", "unfinished" or "not run", TRIAL_METRICS): trials that Tune
        stopped never reach `finish_trial` (ASHA also stops the trials that reach max_t, on their last
        report). `failed` (the sweep itself failed): every open run and the parent are closed FAILED;
        `killed` (interrupted): the trials Tune did not end, and the parent, KILLED (a --resume reopens them)."""
        client = self._client()
        by_trial = {row["trial_id"]: row for row in rows}
        for run in client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{self.parent_run_id}'"):
            if run.info.status != "RUNNING":
                continue
            run_id = run.info.run_id
            row = by_trial.get(run.data.tags.get("trial_id", ""))
            if killed and (row is None or row["status"] in ("unfinished", "not run")):
                client.set_terminated(run_id, "KILLED")
                continue
            if row is not None:
                if row["status"] != "error" and "error" in run.data.tags:
                    client.delete_tag(run_id, "error")  # the interruption of a stopped trial
                if row["status"] == "stopped early":
                    client.set_tag(run_id, "stopped_early", "true")
                for key, value in numeric({validation_metric(key): row.get(key) for key in TRIAL_METRICS}).items():
                    client.log_metric(run_id, key, value)
            errored = failed or (row is not None and row["status"] == "error")
            client.set_terminated(run_id, "FAILED" if errored else "FINISHED")
        if failed or killed:
            client.set_terminated(self.parent_run_id, "KILLED" if killed else "FAILED")

    def publish(self, artifacts: list[Path], metrics: dict[str, Any]) -> None:
        """Log the sweep's files and numbers (best metric, trial counts) on the parent run and close it."""
        client = self._client()
        for path in artifacts:
            client.log_artifact(self.parent_run_id, str(path))
        for key, value in numeric(metrics).items():
            client.log_metric(self.parent_run_id, key, value)
        client.set_terminated(self.parent_run_id, "FINISHED")

    def _client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.uri)
