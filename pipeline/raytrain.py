"""Ray Train runs of the training core (pipeline/harness.py): REDER for the train stage (pipeline/train.py),
both directions' autoregressive teachers in one run for the teacher stage (pipeline/teacher.py), both CMLMs in
one run for the cmlm stage (pipeline/cmlm.py), the trials of the tune stage (pipeline/tune.py). Ray is imported
inside the functions that use it.

Driver side: `check_resources` fails fast, with the numbers, when the cluster cannot hold the worker group
(instead of letting Ray Train wait forever); `make_trainer` builds a `TorchTrainer` that trains on the
tokenized training split (its path: each worker reads its own shard); `fit_and_average` fits it and averages
the best `average_best` checkpoints by validation BLEU (the mean of both directions) into a model.

Worker side (`train_loop`): the TrainConfig rebuilt from its dict, the task's model and objective (the joint
objective of both directions, `DuplexLoss`, or a `PairObjective` over both directions' `TeacherObjective`s or
`CmlmObjective`s, whose models form a `ModelPair`) wrapped for DDP, and a
`Harness` fed with token-bucketed batches of the worker's shard: its rows of the split's Parquet files
(`parquet.shard_ranges`: disjoint, together the whole split), read once with pyarrow into flat token arrays
(`harness.ExampleTable`) and re-bucketed every epoch. No Ray Data: the driver materialising the split in the
object store and every worker turning its shard into Python lists every epoch took most of a run's start at
scale (docs/OPERATIONS.md, "Training"; docs/RESULTS.md, issue 43). Its reports go to `ray.train.report` (and
rank 0's to MLflow); every validation (rank 0 decodes the validation split greedily and scores it with
sacreBLEU; the other ranks report a NaN score; its Validator is built at the first validation) attaches a
checkpoint directory. Ray keeps the best
`keep_checkpoints` by `valid_bleu` plus the latest; a run started again with the same config (same Ray
storage path and run name), or a worker group restarted after a failure (`max_failures`), resumes from the
latest checkpoint: same step, same position in the epoch.

With sequence-level knowledge distillation the shard's rows carry the teachers' outputs (pipeline/distill.py):
every update trains src2tgt on (x, teacher(x)) and tgt2src on (teacher(y), y), both in one forward/backward
(`DuplexLoss`'s tgt2src_batch).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from pipeline import parquet, spm
from pipeline.config import NO_BLANK_PENALTY, PipelineConfig, TrainConfig, from_dict
from pipeline.harness import (EXAMPLE_COLUMNS, RANK_TOKENS_PER_S, SCORE, EpochBatches, ExampleTable, Harness,
                              all_reduce, distributed, epoch_batches, select_best)
from pipeline.metrics import best_setting, corpus_bleu, corpus_scores, shown
from pipeline.progress import Progress
from pipeline.stage import StageError, write_json
from pipeline.tracking import validation_metric
from reder import DIRECTIONS, EOS_ID, DuplexLoss, LossConfig, ModelConfig, REDER, TransformerConfig
from reder.autoregressive import Transformer
from reder.cmlm import CMLM
from reder.config import CmlmConfig
from reder.checkpoint import average_state_dicts, load_tensors
from reder.ctc import pad_batch
from reder.objectives.directional import CmlmObjective, PairObjective, TeacherObjective
from reder.translate import greedy_by_penalty, translate_ids

log = logging.getLogger(__name__)

MODEL_DIR = "model"
HISTORY_FILE = "history.json"
TRAIN_STATE_FILE = "train_state.pt"
PROGRESS_FILE = "progress.json"  # rank 0's latest report, in the Ray Train run's directory: the driver's bar
WORKERS_FILE = "workers.json"  # where the worker group's ranks run (node, host), beside it
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"  # Ray Train's wait for a group's placement (default 60 s)
KD_COLUMNS = EXAMPLE_COLUMNS[2:]  # kd_tgt_ids, kd_src_ids


def worker_resources(train: TrainConfig) -> dict[str, float]:
    """What one training worker asks Ray for."""
    return {"CPU": train.cpus_per_worker, **({"GPU": train.gpus_per_worker} if train.use_gpu else {})}


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


def make_trainer(cfg: PipelineConfig, name: str, storage: Path, train_data: Path, data: Path, corpus: Path,
                 spm_dir: Path, mlflow_target: dict[str, str] | None, callbacks: tuple = (),
                 task: dict[str, str] | None = None, time_cap_s: float = math.inf) -> Any:
    """The TorchTrainer of one training run (run `name` under `storage`; a run with the same pair
    resumes from its latest checkpoint) on the `train_data` split, validated on `data`/valid.
    `mlflow_target` receives rank 0's per-step metrics (with "runs", direction → run id, a pair's metrics
    named for a direction go to that direction's run). `task` is REDER's (default) or {"kind": "teacher" |
    "cmlm"}: both directions' teachers or CMLMs in one run (`build_task`), with the config section of that name. `time_cap_s`: the stage's share of the run's budget (the loop stops
    there, at the latest; the section's own `max_time` may stop it earlier)."""
    import ray.train
    from ray.train.torch import TorchTrainer

    task = task or {"kind": "reder"}
    section = getattr(cfg, task["kind"]) if task["kind"] in ("teacher", "cmlm") else cfg
    train = section.train
    loop_config = {
        "task": task, "model": asdict(section.model), "loss": asdict(cfg.loss),
        "train": asdict(train), "spm_proto": (spm_dir / spm.MODEL_FILE).read_bytes(),
        "train_data": str(Path(train_data).resolve()),  # workers chdir: an absolute path
        "valid": {"ids": str(data / "valid"), "text": str(corpus / "valid")},
        # REDER's validations tune the CTC blank penalty (evaluate.blank_penalties); the teachers' and CMLMs' have none
        "blank_penalties": list(cfg.evaluate.blank_penalties if task["kind"] == "reder" else NO_BLANK_PENALTY),
        "mlflow": mlflow_target,
        "progress": str(Path(storage) / name / PROGRESS_FILE),
        "time_cap_s": time_cap_s,
    }
    resources = worker_resources(train)
    return TorchTrainer(
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


def worker_count(train: TrainConfig) -> int | tuple[int, int]:
    """Ray Train's num_workers: fixed, or (min, max) for an elastic group (train.min_workers)."""
    return (train.min_workers, train.num_workers) if 0 < train.min_workers < train.num_workers else train.num_workers


def accumulation(train: TrainConfig, world_size: int) -> TrainConfig:
    """`train` with update_freq raised so that a group of `world_size` ranks, fewer than num_workers (an elastic
    group after a lost host), updates on about the batch that num_workers ranks would (fairseq's --update-freq)."""
    scale = math.ceil(train.num_workers / world_size)
    return replace(train, update_freq=train.update_freq * scale) if scale > 1 else train


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


def fit_and_average(trainer: Any, run_path: Path, average_best: int, model: torch.nn.Module,
                    keys: str = "train") -> dict[str, Any]:
    """Fit, then load into `model` the average of the best `average_best` checkpoints by validation BLEU.
    Returns {"history": the latest checkpoint's history, "averaged": [(step, valid_bleu)], "fit_seconds"}. `keys`:
    where the run's TrainConfig sits in the config (as `check_resources`), for the error of a group that cannot
    be placed."""
    started = time.time()
    config = trainer.train_loop_config
    task = config["task"]
    what = task["kind"] if task["kind"] != "reder" else "train"
    # How long Ray Train's controller waits for each placement of the group: read from the environment of the
    # process that calls fit, which Ray Train passes on to its controller.
    os.environ[START_TIMEOUT_ENV] = str(config["train"]["start_timeout_s"])
    try:
        limit = min(config["train"]["max_time"] or math.inf, config["time_cap_s"])
        with progress_bar(Path(config["progress"]), config["train"]["max_steps"], what, limit):
            result = off_main_thread(trainer.fit)
    except Exception as error:  # TrainingFailedError wraps the worker's exception
        raise StageError(placement_failure(error, config["train"], keys, run_path)
                         or f"train: Ray Train failed: {first_failure(error)}") from error
    scored = [(m[SCORE], m["step"], c) for c, m in result.best_checkpoints if SCORE in m]
    if not scored:
        raise StageError(f"train: the run under {run_path} produced no validated checkpoint")
    best = select_best(scored, average_best)
    states = []
    for _, _, checkpoint in best:
        with checkpoint.as_directory() as directory:
            states.append(load_tensors(Path(directory) / "model.pt"))
    with result.checkpoint.as_directory() as directory:  # the latest: the whole history
        history = json.loads((Path(directory) / HISTORY_FILE).read_text(encoding="utf-8"))
    model.load_state_dict(average_state_dicts(states))
    return {"history": history, "averaged": [{"step": step, SCORE: score} for score, step, _ in best],
            "fit_seconds": round(time.time() - started, 1)}


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


@contextlib.contextmanager
def progress_bar(path: Path, total: int, desc: str, time_limit: float = math.inf) -> Iterator[None]:
    """Training steps, fed by rank 0's progress file (`path`, on the run's storage: shared on a cluster), read
    every half second while the fit runs: on a terminal a tqdm bar (loss, last validation BLEU), elsewhere a
    line at most once a minute (pipeline/progress.py; rank 0 writes the file every `train.log_every` steps):
    step/total, loss terms, tokens/s, the last validation BLEU per direction, elapsed, ETA (the sooner of the
    steps' and the `time_limit`'s: max_time or the run's budget)."""
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


def write_progress(path: Path, state: dict[str, Any], metrics: dict[str, Any]) -> None:
    """Update `state` (step, training loss and its terms, tokens/s, latest validation BLEU, overall and per
    direction) from a report's `metrics` and write it as rank 0's progress file (atomically: the driver may be
    reading it)."""
    def finite(key: str) -> bool:
        return isinstance(metrics.get(key), (int, float)) and math.isfinite(metrics[key])

    state["step"] = metrics["step"]
    for key, name in (("train_total", "loss"), (SCORE, "valid_bleu"), ("tokens_per_s", "tokens_per_s")):
        if finite(key):
            state[name] = metrics[key]
    terms = {key[len("train_"):]: metrics[key] for key in metrics
             if key.startswith("train_") and key != "train_total" and finite(key)}
    if terms:
        state["terms"] = terms
    # per direction, as validated (with the tuned blank penalty; the unpenalised scores are MLflow's only)
    bleu = {d: metrics[f"bleu_{d}"] for d in DIRECTIONS if finite(f"bleu_{d}")}
    if bleu:
        state["valid_bleu_by_direction"] = bleu
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, state)


def first_failure(error: BaseException) -> str:
    """One line for a failed fit: the lowest rank's own exception, without the tracebacks Ray wraps it in
    (`WorkerGroupError.worker_failures`, a `RayTaskError`'s `cause`), else the controller's or the error's."""
    failures = getattr(error, "worker_failures", None) or {}
    where = ""
    if failures:
        rank = min(failures)
        error, where = failures[rank], f"rank {rank}: "
    else:
        error = getattr(error, "controller_failure", None) or error
    error = getattr(error, "cause", None) or error
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
            "workers": read_placement(run_path)}


def budget_record(report: dict[str, Any], train: TrainConfig) -> dict[str, Any]:
    """What a training stage's manifest and MLflow run record of how it ended: why it stopped (max_steps,
    max_time, time_cap: the run's budget, patience), the card, the seed and its training seconds; a run stopped
    by time is not reproducible on another card, so these say what it reached where."""
    return {"stopped_by": report["stopped_by"], "device": report["device"], "seed": train.seed,
            "train_seconds": report["train_seconds"], "budgeted_by_time": bool(train.max_time),
            "too_long": report["too_long"]}


def read_placement(run_path: Path) -> list[dict[str, Any]]:
    """The last worker group's placement (`gather_placement`, written by rank 0), [] if none was written."""
    try:
        return json.loads((Path(run_path) / WORKERS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []


# ----------------------------------------------------------------------------------------------------------
# Worker side


def read_shard(path: Path, rank: int, world_size: int, model: Optional[torch.nn.Module] = None) -> tuple[ExampleTable, int]:
    """Rank `rank`'s examples of the training split at `path` (`parquet.read_shard`): (src, tgt), or with KD
    columns (src, tgt, kd_tgt, kd_src); with `model`, less those it cannot read (`length_limits`). Returns
    them and how many were left out."""
    files = sorted(Path(path).glob("part-*.parquet"))
    if not files:
        raise StageError(f"train: no part-*.parquet files in {path}")
    columns = [c for c in EXAMPLE_COLUMNS if c in pq.read_schema(files[0]).names]
    table = parquet.read_shard(path, rank, world_size, columns)
    keep = None
    for column, limit in (length_limits(model, columns) if model is not None else {}).items():
        fits = pc.less_equal(pc.list_value_length(table.column(column)), limit)
        keep = fits if keep is None else pc.and_(keep, fits)
    if keep is None or not table.num_rows:
        return ExampleTable(table), 0
    kept = table.filter(keep)
    return ExampleTable(kept), table.num_rows - kept.num_rows


def length_limits(model: torch.nn.Module, columns: Sequence[str]) -> dict[str, int]:
    """The most pieces (EOS not counted) each training column may hold for `model` to read it. A REDER: its
    inputs (src_ids, and tgt_ids, or with KD kd_src_ids), upsampled, must fit max_positions (its targets then
    fit the upsampled input, tokenize's and distill's feasibility rules); a teacher or CMLM pair: every
    sequence, with its BOS or EOS, within max_positions. Tokenize does not filter by max_positions (its key
    does not hold it): an example over the limit would stop the run at its batch's first embedding."""
    if isinstance(model, REDER):
        return dict.fromkeys(("src_ids", "kd_src_ids" if "kd_src_ids" in columns else "tgt_ids"), model.max_input_length() - 1)
    return dict.fromkeys(columns, min(member.max_input_length() for member in model.values()) - 1)


def _epoch(examples: ExampleTable, train: TrainConfig, epoch: int, rank: int, group: Any = None) -> EpochBatches:
    """This worker's batches of one epoch, brought to the same count on every rank (DDP needs the same number of
    updates everywhere), agreed over process group `group`: the largest rank's. A rank with fewer batches
    trains its first ones again (as torch's DistributedSampler pads with repeats), so every example of every
    shard is trained on in every epoch; cutting every rank to the smallest count (before issue 55) left part of
    the larger shards out of each epoch."""
    batches = epoch_batches(examples, train.max_tokens, train.seed, epoch, rank, train.batch_tokens)
    most = int(all_reduce(len(batches), "max", group))
    return EpochBatches(batches.examples, [batches.order[i % len(batches)] for i in range(most)]) if batches else batches


def data_group() -> Any:
    """A gloo process group of its own for the batches' agreement (`_epoch`): the harness builds batches ahead
    on a thread, whose collectives must not interleave with the training thread's (DDP's gradients, the
    reports) on one group, where the ranks could enter them in different orders. None for a single worker."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo") if distributed() else None


class ModelPair(torch.nn.ModuleDict):
    """The two directions' models of a teacher or CMLM stage (direction → model), trained by one worker group:
    checkpointed, averaged and validated as one module (`<direction>.` prefixes its parameters), clipped per model
    (`clip_groups`, harness.clip_gradients) as two runs would be."""

    def clip_groups(self) -> dict[str, torch.nn.Module]:
        """The parts whose gradients are clipped apart: each direction's model."""
        return dict(self.items())


PAIR_KINDS = {"teacher": (Transformer, TransformerConfig, TeacherObjective), "cmlm": (CMLM, CmlmConfig, CmlmObjective)}


def build_task(config: dict[str, Any]) -> tuple[torch.nn.Module, torch.nn.Module, tuple[str, ...]]:
    """(model, objective, validation directions) of a loop config's task: REDER, or both directions' teachers or
    CMLMs ({"kind": "teacher" | "cmlm"}) as a `ModelPair` with a `PairObjective`. Each of a pair's models is
    initialised from the run's seed, as it was when each direction had a run of its own."""
    task = config["task"]
    if task["kind"] in PAIR_KINDS:
        model_class, config_class, objective_class = PAIR_KINDS[task["kind"]]
        models = {}
        for direction in DIRECTIONS:
            torch.manual_seed(config["train"]["seed"])
            models[direction] = model_class(config_class.from_dict(config["model"]))
        pair = ModelPair(models)
        return pair, PairObjective({d: objective_class(m, d) for d, m in models.items()}), DIRECTIONS
    model = REDER(ModelConfig.from_dict(config["model"]), LossConfig.from_dict(config["loss"]))
    return model, DuplexLoss(model), model.loss_config.directions  # a simplex model: its one direction


class Validator:
    """Greedy decoding of the validation split in `directions` (a CMLM: mask-predict, translate_ids' default 10
    iterations and one length candidate), scored with sacreBLEU (rank 0); for a teacher also its validation loss
    (mean token NLL, `valid_nll_<direction>`), and the output's length over the references' (`valid_length_ratio_
    <direction>`, in BLEU's tokens: a CTC model that over-predicts the blank writes short). A CTC REDER with
    `blank_penalties` other than [0] is decoded once per direction under each penalty (`greedy_by_penalty`):
    `bleu_<direction>` is the best penalty's BLEU (of equals the penalty nearest 0), `blank_penalty_<direction>`
    that penalty and `bleu_<direction>_unpenalised` the BLEU without one (when 0 is in the grid)."""

    def __init__(self, paths: dict[str, str], spm_proto: bytes, max_sentences: int,
                 directions: tuple[str, ...] = DIRECTIONS, blank_penalties: tuple[float, ...] = NO_BLANK_PENALTY) -> None:
        import sentencepiece

        ids = pq.read_table(paths["ids"]).sort_by("id")
        text = pq.read_table(paths["text"]).sort_by("id")
        if max_sentences:
            ids, text = ids.slice(0, max_sentences), text.slice(0, max_sentences)
        by_id = dict(zip(text.column("id").to_pylist(), zip(text.column("src").to_pylist(), text.column("tgt").to_pylist())))
        kept = ids.column("id").to_pylist()
        self.directions = directions
        self.inputs = {"src2tgt": [s + [EOS_ID] for s in ids.column("src_ids").to_pylist()],
                       "tgt2src": [t + [EOS_ID] for t in ids.column("tgt_ids").to_pylist()]}
        self.references = {"src2tgt": [by_id[i][1] for i in kept], "tgt2src": [by_id[i][0] for i in kept]}
        self.sp = sentencepiece.SentencePieceProcessor(model_proto=spm_proto)
        self.blank_penalties = tuple(float(p) for p in blank_penalties)
        self.warned: set[tuple[str, int]] = set()  # (direction, limit) whose cut inputs the log has named

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        """Scores of `model` (REDER, one direction's teacher or CMLM, or a `ModelPair`: each direction decoded by
        its own model)."""
        was_training = model.training
        model.eval()
        scores = {}
        tunes = isinstance(model, REDER) and model.head.emits_blank and self.blank_penalties != NO_BLANK_PENALTY
        try:
            for direction in self.directions:
                if tunes:
                    scores.update(self._penalised(model, direction))
                    continue
                member = model[direction] if isinstance(model, ModelPair) else model
                hypotheses = [self.sp.decode(h) for h in translate_ids(member, self._inputs(member, direction), direction)]
                result = corpus_scores(hypotheses, self.references[direction])
                scores[f"bleu_{direction}"], scores[f"valid_length_ratio_{direction}"] = result["bleu"], result["length_ratio"]
                if isinstance(member, Transformer):
                    scores[f"valid_nll_{direction}"] = self._nll(member, direction)
        finally:
            model.train(was_training)
        scores[SCORE] = sum(scores[f"bleu_{d}"] for d in self.directions) / len(self.directions)
        return scores

    def _penalised(self, model: REDER, direction: str) -> dict[str, float]:
        """Greedy BLEU of `direction` under each blank penalty: the best's, which penalty, the unpenalised."""
        outputs = greedy_by_penalty(model, self._inputs(model, direction), direction, self.blank_penalties)
        scored = {penalty: corpus_bleu([self.sp.decode(h) for h in ids], self.references[direction])
                  for penalty, ids in outputs.items()}  # penalty → (BLEU, length ratio)
        best = best_setting({penalty: bleu for penalty, (bleu, _) in scored.items()})
        scores = {f"bleu_{direction}": scored[best][0], f"blank_penalty_{direction}": best,
                  f"valid_length_ratio_{direction}": scored[best][1]}
        if 0.0 in scored:
            scores[f"bleu_{direction}_unpenalised"] = scored[0.0][0]
        return scores

    def _inputs(self, model: torch.nn.Module, direction: str) -> list[list[int]]:
        """The validation inputs of `direction` (ids with EOS), each cut to what `model` reads: tokenize does not
        filter the validation split by max_positions, and one long sentence must not stop the training run (it is
        scored as cut; `cut` counts them once per direction in the worker's log)."""
        limit = model.max_input_length()
        inputs = [s if len(s) <= limit else s[: limit - 1] + [EOS_ID] for s in self.inputs[direction]]
        cut = sum(len(s) > limit for s in self.inputs[direction])
        if cut and (direction, limit) not in self.warned:
            self.warned.add((direction, limit))
            log.warning("validation %s: %d sentences longer than the model reads (%d pieces with EOS), cut to it",
                        direction, cut, limit)
        return inputs

    @torch.no_grad()
    def _nll(self, model: Transformer, direction: str, batch_size: int = 64) -> float:
        """Token-weighted mean NLL of the references under the teacher (teacher forcing)."""
        back = "tgt2src" if direction == "src2tgt" else "src2tgt"
        device = next(model.parameters()).device
        total = tokens = 0.0
        inputs, references = self._inputs(model, direction), self._inputs(model, back)
        for start in range(0, len(inputs), batch_size):
            src, src_lengths = pad_batch(inputs[start : start + batch_size], device)
            tgt, tgt_lengths = pad_batch(references[start : start + batch_size], device)
            count = float(tgt_lengths.sum())
            total += float(model.loss(src, src_lengths, tgt, tgt_lengths)["nll"]) * count
            tokens += count
        return total / max(tokens, 1.0)


def quiet_reports() -> None:
    """Every ray.train.report logs "Reporting training result N: TrainingReport(<every metric>)" at INFO to
    the worker's console, forwarded to the driver's terminal: through a logger named by its module's file
    path, which RunConfig's LoggingConfig (for `ray.train.*` loggers) does not reach. Raised to WARNING here;
    the driver's progress bar and MLflow carry the numbers."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # another Ray layout: its messages stay
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function (see the module doc): a Harness over this worker's shard."""
    train = from_dict(TrainConfig, config["train"], "train")
    import ray.train
    import ray.train.torch

    quiet_reports()
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    if world_size < train.num_workers:  # an elastic group that lost a host: the same batch per update
        train = accumulation(train, world_size)
        if rank == 0:
            log.warning("train: %d of %d workers (a host lost): update_freq %d", world_size, train.num_workers,
                        train.update_freq)
    torch.manual_seed(train.seed)
    device = ray.train.torch.get_device()
    model, objective, directions = build_task(config)
    model.to(device)
    state = _load(ray.train.get_checkpoint(), device)
    # Only rank 0 decodes; Ray keeps rank 0's metrics, the others report a NaN score. The Validator (Parquet
    # reads, SentencePiece) is built at the first validation: off the path to the first update.
    validate = lazy_validator(config, train.valid_max_sentences, directions) if rank == 0 \
        else (lambda _: {SCORE: math.nan})
    # Every rank logs its own throughput (`tokens_per_s_rank<r>`: a slow host shows); rank 0 everything else.
    mlflow = _MlflowLogger(config["mlflow"]) if config["mlflow"] else None
    system = SystemMetrics(config["mlflow"], context.get_node_rank()) if context.get_local_rank() == 0 else None
    progress: dict[str, Any] = {}
    placement = gather_placement(world_size)
    if rank == 0 and config.get("progress"):
        Path(config["progress"]).parent.mkdir(parents=True, exist_ok=True)
        write_json(Path(config["progress"]).with_name(WORKERS_FILE), placement)

    def report(metrics: dict[str, Any], checkpoint: Optional[dict[str, Any]]) -> None:
        if mlflow is not None:
            logged = {key: value for key, value in metrics.items() if key != RANK_TOKENS_PER_S} if rank == 0 else {}
            if RANK_TOKENS_PER_S in metrics:
                logged[f"tokens_per_s_rank{rank}"] = metrics[RANK_TOKENS_PER_S]
            if logged:
                mlflow.log(logged, metrics["step"])
            if checkpoint is not None:  # a validation: in the store before Ray (or Tune's scheduler) sees it
                mlflow.flush()
        if rank == 0 and config.get("progress"):
            write_progress(Path(config["progress"]), progress, metrics)
        directory = _save(checkpoint) if checkpoint is not None and rank == 0 else None
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory) if directory else None)
        if directory:
            shutil.rmtree(directory, ignore_errors=True)  # Ray has copied it to the run's storage

    def fault_drill(step: int) -> None:
        if train.fail_at_step and step == train.fail_at_step and harness.resumed_from is None \
                and rank == world_size - 1:
            raise RuntimeError(f"fault drill: train.fail_at_step={step} (rank {rank})")

    # A simplex REDER (loss.directions: one) leaves the other reading end's positions without a gradient,
    # which DDP refuses unless told to look for unused parameters.
    unused = {"find_unused_parameters": True} if isinstance(model, REDER) and len(directions) < len(DIRECTIONS) else {}
    harness = Harness(model, ray.train.torch.prepare_model(objective, parallel_strategy_kwargs=unused), train, device,
                      validate=validate, on_report=report, on_step=fault_drill)
    if state is not None:
        harness.load_state_dict(state)
        if mlflow is not None:
            mlflow.log({"resumed_from_step": harness.step}, harness.step)  # one point per restart of the worker group
    group = data_group()
    examples, too_long = read_shard(Path(config["train_data"]), rank, world_size, model)
    harness.run_facts["too_long"] = int(all_reduce(too_long, "sum", group))
    if rank == 0 and harness.run_facts["too_long"]:
        log.warning("train: %d training examples left out: longer than the model reads (its max_positions)",
                    harness.run_facts["too_long"])
    try:
        harness.fit(harness.stream(lambda epoch: _epoch(examples, train, epoch, rank, group)), time_cap_s=config["time_cap_s"])
    finally:
        if system is not None:
            system.finish()
        if mlflow is not None:
            mlflow.close()  # what was queued is logged before the run's end is reported
    if mlflow is not None:
        mlflow.check()


def lazy_validator(config: dict[str, Any], max_sentences: int,
                   directions: tuple[str, ...]) -> Callable[[torch.nn.Module], dict[str, float]]:
    """A loop config's `Validator`, built at its first call."""
    built: list[Validator] = []

    def validate(model: torch.nn.Module) -> dict[str, float]:
        if not built:
            built.append(Validator(config["valid"], config["spm_proto"], max_sentences, directions,
                                   tuple(config["blank_penalties"])))
        return built[0](model)
    return validate


def gather_placement(world_size: int) -> list[dict[str, Any]]:
    """Where every rank of the worker group runs (node address, host name, pid), gathered over the process
    group, so over the same links as DDP's gradients: the list also shows that the ranks reach each other.
    A single worker has nothing to gather (all_gather_object pickles through the process group even then)."""
    import ray.util
    import torch.distributed as dist

    mine = {"node_ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(), "pid": os.getpid()}
    everyone: list[Any] = [mine]
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
    return [{"rank": rank, **where} for rank, where in enumerate(everyone)]


def _load(checkpoint: Any, device: torch.device) -> Optional[dict[str, Any]]:
    """A Harness state from a checkpoint of `_save` (None without a checkpoint)."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        return load_state_dir(Path(directory), device)


def load_state_dir(directory: Path, device: torch.device | str) -> dict[str, Any]:
    """A Harness state from a checkpoint directory of `_save`. Both .pt files are read with
    weights_only=True: a file holding anything but tensors and plain containers is refused with a
    ValueError naming it, never unpickled (a planted pickle would run code on every resume)."""
    state = load_tensors(directory / TRAIN_STATE_FILE, device)
    if not isinstance(state, dict):
        raise ValueError(f"{directory / TRAIN_STATE_FILE}: expected a dict, found {type(state).__name__}")
    state["model"] = load_tensors(directory / "model.pt", device)
    state["history"] = json.loads((directory / HISTORY_FILE).read_text(encoding="utf-8"))
    return state


def _save(state: dict[str, Any]) -> str:
    """A Harness state as a checkpoint directory: model.pt (what fit_and_average averages), train_state.pt
    (optimizer, schedule, position: tensors, numbers and plain containers, loadable with weights_only=True)
    and the history."""
    directory = tempfile.mkdtemp(prefix=f"reder-step{state['step']}-")
    torch.save(state["model"], Path(directory) / "model.pt")
    torch.save({k: v for k, v in state.items() if k not in ("model", "history")}, Path(directory) / TRAIN_STATE_FILE)
    (Path(directory) / HISTORY_FILE).write_text(json.dumps(state["history"]), encoding="utf-8")
    return directory


def route_metrics(metrics: dict[str, Any], run_id: str, runs: dict[str, str]) -> dict[str, dict[str, float]]:
    """run id → {MLflow name: value} of a report's finite numbers (`step` aside): a metric named for a direction
    (`nll_src2tgt`, `grad_norm_tgt2src`) goes to that direction's run in `runs`, every other one (the pair's
    total loss, lr, tokens/s, the mean BLEU) to `run_id`."""
    routed: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        if key == "step" or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            continue
        owner = next((runs[d] for d in runs if f"_{d}_" in f"_{key}_"), run_id)
        routed.setdefault(owner, {})[validation_metric(key)] = float(value)
    return routed


class SystemMetrics:
    """MLflow's system metrics monitor (mlflow.system_metrics) for this worker's node, logging into the stage's run
    as `system/node_<node rank>/...` every `system_metrics_s` of the MLflow target (0 or no target: off). Built on a
    thread of its own (MLflow's import stays off the path to the first update, as `_MlflowLogger`'s); anything it
    lacks (psutil; pynvml is optional to MLflow) is one warning and no metrics, never a failed run."""

    def __init__(self, target: Optional[dict[str, Any]], node_rank: int) -> None:
        self.monitor: Any = None
        interval = (target or {}).get("system_metrics_s", 0)
        self.thread = threading.Thread(target=self._start, args=(target, node_rank, interval), daemon=True,
                                       name="mlflow-system-metrics")
        if interval:
            self.thread.start()

    def _start(self, target: dict[str, Any], node_rank: int, interval: float) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            # its INFO lines ("Skip logging GPU metrics" on a CPU host, start, stop) are nothing to act on
            logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
            # resume_logging: a restarted worker group goes on from the last step logged
            monitor = SystemMetricsMonitor(target["run_id"], sampling_interval=interval, node_id=f"node_{node_rank}",
                                           tracking_uri=target["uri"], resume_logging=True)
            monitor.start()
            self.monitor = monitor
        except Exception as error:  # e.g. no psutil: the run goes on without system metrics
            log.warning("no system metrics in MLflow (tracking.system_metrics): %s: %s", type(error).__name__, error)

    def finish(self) -> None:
        """Stop sampling and log what was sampled, with one last sample: MLflow's monitor logs only after each
        interval, so a run shorter than one (a smoke run's teachers) would otherwise record nothing."""
        if self.thread.ident is not None:
            self.thread.join()
        if self.monitor is not None:
            self.monitor.finish()
            try:
                self.monitor.collect_metrics()
                self.monitor.publish_metrics(self.monitor.aggregate_metrics())
                self.monitor.mlflow_logger.flush()
            except Exception as error:  # never the run's failure
                log.warning("system metrics: the last sample was not logged: %s", error)


class _MlflowLogger:
    """Rank 0 logs per-step metrics into the stage's MLflow run (tracking URI and run id from the driver; with
    "runs", a pair's direction-named metrics into each direction's run: `route_metrics`). MLflow is imported, its
    client built and every batch logged on a thread of its own, started by the first `log`: neither its import
    nor the store's latency stands before the first update, nor the store's latency before any other. `flush()` (at every validation) and `close()` wait for what was queued; a failed
    log is raised by the next `log`, `flush` or `check`."""

    def __init__(self, target: dict[str, Any]) -> None:
        self.target = target
        self.queue: "queue.Queue[Optional[tuple[dict[str, Any], int, int]]]" = queue.Queue()
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="mlflow-logger", daemon=True)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.check()
        if not self.thread.is_alive() and self.thread.ident is None:
            # Started at the first report, after the first update: MLflow's import (~4 s of CPU on the 2-core box)
            # would otherwise compete with the model's start for the GIL.
            self.thread.start()
        self.queue.put((dict(metrics), step, int(time.time() * 1000)))

    def flush(self) -> None:
        """Wait until what was queued is logged; raise if logging failed."""
        self.queue.join()
        self.check()

    def close(self) -> None:
        """Wait until what was queued is logged (or logging failed: `check` says) and end the thread."""
        if self.thread.ident is not None:
            self.queue.put(None)
            self.thread.join()

    def check(self) -> None:
        """Raise the error that stopped the logging thread, if one did."""
        if self.error is not None:
            error, self.error = self.error, None
            raise RuntimeError(f"MLflow logging failed: {error}") from error

    def _run(self) -> None:
        client = None
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=self.target["uri"])
        except BaseException as error:  # handed to the training thread
            self.error = error
        while (item := self.queue.get()) is not None:
            try:
                if client is not None and self.error is None:
                    from mlflow.entities import Metric

                    metrics, step, now = item
                    for run_id, values in route_metrics(metrics, self.target["run_id"],
                                                        self.target.get("runs", {})).items():
                        client.log_batch(run_id, metrics=[Metric(k, shown(k, v), now, step) for k, v in values.items()])
            except BaseException as error:  # handed to the training thread
                self.error = error
            finally:
                self.queue.task_done()  # flush() waits for every item, logged or not
