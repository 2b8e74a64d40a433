"""Teacher stage: one autoregressive Transformer per direction (reder.autoregressive), trained on Ray Train.

The teachers distill the training split for REDER (pipeline/distill.py, sequence-level KD as in the paper)
and are the quality and latency baseline of the evaluate stage (and, optionally, rerank REDER's beam).
Each direction is one Ray Train run of REDER's training core (`raytrain.make_trainer` with a teacher task;
pipeline/harness.py): token-bucketed batches, inverse-sqrt warm-up, label-smoothed cross-entropy,
validation BLEU (greedy) and validation NLL, checkpoints by validation BLEU, resume, averaging of the best
`teacher.train.average_best`. Sizes and budget come from the `teacher` section (`teacher.model`,
`teacher.train`); the vocabulary is the run's joint SentencePiece model.

With `teacher.src2tgt_checkpoint` and `teacher.tgt2src_checkpoint` set, nothing is trained: the two model
directories are checked (a transformer, the right direction, the run's vocabulary — size and the very same
spm.model) and used as they are.

Output `<workdir>/teacher-<hash>/`: `teachers.json` (direction → model directory), and for trained teachers
`<direction>/model/` (a model directory: `python -m reder.translate --checkpoint` reads it),
`<direction>/history.json`, `<direction>/training.png`, `report.json`. MLflow: a run per direction nested
under the stage's run, with the per-step training metrics, `valid_bleu` and `valid_nll_<direction>`.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from pipeline import raytrain, spm, tracking
from pipeline.config import PipelineConfig
from pipeline.stage import StageError, StageRun, write_json
from pipeline.tracking import child_run, finish_child_run, plot_history
from reder import DIRECTIONS, TransformerConfig
from reder.autoregressive import Transformer
from reder.checkpoint import SPM_FILE, load_teacher_dir, save_model_dir

log = logging.getLogger(__name__)

TEACHERS_FILE = "teachers.json"


def given_checkpoints(cfg: PipelineConfig) -> dict[str, Path]:
    """The user's teacher model directories (absolute), or {} when the stage trains its own."""
    if not cfg.teacher.src2tgt_checkpoint:
        return {}
    return {"src2tgt": Path(cfg.teacher.src2tgt_checkpoint).expanduser().resolve(),
            "tgt2src": Path(cfg.teacher.tgt2src_checkpoint).expanduser().resolve()}


def model_dirs(out: Path, index_file: str = TEACHERS_FILE) -> dict[str, Path]:
    """direction → model directory, from a finished teacher stage's teachers.json (or another per-direction
    stage's `index_file`)."""
    entries = json.loads((Path(out) / index_file).read_text(encoding="utf-8"))
    return {direction: (Path(out) / path).resolve() for direction, path in entries.items()}


def build(run: StageRun, tmp: Path) -> dict[str, Any]:
    """Train both teachers on input `data` (tokenize; validation text from `ingest`), or check the given ones."""
    given = given_checkpoints(run.cfg)
    if given:
        return _check_given(given, run.cfg, run.inputs["spm"], tmp)
    data = run.inputs["data"]
    return train_per_direction(run, data / "train", data, tmp, "teacher", lambda: Transformer(
        TransformerConfig.from_dict(asdict(run.cfg.teacher.model))), TEACHERS_FILE)


def check_teacher(directory: Path, direction: str, cfg: PipelineConfig, spm_model: Path) -> Transformer:
    """Load a teacher model directory for `direction`, failing clearly on a missing or incompatible one
    (not a transformer, another direction, another vocabulary)."""
    teacher = load_teacher_dir(directory, direction, cfg.model.vocab_size)
    if (Path(directory) / SPM_FILE).read_bytes() != Path(spm_model).read_bytes():
        raise StageError(f"teacher {direction}: vocabulary mismatch: {Path(directory) / SPM_FILE} is not this "
                         f"run's SentencePiece model ({spm_model}); a teacher must share REDER's joint vocabulary")
    return teacher


def _check_given(given: dict[str, Path], cfg: PipelineConfig, spm_dir: Path, tmp: Path) -> dict[str, Any]:
    counts = {}
    for direction, directory in given.items():
        try:
            teacher = check_teacher(directory, direction, cfg, spm_dir / spm.MODEL_FILE)
        except (FileNotFoundError, ValueError) as error:
            raise StageError(f"teacher.{direction}_checkpoint: {error}") from error
        counts[direction] = {"parameters": sum(p.numel() for p in teacher.parameters()), "trained": 0}
    write_json(tmp / TEACHERS_FILE, {d: str(p) for d, p in given.items()})
    return counts


def train_per_direction(run: StageRun, train_data: Path, data: Path, tmp: Path, kind: str,
                        make_model: Callable[[], torch.nn.Module], index_file: str) -> dict[str, Any]:
    """One Ray Train run per direction of the `kind` task (teacher, cmlm: raytrain.build_task, with the config
    section of that name) on `train_data`, validated on `data`/valid against input `ingest`'s text; each averaged
    model saved as `<direction>/model/` in `tmp`, listed in `index_file` (direction → model directory)."""
    cfg, name, tracker = run.cfg, run.out.name, run.tracker
    section = getattr(cfg, kind)
    raytrain.check_resources(section.train, section.train.start_timeout_s)
    storage = raytrain.storage_path(section.train, run.workdir)
    target = tracker.worker_target() if tracker is not None else None
    for direction in DIRECTIONS:  # with --force, no resume of the finished runs
        raytrain.run_storage(storage, f"{name}-{direction}", run.force)
    spm_dir = run.inputs["spm"]
    counts, reports = {}, {}
    for direction in DIRECTIONS:
        run_name = f"{name}-{direction}"
        child = child_run(target, tracking.run_name(cfg.tracking, run_name),
                          {tracking.STAGE_TAG: f"{kind} {direction}"})
        trainer = raytrain.make_trainer(cfg, run_name, storage, train_data, data, run.inputs["ingest"], spm_dir, child,
                                        task={"kind": kind, "direction": direction}, time_cap_s=run.time_cap_s)
        model = make_model()
        # A failure or interruption leaves `child` open: the tracker closes it with the stage's run.
        fitted = raytrain.fit_and_average(trainer, storage / run_name, section.train.average_best, model)
        save_model_dir(tmp / direction / raytrain.MODEL_DIR, model, spm_dir / spm.MODEL_FILE, cfg.data.src_lang,
                       cfg.data.tgt_lang, extra={"direction": direction, "averaged_checkpoints": fitted["averaged"]})
        write_json(tmp / direction / raytrain.HISTORY_FILE, fitted["history"])
        plot_history(fitted["history"], tmp / direction / "training.png")
        reports[direction] = raytrain.run_report(fitted, storage / run_name)
        best = fitted["averaged"][0]
        counts[direction] = {"steps": reports[direction]["steps"], "best_valid_bleu": best["valid_bleu"],
                             "restarts": reports[direction]["restarts"],
                             **raytrain.budget_record(reports[direction], section.train)}
        finish_child_run(child, counts[direction])
        log.info("%s %s: %d steps, best validation BLEU %.2f", kind, direction, counts[direction]["steps"],
                 best["valid_bleu"])
    write_json(tmp / "report.json", reports)
    write_json(tmp / index_file, {d: f"{d}/{raytrain.MODEL_DIR}" for d in DIRECTIONS})
    return counts
