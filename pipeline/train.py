"""Train stage: the duplex model on Ray Train (TorchTrainer, DDP), both directions in every update.

Driver side (`run`): checks that the requested resources exist (failing fast instead of letting Ray Train
wait forever), builds a `TorchTrainer` over the tokenized training split (a Ray Data dataset, split
between the workers), fits it, then averages the best `train.average_best` checkpoints (by validation BLEU,
the mean of both directions) into the stage's `model/` directory.

Worker side (`train_loop`): token-bucketed batches from the worker's shard, the joint objective of both
directions (one forward/backward through `DuplexLoss`, which DDP wraps), gradient accumulation with
`no_sync`, AdamW(β=(0.9, 0.98)) with inverse-sqrt warm-up, gradient clipping, bf16 autocast on GPU. Every
`log_every` steps all loss terms, lr, tokens/s and the gradient norm are reported (`ray.train.report`) and
rank 0 logs them to MLflow; every `validate_every` steps rank 0 decodes the validation split greedily in
both directions, scores it with sacreBLEU and attaches a checkpoint. Ray keeps the best
`keep_checkpoints` by `valid_bleu` plus the latest; a run started again with the same config (same Ray
storage path and run name), or a worker group restarted after a failure (`max_failures`), resumes from the
latest checkpoint: same step, same position in the epoch.

With sequence-level knowledge distillation (`distill.enabled`, pipeline/distill.py) the training split is
the distill stage's: every update trains src2tgt on (x, teacher(x)) and tgt2src on (teacher(y), y), both
in one forward/backward (`DuplexLoss`'s tgt2src_batch). The same loop trains the autoregressive teachers (pipeline/teacher.py):
the loop's `task` says which model, objective and validation directions a run has.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
import math
import random
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, Optional

import pyarrow.parquet as pq
import torch

from pipeline import distill, ingest, spm, tokenize
from pipeline.config import PipelineConfig, TrainConfig
from pipeline.stage import StageError, require_done, run_stage, stage_dir, write_json
from pipeline.tracking import plot_history
from reder import DIRECTIONS, EOS_ID, DuplexLoss, LossConfig, ModelConfig, REDER, TransformerConfig
from reder.autoregressive import Transformer
from reder.checkpoint import average_state_dicts, save_model_dir
from reder.ctc import pad_batch
from reder.translate import translate_ids

log = logging.getLogger(__name__)

MODEL_DIR = "model"
HISTORY_FILE = "history.json"
# Keys of the train section that change neither the data order nor the optimisation.
NOT_HASHED = ("log_every", "max_failures", "storage_path", "fail_at_step", "start_timeout_s", "valid_max_sentences")


def output_dir(cfg: PipelineConfig, workdir: Path) -> Path:
    section = {k: v for k, v in asdict(cfg.train).items() if k not in NOT_HASHED}
    return stage_dir(workdir, "train", {"model": asdict(cfg.model), "loss": asdict(cfg.loss), "train": section,
                                        "data": training_data(cfg, workdir).parent.name})


def training_data(cfg: PipelineConfig, workdir: Path) -> Path:
    """REDER's training split: the distill stage's (KD pairs) with distill.enabled, else tokenize's."""
    data = distill.output_dir(cfg, workdir) if cfg.distill.enabled else tokenize.output_dir(cfg, workdir)
    return data / "train"


def run(cfg: PipelineConfig, workdir: Path, force: bool = False, tracker: Any = None) -> Path:
    """Train (or resume), then publish the averaged model; `tracker` gets the MLflow run for the workers."""
    workdir = Path(workdir).resolve()
    data = require_done(tokenize.output_dir(cfg, workdir), "tokenize")
    train_data = require_done(training_data(cfg, workdir).parent, "distill" if cfg.distill.enabled else "tokenize") / "train"
    corpus = require_done(ingest.output_dir(cfg, workdir), "ingest")
    spm_dir = require_done(spm.output_dir(cfg, workdir), "spm")
    out = output_dir(cfg, workdir)
    config = {"model": asdict(cfg.model), "loss": asdict(cfg.loss), "train": asdict(cfg.train)}
    return run_stage("train", out, lambda tmp: _build(cfg, workdir, out.name, train_data, data, corpus, spm_dir, tmp, tracker),
                     config=config, inputs={"train_data": str(train_data), "tokenize": str(data), "ingest": str(corpus),
                                            "spm": str(spm_dir)},
                     force=force)


def check_resources(train: Any, timeout_s: float) -> None:
    """Fail fast, with the numbers, when the cluster cannot hold the worker group (Ray Train would retry
    forever). Waits up to `timeout_s` for an autoscaling cluster to add the nodes."""
    import ray

    need = {"CPU": train.num_workers * train.cpus_per_worker}
    if train.use_gpu:
        need["GPU"] = train.num_workers * train.gpus_per_worker
    deadline = time.monotonic() + timeout_s
    while True:
        have = ray.cluster_resources()
        short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if have.get(k, 0.0) < v}
        if not short:
            return
        if time.monotonic() >= deadline:
            what = ", ".join(f"{k}: need {n:g}, cluster has {h:g}" for k, (n, h) in short.items())
            raise StageError(f"train: the cluster cannot hold {train.num_workers} worker(s) ({what}); lower "
                             f"train.num_workers / train.cpus_per_worker, or set train.use_gpu=false, "
                             f"or add nodes")
        time.sleep(1.0)


def training_dataset(path: Path) -> Any:
    """The tokenized training split as a Ray Data dataset, read and materialized in the object store
    before the worker group starts. Streamed lazily instead, its read tasks wait for CPUs that the
    workers hold: on a 2-CPU machine with 2 workers the run hangs without an error (RAY_NOTES.md)."""
    import ray

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    return ray.data.read_parquet(str(path)).materialize()


def storage_path(train: TrainConfig, workdir: Path) -> Path:
    """Ray Train's storage: train.storage_path (shared storage on a cluster), else <workdir>/ray_results."""
    return Path(train.storage_path).expanduser().resolve() if train.storage_path else Path(workdir) / "ray_results"


def make_trainer(cfg: PipelineConfig, name: str, storage: Path, train_data: Path, data: Path, corpus: Path,
                 spm_dir: Path, mlflow_target: dict[str, str] | None, callbacks: tuple = (),
                 task: dict[str, str] | None = None) -> Any:
    """The TorchTrainer of one training run (run `name` under `storage`; a run with the same pair
    resumes from its latest checkpoint) on the `train_data` split, validated on `data`/valid.
    `mlflow_target` receives rank 0's per-step metrics. `task` is REDER's (default) or
    {"kind": "teacher", "direction": d}: the teacher of one direction, with the teacher section's config."""
    import ray.train
    from ray.train.torch import TorchTrainer

    task = task or {"kind": "reder"}
    teacher = task["kind"] == "teacher"
    train = cfg.teacher.train if teacher else cfg.train
    loop_config = {
        "task": task, "model": asdict(cfg.teacher.model if teacher else cfg.model), "loss": asdict(cfg.loss),
        "train": asdict(train), "spm_proto": (spm_dir / spm.MODEL_FILE).read_bytes(),
        "valid": {"ids": str(data / "valid"), "text": str(corpus / "valid")},
        "mlflow": mlflow_target,
    }
    resources = {"CPU": train.cpus_per_worker, **({"GPU": train.gpus_per_worker} if train.use_gpu else {})}
    return TorchTrainer(
        train_loop, train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(num_workers=train.num_workers, use_gpu=train.use_gpu,
                                               resources_per_worker=resources,
                                               placement_strategy=train.placement_strategy),
        run_config=ray.train.RunConfig(
            name=name, storage_path=str(storage), callbacks=list(callbacks),
            failure_config=ray.train.FailureConfig(max_failures=train.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=train.keep_checkpoints,
                                                         checkpoint_score_attribute="valid_bleu",
                                                         checkpoint_score_order="max")),
        datasets={"train": training_dataset(train_data)})


def fit_and_average(trainer: Any, run_path: Path, average_best: int, model: torch.nn.Module) -> dict[str, Any]:
    """Fit, then load into `model` the average of the best `average_best` checkpoints by validation BLEU.
    Returns {"history": the latest checkpoint's history, "averaged": [(step, valid_bleu)], "fit_seconds"}."""
    started = time.time()
    try:
        result = trainer.fit()
    except Exception as error:  # TrainingFailedError wraps the worker's exception
        raise StageError(f"train: Ray Train failed ({type(error).__name__}): {error}") from error
    scored = [(c, m) for c, m in result.best_checkpoints if "valid_bleu" in m]
    if not scored:
        raise StageError(f"train: the run under {run_path} produced no validated checkpoint")
    best = sorted(scored, key=lambda cm: (-cm[1]["valid_bleu"], -cm[1]["step"]))[:average_best]
    states = []
    for checkpoint, _ in best:
        with checkpoint.as_directory() as directory:
            states.append(torch.load(Path(directory) / "model.pt", map_location="cpu", weights_only=True))
    with result.checkpoint.as_directory() as directory:  # the latest: the whole history
        history = json.loads((Path(directory) / HISTORY_FILE).read_text(encoding="utf-8"))
    model.load_state_dict(average_state_dicts(states))
    return {"history": history, "averaged": [{"step": m["step"], "valid_bleu": m["valid_bleu"]} for _, m in best],
            "fit_seconds": round(time.time() - started, 1)}


def run_report(fitted: dict[str, Any], run_path: Path) -> dict[str, Any]:
    """report.json of a finished run: steps, averaged checkpoints, last validation, restarts."""
    history = fitted["history"]
    last = history[-1]
    return {"steps": last["step"], "averaged_checkpoints": fitted["averaged"], "ray_run": str(run_path),
            "fit_seconds": fitted["fit_seconds"],
            "last_valid": {k: v for k, v in last.items() if k.startswith(("bleu_", "valid_"))},
            "restarts": sum(1 for h in history if h.get("resumed_from"))}


def _build(cfg: PipelineConfig, workdir: Path, name: str, train_data: Path, data: Path, corpus: Path, spm_dir: Path,
           tmp: Path, tracker: Any) -> dict[str, Any]:
    from cluster.connect import ensure_ray

    ensure_ray(cfg.ray)
    check_resources(cfg.train, cfg.train.start_timeout_s)
    storage = storage_path(cfg.train, workdir)
    trainer = make_trainer(cfg, name, storage, train_data, data, corpus, spm_dir,
                           tracker.worker_target() if tracker is not None else None)
    model = REDER(ModelConfig.from_dict(asdict(cfg.model)))
    fitted = fit_and_average(trainer, storage / name, cfg.train.average_best, model)
    save_model_dir(tmp / MODEL_DIR, model, spm_dir / spm.MODEL_FILE, cfg.data.src_lang, cfg.data.tgt_lang,
                   extra={"averaged_checkpoints": fitted["averaged"],
                          "distilled": cfg.distill.enabled})
    write_json(tmp / HISTORY_FILE, fitted["history"])
    report = run_report(fitted, storage / name)
    write_json(tmp / "report.json", report)
    plot_history(fitted["history"], tmp / "training.png")
    return {"steps": report["steps"], "best_valid_bleu": fitted["averaged"][0]["valid_bleu"], "restarts": report["restarts"]}


# ----------------------------------------------------------------------------------------------------------
# Worker side


def inverse_sqrt(step: int, lr: float, warmup: int, init_lr: float) -> float:
    """fairseq's inverse_sqrt: linear warm-up from init_lr to lr over `warmup` steps, then lr·√(warmup/step)."""
    step = max(step, 1)
    if warmup > 0 and step < warmup:
        return init_lr + step * (lr - init_lr) / warmup
    return lr * math.sqrt(max(warmup, 1) / step)


def token_batches(src_lengths: list[int], tgt_lengths: list[int], max_tokens: int, seed: int) -> list[list[int]]:
    """fairseq-style buckets: indices sorted by length (ties in random order), cut so that
    sentences × (longest source + longest target, EOS included) ≤ max_tokens, batches shuffled.
    A pair longer than max_tokens on its own gets a batch of one."""
    rng = random.Random(seed)
    order = list(range(len(src_lengths)))
    rng.shuffle(order)
    order.sort(key=lambda i: (tgt_lengths[i], src_lengths[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    longest_src = longest_tgt = 0
    for index in order:
        s, t = src_lengths[index] + 1, tgt_lengths[index] + 1
        if current and (len(current) + 1) * (max(longest_src, s) + max(longest_tgt, t)) > max_tokens:
            batches.append(current)
            current, longest_src, longest_tgt = [], 0, 0
        current.append(index)
        longest_src, longest_tgt = max(longest_src, s), max(longest_tgt, t)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def _all_reduce(value: float, op: str) -> float:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op={"min": dist.ReduceOp.MIN, "sum": dist.ReduceOp.SUM}[op])
    return float(tensor.item())


KD_COLUMNS = ("kd_tgt_ids", "kd_src_ids")


def _epoch(shard: Any, max_tokens: int, seed: int) -> tuple[list[tuple[list[int], ...]], list[list[int]]]:
    """This worker's examples for one epoch and their batches, cut to the same count on every rank (DDP
    needs the same number of updates everywhere). An example is (src, tgt), or with KD columns
    (src, tgt, kd_tgt, kd_src); a KD example is bucketed by its longer variant of each side."""
    examples: list[tuple[list[int], ...]] = []
    for batch in shard.iter_batches(batch_size=8192, batch_format="pyarrow"):
        columns = ["src_ids", "tgt_ids"] + [c for c in KD_COLUMNS if c in batch.column_names]
        examples.extend(zip(*(batch[c].to_pylist() for c in columns)))
    src_lengths = [max(len(e[0]), len(e[3])) if len(e) == 4 else len(e[0]) for e in examples]
    tgt_lengths = [max(len(e[1]), len(e[2])) if len(e) == 4 else len(e[1]) for e in examples]
    batches = token_batches(src_lengths, tgt_lengths, max_tokens, seed)
    return examples, batches[: int(_all_reduce(len(batches), "min"))]


def _stream(shard: Any, max_tokens: int, seed: int, rank: int, epoch: int, skip: int) -> Iterator[tuple[int, int, list]]:
    """Endless (epoch, index-in-epoch, batch of examples), starting at `skip` batches into `epoch`."""
    while True:
        examples, batches = _epoch(shard, max_tokens, seed * 100_003 + epoch * 1_009 + rank)
        if not batches:
            raise RuntimeError("train: a worker's shard yields no batch; use fewer workers or more data")
        for index in range(skip, len(batches)):
            yield epoch, index, [examples[i] for i in batches[index]]
        epoch, skip = epoch + 1, 0


def _tensors(pairs: list, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    src, src_lengths = pad_batch([s + [EOS_ID] for s, _ in pairs], device)
    tgt, tgt_lengths = pad_batch([t + [EOS_ID] for _, t in pairs], device)
    return src, src_lengths, tgt, tgt_lengths


def passes(examples: list[tuple[list[int], ...]], device: torch.device) -> tuple[tuple, Optional[tuple]]:
    """The tensors of one micro-batch: (src, src_lengths, tgt, tgt_lengths) for both directions, or with KD
    examples src2tgt's (x, teacher(x)) and tgt2src's own (teacher(y), y) batch (DuplexLoss.tgt2src_batch)."""
    if len(examples[0]) == 2:
        return _tensors(examples, device), None
    forward = _tensors([(src, kd_tgt) for src, _, kd_tgt, _ in examples], device)
    return forward, _tensors([(kd_src, tgt) for _, tgt, _, kd_src in examples], device)


class TeacherObjective(torch.nn.Module):
    """One direction's teacher as a DDP-wrappable objective with REDER's call signature: the batch's
    (src, tgt) pairs are read in the teacher's direction; terms are named by direction."""

    def __init__(self, model: Transformer, direction: str) -> None:
        super().__init__()
        self.model, self.direction = model, direction

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt: torch.Tensor, tgt_lengths: torch.Tensor,
                step: int, tgt2src_batch: None = None) -> dict[str, torch.Tensor]:
        if self.direction == "tgt2src":
            src, src_lengths, tgt, tgt_lengths = tgt, tgt_lengths, src, src_lengths
        terms = self.model.loss(src, src_lengths, tgt, tgt_lengths)
        return {f"nll_{self.direction}": terms["nll"], "total": terms["total"]}


def build_task(config: dict[str, Any]) -> tuple[torch.nn.Module, torch.nn.Module, tuple[str, ...]]:
    """(model, objective, validation directions) of a loop config's task (REDER or one teacher)."""
    task = config["task"]
    if task["kind"] == "teacher":
        model = Transformer(TransformerConfig.from_dict(config["model"]))
        return model, TeacherObjective(model, task["direction"]), (task["direction"],)
    model = REDER(ModelConfig.from_dict(config["model"]), LossConfig.from_dict(config["loss"]))
    return model, DuplexLoss(model), DIRECTIONS


class Validator:
    """Greedy decoding of the validation split in `directions`, scored with sacreBLEU (rank 0); for a
    teacher also its validation loss (mean token NLL, `valid_nll_<direction>`)."""

    def __init__(self, paths: dict[str, str], spm_proto: bytes, max_sentences: int,
                 directions: tuple[str, ...] = DIRECTIONS) -> None:
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

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        from pipeline.metrics import corpus_scores

        was_training = model.training
        model.eval()
        scores = {}
        try:
            for direction in self.directions:
                hypotheses = [self.sp.decode(h) for h in translate_ids(model, self.inputs[direction], direction)]
                scores[f"bleu_{direction}"] = corpus_scores(hypotheses, self.references[direction])["bleu"]
                if isinstance(model, Transformer):
                    scores[f"valid_nll_{direction}"] = self._nll(model, direction)
        finally:
            model.train(was_training)
        scores["valid_bleu"] = sum(scores[f"bleu_{d}"] for d in self.directions) / len(self.directions)
        return scores

    @torch.no_grad()
    def _nll(self, model: Transformer, direction: str, batch_size: int = 64) -> float:
        """Token-weighted mean NLL of the references under the teacher (teacher forcing)."""
        back = "tgt2src" if direction == "src2tgt" else "src2tgt"
        device = next(model.parameters()).device
        total = tokens = 0.0
        for start in range(0, len(self.inputs[direction]), batch_size):
            src, src_lengths = pad_batch(self.inputs[direction][start : start + batch_size], device)
            tgt, tgt_lengths = pad_batch(self.inputs[back][start : start + batch_size], device)
            count = float(tgt_lengths.sum())
            total += float(model.loss(src, src_lengths, tgt, tgt_lengths)["nll"]) * count
            tokens += count
        return total / max(tokens, 1.0)


def train_loop(config: dict[str, Any]) -> None:
    """The per-worker training loop (see the module doc)."""
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    rank = context.get_world_rank()
    tc = config["train"]
    torch.manual_seed(tc["seed"])
    device = ray.train.torch.get_device()
    model, objective, directions = build_task(config)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc["lr"], betas=tuple(tc["adam_betas"]), eps=tc["adam_eps"],
                                  weight_decay=tc["weight_decay"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: inverse_sqrt(step, tc["lr"], tc["warmup_steps"], tc["warmup_init_lr"]) / tc["lr"])
    step, epoch, skip, history, resumed_from = 0, 0, 0, [], None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            model.load_state_dict(torch.load(Path(directory) / "model.pt", map_location=device, weights_only=True))
            state = torch.load(Path(directory) / "train_state.pt", map_location=device, weights_only=False)
            history = json.loads((Path(directory) / HISTORY_FILE).read_text(encoding="utf-8"))
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, epoch, skip, resumed_from = state["step"], state["epoch"], state["next_batch"], state["step"]
        history.append({"step": step, "resumed_from": step})
    objective = ray.train.torch.prepare_model(objective)
    use_bf16 = tc["bf16"] and device.type == "cuda"
    validator = Validator(config["valid"], config["spm_proto"], tc["valid_max_sentences"], directions) if rank == 0 else None
    mlflow = _MlflowLogger(config["mlflow"]) if rank == 0 and config["mlflow"] else None
    if mlflow is not None and resumed_from is not None:
        mlflow.log({"resumed_from_step": resumed_from}, step)  # one point per restart of the worker group
    stream = _stream(ray.train.get_dataset_shard("train"), tc["max_tokens"], tc["seed"], rank, epoch, skip)
    sums: dict[str, float] = {}
    tokens, window_start = 0, time.perf_counter()
    while step < tc["max_steps"]:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        for micro in range(tc["update_freq"]):
            epoch, index, examples = next(stream)
            batch, reverse = passes(examples, device)
            sync = micro == tc["update_freq"] - 1 or not hasattr(objective, "no_sync")
            with (objective.no_sync() if not sync else contextlib.nullcontext()), \
                 torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                terms = objective(*batch, step, tgt2src_batch=reverse)
                (terms["total"] / tc["update_freq"]).backward()
            for name, value in terms.items():
                sums[name] = sums.get(name, 0.0) + float(value.detach()) / tc["update_freq"]
            tokens += sum(int(b[1].sum() + b[3].sum()) for b in (batch, reverse) if b is not None)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc["clip_norm"] if tc["clip_norm"] > 0 else math.inf)
        optimizer.step()
        scheduler.step()
        step += 1
        sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(norm)
        sums["_steps"] = sums.get("_steps", 0.0) + 1
        validate = step % tc["validate_every"] == 0 or step == tc["max_steps"]
        if step % tc["log_every"] == 0 or validate:
            seconds = time.perf_counter() - window_start
            count = sums.pop("_steps")
            metrics = {f"train_{k}" if k != "grad_norm" else k: v / count for k, v in sums.items()}
            metrics.update(step=step, epoch=epoch, lr=scheduler.get_last_lr()[0],
                           tokens_per_s=_all_reduce(tokens, "sum") / max(seconds, 1e-9))
            sums, tokens = {}, 0
            checkpoint_dir = None
            if validate:
                if validator is not None:
                    metrics.update(validator(model))
                    history.append(metrics)
                    checkpoint_dir = _save(model, optimizer, scheduler, step, epoch, index + 1, history)
                else:
                    metrics["valid_bleu"] = float("nan")  # only rank 0's metrics are kept by Ray
            elif rank == 0:
                history.append(metrics)
            if mlflow is not None:
                mlflow.log(metrics, step)
            checkpoint_obj = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
            ray.train.report(metrics, checkpoint=checkpoint_obj)
            if checkpoint_dir:
                shutil.rmtree(checkpoint_dir, ignore_errors=True)  # Ray has copied it to the run's storage
            window_start = time.perf_counter()
        if tc["fail_at_step"] and step == tc["fail_at_step"] and resumed_from is None \
                and rank == context.get_world_size() - 1:
            raise RuntimeError(f"fault drill: train.fail_at_step={step} (rank {rank})")


def _save(model: torch.nn.Module, optimizer: Any, scheduler: Any, step: int, epoch: int, next_batch: int, history: list) -> str:
    directory = tempfile.mkdtemp(prefix=f"reder-step{step}-")
    torch.save(model.state_dict(), Path(directory) / "model.pt")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step,
                "epoch": epoch, "next_batch": next_batch}, Path(directory) / "train_state.pt")
    (Path(directory) / HISTORY_FILE).write_text(json.dumps(history), encoding="utf-8")
    return directory


class _MlflowLogger:
    """Rank 0 logs per-step metrics into the stage's MLflow run (tracking URI and run id from the driver)."""

    def __init__(self, target: dict[str, str]) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=target["uri"])
        self.run_id = target["run_id"]

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = [Metric(k, float(v), now, step) for k, v in metrics.items()
                  if k not in ("step",) and isinstance(v, (int, float)) and math.isfinite(float(v))]
        self.client.log_batch(self.run_id, metrics=values)
