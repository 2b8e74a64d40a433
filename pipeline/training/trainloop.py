"""Ray Train runs of the training core (pipeline/training/harness.py), the worker side: `train_loop`, the function every
worker of the group runs (pipeline/training/raytrain.py builds the trainer that starts it; the files the two hand each
other are named in pipeline/training/runfiles.py). Ray is imported inside the functions that use it.

`train_loop`: the TrainConfig rebuilt from its dict, the task's model and objective (the joint objective of both
directions, `DuplexLoss`, or a `PairObjective` over both directions' `TeacherObjective`s or `CmlmObjective`s,
whose models form a `ModelPair`) wrapped for DDP, and a `Harness` fed with token-bucketed batches of the worker's
shard: its rows of the split's Parquet files (`parquet.shard_ranges`: disjoint, together the whole split), read
once with pyarrow into flat token arrays (`harness.ExampleTable`) and re-bucketed every epoch. No Ray Data: the
driver materialising the split in the object store and every worker turning its shard into Python lists every
epoch took most of a run's start at scale (docs/OPERATIONS.md, "Training on Ray"; docs/results/training.md). Its
reports go to `ray.train.report` (and rank 0's to MLflow); every validation (rank 0 decodes the validation split
greedily and scores it with sacreBLEU; the other ranks report a NaN score; its Validator is built at the first
validation) attaches a checkpoint directory. Ray keeps the best `keep_checkpoints` by `valid_bleu` plus the
latest; a run started again with the same config (same Ray storage path and run name), or a worker group
restarted after a failure (`max_failures`), resumes from the latest checkpoint: same step, same position in the
epoch.

With sequence-level knowledge distillation the shard's rows carry the teachers' outputs (pipeline/stages/distill.py):
every update trains src2tgt on (x, teacher(x)) and tgt2src on (teacher(y), y), both in one forward/backward
(`DuplexLoss`'s tgt2src_batch).

Below `train_loop`, in the order it uses them: `quiet_reports`; `accumulation` (an elastic group that lost a
host keeps its batch per update); the task (`build_task`, `ModelPair`); checkpoints (`_load`, `load_state_dir`,
`_save`); validation (`lazy_validator`, `Validator`); MLflow (`_MlflowLogger`, `route_metrics`,
`SystemMetrics`); where the ranks run (`gather_placement`) and rank 0's progress file (`write_progress`); the
data (`data_group`, `read_shard`, `length_limits`, `_epoch`).
"""
from __future__ import annotations

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
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from pipeline import parquet
from pipeline.config import NO_BLANK_PENALTY, TrainConfig, from_dict
from pipeline.training.harness import (EXAMPLE_COLUMNS, RANK_TOKENS_PER_S, SCORE, EpochBatches, ExampleTable, Harness,
                              all_reduce, distributed, epoch_batches)
from pipeline.metrics import best_setting, corpus_bleu, shown
from pipeline.stage import StageError, write_json
from pipeline.tracking.store import validation_metric
from pipeline.training.runfiles import HISTORY_FILE, TRAIN_STATE_FILE, WORKERS_FILE
from reder import DIRECTIONS, EOS_ID, DuplexLoss, LossConfig, ModelConfig, REDER, TransformerConfig
from reder.autoregressive import Transformer
from reder.cmlm import CMLM
from reder.config import CmlmConfig
from reder.checkpoint import MODEL_FILE, load_tensors
from reder.ctc import pad_batch
from reder.objectives.directional import CmlmObjective, PairObjective, TeacherObjective, teacher_loss
from reder.decoding.ctc import greedy_by_penalty
from reder.decoding.run import choose, translate_ids

log = logging.getLogger(__name__)


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function (see the module doc): a Harness over this worker's shard."""
    entered = time.time()  # the worker group's start ends here (raytrain.timeline)
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
    if device.type == "cuda":  # this process's default device: no trainer's context sets it (process_group.py)
        torch.cuda.set_device(device)
    model, objective, directions = build_task(config)
    model.to(device)
    checkpoint = ray.train.get_checkpoint()  # Ray's, or else where a run with no record resumes (raytrain.resume_point)
    state = _load(checkpoint, device) if checkpoint is not None or not config.get("resume_dir") \
        else load_state_dir(Path(config["resume_dir"]), device)
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
    harness.run_facts["worker_started_at"] = round(entered, 3)
    if state is not None:
        harness.load_state_dict(state)
        if mlflow is not None:
            mlflow.log({"resumed_from_step": harness.step}, harness.step)  # one point per restart of the worker group
    group = data_group()
    examples, too_long = read_shard(Path(config["train_data"]), rank, world_size, model,
                                    references=config.get("references", False))
    harness.run_facts["too_long"] = int(all_reduce(too_long, "sum", group))
    if rank == 0 and harness.run_facts["too_long"]:
        log.warning("train: %d training examples left out: longer than the model reads (its max_positions)",
                    harness.run_facts["too_long"])
    # What is left of the stage's share of the run's budget: the slowest rank's clock, so that all stop at one update.
    time_cap_s = all_reduce(config["time_cap_at"] - time.time(), "min", group)
    try:
        harness.fit(harness.stream(lambda epoch: _epoch(examples, train, epoch, rank, group)), time_cap_s=time_cap_s)
    finally:
        if system is not None:
            system.finish()
        if mlflow is not None:
            mlflow.close()  # what was queued is logged before the run's end is reported
    if mlflow is not None:
        mlflow.check()


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


def accumulation(train: TrainConfig, world_size: int) -> TrainConfig:
    """`train` with update_freq raised so that a group of `world_size` ranks, fewer than num_workers (an elastic
    group after a lost host), updates on about the batch that num_workers ranks would (fairseq's --update-freq)."""
    scale = math.ceil(train.num_workers / world_size)
    return replace(train, update_freq=train.update_freq * scale) if scale > 1 else train


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
    model = REDER(ModelConfig.from_dict(config["model"]))
    objective = DuplexLoss(model, LossConfig.from_dict(config["loss"]))
    return model, objective, objective.directions  # a simplex model: its one direction


class ModelPair(torch.nn.ModuleDict):
    """The two directions' models of a teacher or CMLM stage (direction → model), trained by one worker group:
    checkpointed, averaged and validated as one module (`<direction>.` prefixes its parameters), clipped per model
    (`clip_groups`, harness.clip_gradients) as two runs would be."""

    def clip_groups(self) -> dict[str, torch.nn.Module]:
        """The parts whose gradients are clipped apart: each direction's model."""
        return dict(self.items())


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
    state["model"] = load_tensors(directory / MODEL_FILE, device)
    state["history"] = json.loads((directory / HISTORY_FILE).read_text(encoding="utf-8"))
    return state


def _save(state: dict[str, Any]) -> str:
    """A Harness state as a checkpoint directory: model.pt (what fit_and_average averages), train_state.pt
    (optimizer, schedule, position: tensors, numbers and plain containers, loadable with weights_only=True)
    and the history."""
    directory = tempfile.mkdtemp(prefix=f"reder-step{state['step']}-")
    torch.save(state["model"], Path(directory) / MODEL_FILE)
    torch.save({k: v for k, v in state.items() if k not in ("model", "history")}, Path(directory) / TRAIN_STATE_FILE)
    (Path(directory) / HISTORY_FILE).write_text(json.dumps(state["history"]), encoding="utf-8")
    return directory


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


class Validator:
    """Greedy decoding of the validation split in `directions` (a CMLM: mask-predict with its default 10
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
                decoded = translate_ids(member, self._inputs(member, direction), direction, choose(member))
                hypotheses = [self.sp.decode(h) for h in decoded]
                scores[f"bleu_{direction}"], scores[f"valid_length_ratio_{direction}"] = corpus_bleu(
                    hypotheses, self.references[direction])  # no chrF: ~0.3 s a direction at every validation
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
            total += float(teacher_loss(model, src, src_lengths, tgt, tgt_lengths)["nll"]) * count
            tokens += count
        return total / max(tokens, 1.0)


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


def route_metrics(metrics: dict[str, Any], run_id: str, runs: dict[str, str]) -> dict[str, dict[str, float]]:
    """run id → {MLflow name: value} of a report's finite numbers (`step` and the clock readings `*_at` aside): a
    metric named for a direction (`nll_src2tgt`, `grad_norm_tgt2src`) goes to that direction's run in `runs`, every
    other one (the pair's total loss, lr, tokens/s, the mean BLEU) to `run_id`."""
    routed: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        if key == "step" or key.endswith("_at") or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
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


def data_group() -> Any:
    """A gloo process group of its own for the batches' agreement (`_epoch`): the harness builds batches ahead
    on a thread, whose collectives must not interleave with the training thread's (DDP's gradients, the
    reports) on one group, where the ranks could enter them in different orders. None for a single worker."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo") if distributed() else None


def read_shard(path: Path, rank: int, world_size: int, model: Optional[torch.nn.Module] = None,
               references: bool = False) -> tuple[ExampleTable, int]:
    """Rank `rank`'s examples of the training split at `path` (`parquet.read_shard`): (src, tgt), or with KD
    columns (src, tgt, kd_tgt, kd_src); with `references` (KD only) each KD row is followed by the references
    themselves as a row of their own, (src, tgt, tgt, src); with `model`, less those it cannot read
    (`length_limits`). Returns them and how many were left out."""
    files = sorted(Path(path).glob("part-*.parquet"))
    if not files:
        raise StageError(f"train: no part-*.parquet files in {path}")
    columns = [c for c in EXAMPLE_COLUMNS if c in pq.read_schema(files[0]).names]
    table = parquet.read_shard(path, rank, world_size, columns)
    if references:
        if "kd_tgt_ids" not in columns:
            raise StageError(f"train: distill.references needs distilled pairs, and {path} has no kd_tgt_ids column")
        given = table.set_column(columns.index("kd_tgt_ids"), "kd_tgt_ids", table.column("tgt_ids")) \
            .set_column(columns.index("kd_src_ids"), "kd_src_ids", table.column("src_ids"))
        table = pa.concat_tables([table, given])
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
    shard is trained on in every epoch; cutting every rank to the smallest count (as this loop once did) left part of
    the larger shards out of each epoch."""
    batches = epoch_batches(examples, train.max_tokens, train.seed, epoch, rank, train.batch_tokens)
    most = int(all_reduce(len(batches), "max", group))
    return EpochBatches(batches.examples, [batches.order[i % len(batches)] for i in range(most)]) if batches else batches
