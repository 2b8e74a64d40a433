"""The MLflow store and its runs: where it is, the experiment, runs opened and closed (orphans of a killed process
included), their names, tags and params."""
from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import re
import shutil
import socket
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

from cluster import probe
from pipeline.config import TrackingConfig
from pipeline.metrics import shown
from pipeline.stage import StageError
from pipeline.tracking.views import runs_page, runs_view

log = logging.getLogger(__name__)

TRIAL_METRICS = ("valid_bleu", "bleu_src2tgt", "bleu_tgt2src")  # a sweep's trial runs: their best validation


def validation_metric(key: str) -> str:
    """The MLflow name of a training report's key: validation BLEU (`bleu_src2tgt`) gets the `valid_` prefix
    (`valid_bleu_src2tgt`), so that no metric name means validation in one run and test in another (the
    evaluate stage's and the parent run's are `test_...`)."""
    return f"valid_{key}" if key.startswith("bleu_") else key


def validation_scores(report: dict[str, Any]) -> dict[str, float]:
    """The validation scores among a training report's keys (a Validator's: `valid_bleu`, `bleu_<direction>`,
    `bleu_<direction>_unpenalised`, `valid_length_ratio_<direction>`, a teacher's `valid_nll_<direction>`), finite,
    under their MLflow names (`validation_metric`) and as MLflow records them (`shown`: BLEU to two decimals, as the
    workers log them); not the training metrics, nor a tuned blank penalty."""
    return {validation_metric(key): shown(key, float(value)) for key, value in report.items()
            if key.startswith(("bleu_", "valid_")) and isinstance(value, (int, float)) and math.isfinite(value)}


def tracking_uri(cfg: TrackingConfig, workdir: Path) -> str:
    return cfg.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(workdir).resolve()}/mlflow.db"


# MLflow's client gives up on a server that stopped answering with "API request to <url> failed with exception
# ... Max retries exceeded ... (Caused by NewConnectionError(... Connection refused))" (or a read timeout): after
# MLFLOW_HTTP_REQUEST_MAX_RETRIES tries (cluster.connect.TRACKING_ENV bounds them: seconds, not minutes).
_LOST = re.compile(r"API request to (https?://[^/\s]+)\S* failed with exception .*?Max retries exceeded", re.S)


class TrackingLost(StageError):
    """The MLflow tracking server stopped answering during the run: nothing more is asked of it (its open runs are
    closed by the next run, `close_orphans`)."""


def server_lost(error: BaseException | str, where: str) -> TrackingLost | None:
    """A TrackingLost naming the server, why and what to do, when `error` (or its text: a worker's, forwarded by Ray
    Train) says MLflow's client gave up on its server; None for any other error."""
    texts, seen = [], error
    while isinstance(seen, BaseException):
        texts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    text = "\n".join(texts) if texts else str(error)
    found = _LOST.search(text)
    if found is None:
        return None
    why = ("refused the connection" if "Connection refused" in text else
           f"did not answer within MLFLOW_HTTP_REQUEST_TIMEOUT={os.environ.get('MLFLOW_HTTP_REQUEST_TIMEOUT', '?')} s"
           if "timed out" in text.lower() else "cut the connection")
    return TrackingLost(f"{where}: the MLflow tracking server at {found.group(1)} stopped answering (it {why}); finished "
                        f"stages are kept and a training stage goes on from its last checkpoint: start the server again "
                        f"and run the same command (the runs left open are closed then), or add tracking.enabled=false")


def open_client(uri: str) -> Any:
    """An MlflowClient for `uri`. A new sqlite store is made under a lock beside the database, so runs starting at
    once on a new store do not race in MLflow's migrations (an alembic error was seen): a copy of this host's empty
    store of the installed MLflow version (`store_template`), else by MLflow itself (the first client of a new store
    creates its schema: MLflow opens the store eagerly)."""
    from mlflow.tracking import MlflowClient

    problem = probe.mlflow_server(uri)  # MLflow's client retries a server that refuses for ~4 minutes
    if problem is not None:
        raise StageError(f"tracking: the MLflow tracking server at {uri} {problem}; start it (`mlflow server "
                         f"--host <host> --port <port>`, or `python -m cluster.head start` on a cluster's head) or "
                         f"point tracking.uri (else $MLFLOW_TRACKING_URI) at one that answers: empty is a sqlite store "
                         f"in the workdir; tracking.enabled=false runs without MLflow")
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines: schema migrations, example checks
    with _store_lock(uri):
        copied = uri.startswith("sqlite:///") and _copy_template(Path(uri[len("sqlite:///"):]))
        try:
            return MlflowClient(uri)
        except Exception as error:
            if not copied:
                raise
            # a template MLflow refuses (a damaged file): this store made by MLflow, the template again next time.
            # Emptied in place, not removed: MLflow keeps its engine (and a connection to the file) per URI.
            log.warning("the MLflow store template %s was refused (%s); making the store without it",
                        store_template(), error)
            Path(uri[len("sqlite:///"):]).write_bytes(b"")
            store_template().unlink(missing_ok=True)
            return MlflowClient(uri)


CACHE_ENV = "DUPLEX_CACHE"  # where this host keeps what a run makes once and reuses (default ~/.cache/duplex)


def store_template() -> Path:
    """This host's empty sqlite MLflow store of the installed MLflow version: `$DUPLEX_CACHE`, else
    `$XDG_CACHE_HOME/duplex`, else `~/.cache/duplex`, as `mlflow-<version>.db`."""
    import mlflow

    cache = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "duplex"
    return Path(cache) / f"mlflow-{mlflow.__version__}.db"


def _copy_template(database: Path) -> bool:
    """Put a copy of `store_template()` (made first if missing) at `database` when no file is there; whether it
    did. MLflow's migrations of a new store take 1.5-5 s of a 2-core machine's CPU, the copy 0.1 s. Where the
    template cannot be made or copied (a cache that cannot be written, a full disk) nothing is left behind and
    MLflow makes the store as it would have."""
    if database.exists():
        return False
    partial = None
    try:
        template = store_template()
        if not template.is_file():
            _make_template(template)
        partial = _new_file(database)
        shutil.copyfile(template, partial)
        os.replace(partial, database)
        return True
    except (OSError, sqlite3.Error) as error:
        log.debug("no MLflow store template for %s: %s", database, error)
        if partial is not None:
            partial.unlink(missing_ok=True)
        return False


def _new_file(beside: Path) -> Path:
    """A new empty file of a name of its own beside `beside`, with the permissions sqlite gives a database it
    creates (0644 less the umask; a temporary file's 0600 would keep a shared store from its group)."""
    path = beside.with_name(f".{beside.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    return path


def _make_template(template: Path) -> None:
    """An empty store made and migrated by MLflow, without its Default experiment (id 0): MLflow makes that again
    when it opens a copy, with the artifact location of that process's working directory, as in a store of its
    own making. Written beside `template` and renamed into place: processes making it at once each write theirs."""
    from mlflow.tracking import MlflowClient

    template.parent.mkdir(parents=True, exist_ok=True)
    partial = _new_file(template)
    try:
        MlflowClient(f"sqlite:///{partial}")  # creates and migrates the store
        with contextlib.closing(sqlite3.connect(partial)) as database, database:
            database.execute("DELETE FROM experiments WHERE experiment_id = 0")
        os.replace(partial, template)
    finally:
        partial.unlink(missing_ok=True)


# MLflow 3's UI opens an experiment of this kind on its runs table (not on the GenAI traces view) — when its
# "GenAI / Model training" toggle is off. MLflow 3.17 shows the toggle and then ignores this tag: its experiment
# page opens on the GenAI overview unless the URL says `?workflowType=machine_learning` (seen in headless
# Chromium, bench/mlflow_ui.py). Kept for the versions that read it.
EXPERIMENT_KIND = "mlflow.experimentKind"
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
