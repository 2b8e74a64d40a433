"""Ray Train runs of the training core (pipeline/training/harness.py), the driver side: REDER for the train stage
(pipeline/stages/train.py), both directions' autoregressive teachers in one run for the teacher stage
(pipeline/stages/teacher.py), both CMLMs in one run for the cmlm stage (pipeline/stages/cmlm.py), the trials of the tune stage
(pipeline/stages/tune.py). What every worker of the group runs is pipeline/training/trainloop.py; the files the two hand each
other are named in pipeline/training/runfiles.py. Ray, torch and the training core are imported inside the functions
that use them: a driver that runs no training stage loads none of them.

In the order a stage calls them: `check_resources` fails fast, with the numbers, when the cluster cannot hold the
worker group (instead of letting Ray Train wait forever); `storage_path` and `run_storage` place the run's
checkpoints (where a run started again resumes; --force removes them first); `make_trainer` builds the
Ray Train trainer (`trainer_class`: DDP for a group, no process group for one worker) of `trainloop.train_loop`
that trains on the tokenized training split (its path: each worker reads its own shard); `fit_and_average` fits
it (off the main thread, under a progress bar fed by rank 0's progress file; a failed fit is one line, a group
that cannot be placed again says what to run) and averages the best `average_best` checkpoints by validation BLEU
(the mean of both directions) into a model; `run_report` and `budget_record` say how the run ended.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import shutil
import threading
import time
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from pipeline.config import NO_BLANK_PENALTY, PipelineConfig, TrainConfig
from pipeline.progress import Progress
from pipeline.stage import StageError
from pipeline.tracking.store import server_lost, validation_scores
from pipeline.training.runfiles import HISTORY_FILE, PROGRESS_FILE, TRAIN_STATE_FILE, WORKERS_FILE

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"  # Ray Train's wait for a group's placement (default 60 s)
# Ray Train's record of a run's registered checkpoints, which a resumed run reads; Ray rewrites it in place (truncate,
# then write), so a process killed in between (the OOM killer, SIGKILL) leaves it empty and the run can never resume.
SNAPSHOT = "checkpoint_manager_snapshot.json"
KEPT_SNAPSHOT = ".checkpoint_manager_snapshot.kept.json"  # the last whole one, copied aside while the fit runs


def check_resources(train: TrainConfig, timeout_s: float, keys: str = "train") -> None:
    """Fail fast, with the numbers, when the cluster cannot hold the worker group (its smallest, with
    train.min_workers). Waits up to `timeout_s` for an autoscaling cluster to add the nodes. `keys`: where `train` sits
    in the config (train, teacher.train, cmlm.train), so that the error names the keys that change it."""
    import ray

    per_worker = worker_resources(train)
    least = train.min_workers or train.num_workers  # an elastic group starts with as few as min_workers
    need = {k: least * v for k, v in per_worker.items()}
    deadline = time.monotonic() + timeout_s
    while True:
        have = ray.cluster_resources()
        short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if have.get(k, 0.0) < v}
        if train.placement_strategy == "STRICT_SPREAD":  # one worker per node: enough nodes that fit one
            fit = sum(1 for node in ray.nodes() if node["Alive"] and
                      all(node["Resources"].get(k, 0.0) >= v for k, v in per_worker.items()))
            if fit < least:
                short["nodes (STRICT_SPREAD)"] = (least, fit)
        if not short:
            return
        if time.monotonic() >= deadline:
            what = ", ".join(f"{k}: need {n:g}, cluster has {h:g}" for k, (n, h) in short.items())
            gpu = f", or set {keys}.use_gpu=false" if train.use_gpu else ""
            raise StageError(f"{keys}: the cluster cannot hold {least} worker(s) ({what}); lower "
                             f"{keys}.num_workers / {keys}.cpus_per_worker{gpu}, or add nodes")
        time.sleep(1.0)


def worker_resources(train: TrainConfig) -> dict[str, float]:
    """What one training worker asks Ray for."""
    return {"CPU": train.cpus_per_worker, **({"GPU": train.gpus_per_worker} if train.use_gpu else {})}


def storage_path(train: TrainConfig, workdir: Path) -> Path:
    """Ray Train's storage: train.storage_path (shared storage on a cluster), else <workdir>/ray_results."""
    return Path(train.storage_path).expanduser().resolve() if train.storage_path else Path(workdir) / "ray_results"


def run_storage(storage: Path, name: str, force: bool) -> Path:
    """The directory of Ray Train run `name` under `storage`. A run fitted under a name whose directory
    holds checkpoints resumes from the latest; with `force` (--force: train from scratch) that directory
    is removed first. Without it, it is kept: an interrupted stage resumes."""
    path = Path(storage) / name
    if force and path.exists():
        log.info("--force: removing the previous Ray Train run %s (it would be resumed)", path)
        shutil.rmtree(path)
    return path


def stage_of(task: dict[str, str]) -> str:
    """The stage a run's `task` trains for, as its messages name it: train (REDER), teacher or cmlm."""
    return task["kind"] if task["kind"] != "reder" else "train"


def make_trainer(cfg: PipelineConfig, name: str, storage: Path, train_data: Path, data: Path, corpus: Path,
                 spm_model: Path, mlflow_target: dict[str, str] | None, callbacks: tuple = (),
                 task: dict[str, str] | None = None, time_cap_s: float = math.inf) -> Any:
    """The Ray Train trainer of one training run (run `name` under `storage`; a run with the same pair
    resumes from its latest checkpoint, `resume_point`) on the `train_data` split, validated on `data`/valid, its
    text read with the SentencePiece model `spm_model` (the spm stage's file).
    `mlflow_target` receives rank 0's per-step metrics (with "runs", direction → run id, a pair's metrics
    named for a direction go to that direction's run). `task` is REDER's (default) or {"kind": "teacher" |
    "cmlm"}: both directions' teachers or CMLMs in one run (`build_task`), with the config section of that
    name. `time_cap_s`: the stage's share of the run's budget, counted from now (the worker group's start and
    every restart of it spend it too; the loop stops there, at the latest, and the section's own `max_time`,
    which counts training alone, may stop it earlier)."""
    import ray.train

    from pipeline.training.harness import SCORE
    from pipeline.training.trainloop import train_loop

    task = task or {"kind": "reder"}
    section = getattr(cfg, task["kind"]) if task["kind"] in ("teacher", "cmlm") else cfg
    train = section.train
    loop_config = {
        "task": task, "model": asdict(section.model), "loss": asdict(cfg.loss),
        "train": asdict(train), "spm_proto": Path(spm_model).read_bytes(),
        "train_data": str(Path(train_data).resolve()),  # workers chdir: an absolute path
        "references": task["kind"] == "reder" and cfg.distill.enabled and cfg.distill.references,
        "valid": {"ids": str(data / "valid"), "text": str(corpus / "valid")},
        # REDER's validations tune the CTC blank penalty (evaluate.blank_penalties); the teachers' and CMLMs' have none
        "blank_penalties": list(cfg.evaluate.blank_penalties if task["kind"] == "reder" else NO_BLANK_PENALTY),
        "mlflow": mlflow_target,
        "progress": str(Path(storage) / name / PROGRESS_FILE),
        "time_cap_at": time.time() + time_cap_s,  # wall clock (inf: none): the workers' clocks read it
    }
    # A run without a usable record of its checkpoints resumes from the newest whole one on disk (Ray Train's
    # resume_from_checkpoint is deprecated in favour of the loop loading one itself)
    resume = resume_point(Path(storage) / name, stage_of(task))
    loop_config["resume_dir"] = str(resume) if resume is not None else None
    resources = worker_resources(train)
    return trainer_class(worker_count(train) == 1)(
        train_loop, train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(num_workers=worker_count(train), use_gpu=train.use_gpu,
                                               resources_per_worker=resources,
                                               placement_strategy=train.placement_strategy),
        run_config=ray.train.RunConfig(
            name=name, storage_path=str(storage), callbacks=list(callbacks),
            # The controller's and workers' INFO lines (every report's TrainingReport(...)) stay in Ray's
            # log files; the driver shows a progress bar instead (`fit_and_average`).
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),
            # A group that cannot be placed again (a host lost for good) is a controller failure, which Ray
            # retries without end by default: bounded by the same max_failures, each try start_timeout_s long.
            failure_config=ray.train.FailureConfig(max_failures=train.max_failures,
                                                   controller_failure_limit=train.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=train.keep_checkpoints,
                                                         checkpoint_score_attribute=SCORE,
                                                         checkpoint_score_order="max")))


@functools.cache
def trainer_class(one_worker: bool) -> type:
    """Ray Train's trainer of a run: its `DataParallelTrainer`, for a group of workers with a torch process group
    (gloo, or NCCL on GPUs) set up by `process_group.ProcessGroupConfig`, for one worker with no backend: one
    rank has nothing to synchronise (`prepare_model` leaves the model unwrapped, harness.all_reduce and the
    placement gather see no process group). Neither is Ray's `TorchConfig`, whose module imports torch in the
    run's controller (a process of its own, on the driver's node) before it places the workers (~1.2 s of a
    2-core box's 7.5 s to a two-worker stage's first update; bench/train_start.py --timeline). Both without
    two of Ray Train's default callbacks, each a Python process of its own started beside the workers on every
    run (on 2 cores the raylet starts two processes at a time, so a third waits):
    - `DatasetsCallback`: each worker reads its own Parquet shard and no trainer here takes `datasets`, yet the
      callback starts a DatasetManager actor for every worker group (a process importing Ray Data) and the
      workers' train context waits for it (~1 s);
    - `PlacementGroupCleanerCallback`: a detached actor per run that polls the State API for the controller's
      death, to remove the worker group's placement group a killed controller leaves (~1 s of the start).
      `release_orphaned_groups` does that from the GCS table where it happens: a failed fit (`fit_and_average`)
      and a Tune trial stopped by its scheduler (pipeline/stages/tune.py); a driver that ends takes its job's groups
      with it."""
    from ray.train.v2._internal.callbacks import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from pipeline.training.process_group import ProcessGroupConfig

    class Trainer(DataParallelTrainer):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if not one_worker:
                kwargs.setdefault("backend_config", ProcessGroupConfig())
            super().__init__(*args, **kwargs)

        def _create_default_callbacks(self) -> list:
            if self.datasets:
                raise ValueError("these runs read their own shards: no Ray Datasets")
            return [c for c in super()._create_default_callbacks()
                    if not isinstance(c, (DatasetsCallback, PlacementGroupCleanerCallback))]

    Trainer.__name__ = Trainer.__qualname__ = "OneWorkerTrainer" if one_worker else "GroupTrainer"
    return Trainer


def release_orphaned_groups(job_id: str) -> int:
    """Remove the placement groups of job `job_id` whose creator actor is dead; returns how many.

    A Ray Train controller (an actor) creates its worker group's placement group and removes it when it ends
    in order. One killed instead (a Tune trial stopped by its scheduler: Tune kills the trial's actor and the
    controller dies with it; a controller that crashed) leaves it, and Ray keeps a placement group made by a
    dead actor until the job ends: its CPUs stay reserved, and the next trials or fits of a long-lived driver
    wait forever. Ray Train's PlacementGroupCleaner would watch for that from a process of its own per run
    (`trainer_class` does not start it); this reads the GCS tables, which need no dashboard.

    The group's own `creator_actor_dead` flag is not enough: the GCS sets it on the groups it holds when the
    actor dies, and `ray.kill` (of the controller, or of the trial actor that owns it) marks the actor dead
    before its process stops. A group the controller was creating right then is registered after the death
    and never flagged (bench/orphan_race.py: 12 of 30 kills of an actor creating groups in a loop; the CPU
    a resumed sweep left held in CI). So the actor table's DEAD answers too."""
    import ray
    from ray._private.state import state
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    groups = job_groups(job_id)
    if not groups:
        return 0
    dead = {actor_id for actor_id, actor in state.actor_table(None, job_id=ray.JobID.from_hex(job_id)).items()
            if actor["State"] == "DEAD"}
    removed = 0
    for group in groups:
        if group.creator_actor_dead or group.creator_actor_id.hex() in dead:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(group.placement_group_id)))
            removed += 1
    return removed


def job_groups(job_id: str, by_actors: bool = True) -> list[Any]:
    """The live placement groups (GCS table entries) that actors of job `job_id` made (Ray Train's
    worker groups; not detached ones); `by_actors=False`: the ones its driver made (Tune's trial groups)."""
    import ray
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    groups = [gcs_pb2.PlacementGroupTableData.FromString(raw)
              for raw in state._connect_and_get_accessor().get_placement_group_table()]
    return [g for g in groups if g.creator_job_id.hex() == job_id and not g.is_detached
            and g.state != gcs_pb2.PlacementGroupTableData.REMOVED
            and ray.ActorID(g.creator_actor_id).is_nil() != by_actors]


def worker_count(train: TrainConfig) -> int | tuple[int, int]:
    """Ray Train's num_workers: fixed, or (min, max) for an elastic group (train.min_workers)."""
    return (train.min_workers, train.num_workers) if 0 < train.min_workers < train.num_workers else train.num_workers


def fit_and_average(trainer: Any, run_path: Path, average_best: int, model: torch.nn.Module,
                    keys: str = "train") -> dict[str, Any]:
    """Fit, then load into `model` the average of the best `average_best` checkpoints by validation BLEU.
    Returns {"history": the latest checkpoint's history, "averaged": [(step, valid_bleu)], "kept": every validated
    checkpoint Ray Train kept (`kept_checkpoint`), "fit_seconds", "fit_started_at", "fit_ended_at" (wall clock)}. `keys`:
    where the run's TrainConfig sits in the config (as `check_resources`), for the error of a group that cannot
    be placed."""
    from pipeline.training.harness import SCORE, select_best
    from reder.checkpoint import MODEL_FILE, average_state_dicts, load_tensors, upgrade_state_dict

    started = time.time()
    config = trainer.train_loop_config
    task = config["task"]
    what = stage_of(task)
    # How long Ray Train's controller waits for each placement of the group: read from the environment of the
    # process that calls fit, which Ray Train passes on to its controller.
    os.environ[START_TIMEOUT_ENV] = str(config["train"]["start_timeout_s"])
    try:
        limit = min(config["train"]["max_time"] or math.inf, config["time_cap_at"] - time.time())
        with progress_bar(Path(config["progress"]), config["train"]["max_steps"], what, limit,
                          tick=lambda: keep_snapshot(run_path)):
            result = off_main_thread(trainer.fit)
    except Exception as error:  # TrainingFailedError wraps the worker's exception
        import ray

        release_orphaned_groups(ray.get_runtime_context().get_job_id())  # a controller that died: its group
        raise (server_lost(failed_with(error)[1], what) or StageError(
            placement_failure(error, config["train"], keys, run_path)
            or f"train: Ray Train failed: {first_failure(error)}")) from error
    ended = time.time()
    scored = [(m[SCORE], m["step"], c) for c, m in result.best_checkpoints if SCORE in m]
    if not scored:
        raise StageError(f"train: the run under {run_path} produced no validated checkpoint")
    best = select_best(scored, average_best)
    states = []
    for _, _, checkpoint in best:
        with checkpoint.as_directory() as directory:
            states.append(load_tensors(Path(directory) / MODEL_FILE))
    with result.checkpoint.as_directory() as directory:  # the latest: the whole history
        history = json.loads((Path(directory) / HISTORY_FILE).read_text(encoding="utf-8"))
    model.load_state_dict(average_state_dicts([upgrade_state_dict(state) for state in states]))
    return {"history": history, "averaged": [{"step": step, SCORE: score} for score, step, _ in best],
            "kept": [kept_checkpoint(c, m) for c, m in result.best_checkpoints if SCORE in m],
            "fit_seconds": round(time.time() - started, 1), "fit_started_at": started, "fit_ended_at": ended}


def kept_checkpoint(checkpoint: Any, metrics: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint Ray Train kept: {"step", "uri" (its directory: a local path, or `<scheme>://<path>` on a
    cloud storage), "validation": its validation scores under their MLflow names (`validation_scores`)}."""
    scheme = checkpoint.filesystem.type_name if checkpoint.filesystem is not None else "local"
    uri = checkpoint.path if scheme == "local" else f"{scheme}://{checkpoint.path}"
    return {"step": int(metrics["step"]), "uri": uri, "validation": validation_scores(metrics)}


def keep_snapshot(run_path: Path) -> None:
    """Copy Ray Train's snapshot of the run aside (a temporary file, then a rename) when it is whole JSON and not
    copied yet; one being rewritten is left for the next call."""
    try:
        text = (run_path / SNAPSHOT).read_text(encoding="utf-8")
        json.loads(text)
    except (OSError, ValueError):
        return
    kept = run_path / KEPT_SNAPSHOT
    with contextlib.suppress(OSError):
        if kept.read_text(encoding="utf-8") == text:
            return
    tmp = kept.with_name(kept.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(kept)


def mend_snapshot(run_path: Path) -> str | None:
    """Before a run resumes: a snapshot Ray Train cannot read (cut short by a kill while it was rewritten) is
    replaced by the copy `keep_snapshot` kept, when every checkpoint that copy names is still there (Ray writes
    its record before it deletes the checkpoints it no longer keeps), and otherwise removed (the run then starts
    over: better than a run that can never resume). Returns what was done, None when the snapshot is whole or
    absent."""
    snapshot = run_path / SNAPSHOT
    try:
        json.loads(snapshot.read_text(encoding="utf-8"))
        return None
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        pass
    kept = run_path / KEPT_SNAPSHOT
    try:
        text = kept.read_text(encoding="utf-8")
        named = [entry["checkpoint_dir_name"] for entry in json.loads(text)["checkpoint_results"]]
    except (OSError, ValueError, KeyError, TypeError):
        named = None
    if named is not None and all((run_path / name).is_dir() for name in named):
        tmp = snapshot.with_name(snapshot.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(snapshot)
        return (f"Ray Train's record of its checkpoints under {run_path} was cut short (a kill while it was "
                f"rewritten): restored from the last whole copy ({len(named)} checkpoint(s))")
    snapshot.unlink()
    return (f"Ray Train's record of its checkpoints under {run_path} was cut short (a kill while it was rewritten) "
            f"and no whole copy of it names checkpoints that are all there: removed")


def newest_whole_checkpoint(run_path: Path) -> tuple[Path, int] | None:
    """The newest checkpoint directory under `run_path` whose files are all whole (`_save`'s two .pt files zip
    archives whose every member matches its CRC, the history JSON), with its step; None without one. Ray Train
    names its checkpoints by the time they were made, so the newest sorts last; one Ray was still copying when
    a kill came is incomplete and skipped."""
    from reder.checkpoint import MODEL_FILE

    for directory in sorted(run_path.glob("checkpoint_*"), reverse=True):
        try:
            for name in (MODEL_FILE, TRAIN_STATE_FILE):
                with zipfile.ZipFile(directory / name) as archive:
                    if archive.testzip() is not None:
                        raise zipfile.BadZipFile(name)
            history = json.loads((directory / HISTORY_FILE).read_text(encoding="utf-8"))
            return directory, int(history[-1]["step"])
        except (OSError, ValueError, zipfile.BadZipFile, LookupError, TypeError):
            continue
    return None


def recorded_history(run_path: Path) -> list[dict[str, Any]]:
    """The history of the run under `run_path` as its newest checkpoint with a readable history holds it (every
    report up to that checkpoint, across restarts); [] without one. What a run did, whatever its consumers (Tune)
    received of its reports."""
    for directory in sorted(run_path.glob("checkpoint_*"), reverse=True):
        try:
            history = json.loads((directory / HISTORY_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(history, list):
            return [entry for entry in history if isinstance(entry, dict)]
    return []


def resume_point(run_path: Path, what: str) -> Path | None:
    """Where a run without a usable record resumes: before Ray Train starts the run under `run_path`, a record
    cut short is mended (`mend_snapshot`); with none left (the copy could not be used, or a kill came after Ray
    copied a checkpoint but before it recorded it), the newest whole checkpoint on disk (`newest_whole_checkpoint`),
    which the workers load when Ray hands them none. Without one the run starts over. What was done is logged."""
    said = mend_snapshot(run_path)
    if (run_path / SNAPSHOT).exists() or not run_path.is_dir():
        if said:
            log.warning("%s: %s", what, said)
        return None
    found = newest_whole_checkpoint(run_path)
    if found is None:
        if said:
            log.warning("%s: %s; no whole checkpoint there: the run starts over", what, said)
        return None
    directory, step = found
    log.warning("%s: %s; the run resumes from %s (step %d), the newest whole checkpoint there", what,
                said or f"checkpoints under {run_path} but no record of them (a kill before Ray Train wrote it)",
                directory.name, step)
    return directory


@contextlib.contextmanager
def progress_bar(path: Path, total: int, desc: str, time_limit: float = math.inf,
                 tick: Callable[[], None] | None = None) -> Iterator[None]:
    """Training steps, fed by rank 0's progress file (`path`, on the run's storage: shared on a cluster), read
    every half second while the fit runs: on a terminal a tqdm bar (loss, last validation BLEU), elsewhere a
    line at most once a minute (pipeline/progress.py; rank 0 writes the file every `train.log_every` steps):
    step/total, loss terms, tokens/s, the last validation BLEU per direction, elapsed, ETA (the sooner of the
    steps' and the `time_limit`'s: max_time or the run's budget). `tick`, when given, is called at every read."""
    progress = Progress(desc, total, "step", time_limit=time_limit)
    stop = threading.Event()
    seen: dict[str, Any] = {}

    def update() -> None:
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # not written yet, or being replaced
            return
        if state == seen:
            return
        seen.clear()
        seen.update(state)
        progress.update(min(int(state["step"]), total), progress_details(state),
                        {k: f"{state[k]:.3g}" for k in ("loss", "valid_bleu") if isinstance(state.get(k), (int, float))})

    def poll() -> None:
        while not stop.wait(0.5):
            update()
            if tick is not None:
                tick()

    thread = threading.Thread(target=poll, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        update()
        progress.close()


def progress_details(state: dict[str, Any]) -> str:
    """The numbers of a progress line: loss (its terms), tokens/s, the last validation BLEU per direction."""
    parts = []
    if "loss" in state:
        terms = ", ".join(f"{name} {value:.3g}" for name, value in state.get("terms", {}).items())
        parts.append(f"loss {state['loss']:.3g}" + (f" ({terms})" if terms else ""))
    if "tokens_per_s" in state:
        parts.append(f"{state['tokens_per_s']:,.0f} tokens/s")
    bleu = state.get("valid_bleu_by_direction", {})
    if bleu:
        parts.append("valid BLEU " + ", ".join(f"{d} {v:.2f}" for d, v in bleu.items()))
    return ", ".join(parts)


def off_main_thread(work: Callable[[], Any]) -> Any:
    """`work()` run in a thread while the main thread waits for it, so that the driver's own Ctrl-C and
    SIGTERM handlers stay in place and answer at once. Ray Train's fit, called on the main thread, installs a
    SIGINT handler of its own that it never removes (Ctrl-C then aborts its controller and calls sys.exit(0),
    even after the fit); off it, fit leaves the handlers alone, as under Tune. An interruption leaves the
    thread waiting on a controller that ends with the driver's Ray session (run_pipeline shuts it down; on a
    cluster, the actors of a departed driver are killed): its checkpoints are kept for the next run."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:  # handed to the main thread
            outcome["error"] = error

    thread = threading.Thread(target=target, name="ray-train-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)  # a timed wait: a signal's handler runs within it
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def placement_failure(error: BaseException, train: dict[str, Any], keys: str, run_path: Path) -> str | None:
    """The message for a fit that stopped because its group could not be placed again (Ray Train's
    WorkerGroupStartupTimeoutError, the last of max_failures + 1 tries): what happened, what is kept, what to
    run. None for any other failure."""
    cause = getattr(error, "controller_failure", None)
    if type(cause).__name__ != "WorkerGroupStartupTimeoutError":
        return None
    tries = train["max_failures"] + 1
    elastic = 0 < train["min_workers"] < train["num_workers"]
    group = (f"its group (elastic, {train['min_workers']} to {train['num_workers']} workers: an autoscaler that may "
             f"bring the host back keeps Ray Train asking for all of them)" if elastic
             else f"its {train['num_workers']} worker(s)")
    rest = "" if elastic else (f", or add {keys}.min_workers=1 to go on from the last checkpoint with the hosts that "
                               f"remain")
    return (f"{keys}: Ray Train could not place {group} within {keys}.start_timeout_s={train['start_timeout_s']:g} s, "
            f"{tries} tr{'y' if tries == 1 else 'ies'} (a host lost for good?); its checkpoints are kept under "
            f"{run_path}: run the same command again once the cluster has the resources{rest}")


def failed_with(error: BaseException) -> tuple[str, BaseException]:
    """("rank R: " or "", the exception) of a failed fit: the lowest rank's own exception, without the wrappers
    Ray puts around it (`WorkerGroupError.worker_failures`, a `RayTaskError`'s `cause`), else the controller's
    or the error's."""
    failures = getattr(error, "worker_failures", None) or {}
    where = ""
    if failures:
        rank = min(failures)
        error, where = failures[rank], f"rank {rank}: "
    else:
        error = getattr(error, "controller_failure", None) or error
    return where, getattr(error, "cause", None) or error


def first_failure(error: BaseException) -> str:
    """One line for a failed fit (`failed_with`), without the tracebacks Ray wraps it in."""
    where, error = failed_with(error)
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{where}{type(error).__name__}: {lines[0][:500] if lines else ''}"


def run_report(fitted: dict[str, Any], run_path: Path) -> dict[str, Any]:
    """report.json of a finished run: steps, averaged checkpoints, last validation, restarts."""
    history = fitted["history"]
    last = history[-1]
    return {"steps": last["step"], "stopped_by": last.get("stopped_by"), "device": last.get("device"),
            "train_seconds": last.get("elapsed"), "averaged_checkpoints": fitted["averaged"], "ray_run": str(run_path),
            "fit_seconds": fitted["fit_seconds"],
            "last_valid": {k: v for k, v in last.items() if k.startswith(("bleu_", "valid_"))},
            "restarts": sum(1 for h in history if h.get("resumed_from")), "too_long": last.get("too_long", 0),
            "workers": read_placement(run_path), "timeline": timeline(fitted, last)}


def timeline(fitted: dict[str, Any], last: dict[str, Any]) -> dict[str, float]:
    """Where a fit's seconds went, from rank 0's last report (its worker group's, the last one after a restart) and
    the driver's clock around the fit: `group_start_s` (the fit's start to the worker's function), `setup_s` (to its
    first update: data, model, compile), `updates_s` (to its last update, validations included), `validation_s` (all
    validations of the run), `end_s` (the last update to the fit's end: the last validation and checkpoint, Ray
    Train's teardown). {} for a run whose report has no clock (a run resumed past its end)."""
    keys = ("worker_started_at", "first_update_at", "last_update_at")
    if not all(key in last for key in keys) or "fit_started_at" not in fitted:
        return {}
    started, first, final = (float(last[key]) for key in keys)
    return {"group_start_s": round(started - fitted["fit_started_at"], 1), "setup_s": round(first - started, 1),
            "updates_s": round(final - first, 1), "validation_s": last.get("validation_seconds"),
            "end_s": round(fitted["fit_ended_at"] - final, 1)}


def read_placement(run_path: Path) -> list[dict[str, Any]]:
    """The last worker group's placement (`gather_placement`, written by rank 0), [] if none was written."""
    try:
        return json.loads((Path(run_path) / WORKERS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []


def budget_record(report: dict[str, Any], train: TrainConfig) -> dict[str, Any]:
    """What a training stage's manifest and MLflow run record of how it ended: why it stopped (max_steps,
    max_time, time_cap: the run's budget, patience), the card, the seed and its training seconds; a run stopped
    by time is not reproducible on another card, so these say what it reached where."""
    return {"stopped_by": report["stopped_by"], "device": report["device"], "seed": train.seed,
            "train_seconds": report["train_seconds"], "budgeted_by_time": bool(train.max_time),
            "too_long": report["too_long"]}
