"""Train stage: the duplex model on Ray Train (DDP for a group of workers), both directions in every update.

`build` checks that the requested resources exist, fits a Ray Train trainer over the training split (the
distill stage's KD pairs with `distill.enabled`, else the tokenized references) and publishes the average of
the best `train.average_best` checkpoints (by validation BLEU, the mean of both directions) as the stage's
`model/` directory, with `history.json`, `report.json` and `training.png`. A CTC model's blank penalty per
direction (`evaluate.blank_penalties`, the grid every validation tuned checkpoints by) is tuned once more on
the published weights, on the same validation sentences, and saved in the model directory's config.json. With
tracking, each checkpoint the run kept is an MLflow LoggedModel by reference (`Tracker.log_checkpoints`). The
Ray Train driver lives in pipeline/training/raytrain.py, its workers in pipeline/training/trainloop.py, the training loop itself in
pipeline/training/harness.py (the same one trains the teachers, pipeline/stages/teacher.py, and the tune stage's trials).
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.config import NO_BLANK_PENALTY, PipelineConfig
from pipeline.stages import spm
from pipeline.training.raytrain import (budget_record, check_resources, fit_and_average, make_trainer, run_report, run_storage,
                               storage_path)
from pipeline.stage import StageRun, write_json
from pipeline.tracking.plots import plot_history
from pipeline.training.runfiles import HISTORY_FILE, MODEL_DIR

if TYPE_CHECKING:  # the model is imported where it is made: a driver that trains nothing loads no torch
    from reder.model import REDER

log = logging.getLogger(__name__)

def summary(output: Path, counts: dict[str, Any]) -> list[str]:
    """Steps, best validation BLEU, and where the model directory is."""
    return [f"{counts['steps']} steps, best validation BLEU {counts['best_valid_bleu']:.2f}, model: {output / MODEL_DIR}"]


def build(run: StageRun, tmp: Path) -> dict[str, Any]:
    """Train (or resume) on input `data`'s train split (distill's or tokenize's), validated on `tokenize`'s
    valid split against `ingest`'s text, then publish the averaged model into `tmp`."""
    return _build(run.cfg, run.workdir, run.out.name, run.inputs["data"] / "train", run.inputs["tokenize"],
                  run.inputs["ingest"], run.inputs["spm"], tmp, run.tracker, run.force, run.time_cap_s)


def _build(cfg: PipelineConfig, workdir: Path, name: str, train_data: Path, data: Path, corpus: Path, spm_dir: Path,
           tmp: Path, tracker: Any, force: bool = False, time_cap_s: float = math.inf) -> dict[str, Any]:
    from reder.checkpoint import save_model_dir
    from reder.config import ModelConfig
    from reder.model import REDER

    check_resources(cfg.train, cfg.train.start_timeout_s)
    storage = storage_path(cfg.train, workdir)
    run_storage(storage, name, force)  # with --force, no resume of the finished run
    trainer = make_trainer(cfg, name, storage, train_data, data, corpus, spm_dir / spm.MODEL_FILE,
                           tracker.worker_target() if tracker is not None else None, time_cap_s=time_cap_s)
    model = REDER(ModelConfig.from_dict(asdict(cfg.model)))
    fitted = fit_and_average(trainer, storage / name, cfg.train.average_best, model)
    if tracker is not None:
        tracker.log_checkpoints(fitted["kept"])
    tuned = tune_blank_penalty(model, cfg, data, corpus, spm_dir)
    save_model_dir(tmp / MODEL_DIR, model, spm_dir / spm.MODEL_FILE, cfg.data.src_lang, cfg.data.tgt_lang,
                   extra={"averaged_checkpoints": fitted["averaged"],
                          "distilled": cfg.distill.enabled})
    write_json(tmp / HISTORY_FILE, fitted["history"])
    report = run_report(fitted, storage / name)
    if len(report["workers"]) > 1:
        log.info("train: %d workers: %s", len(report["workers"]), ", ".join(
            f"rank {w['rank']} on {w['node_ip']} ({w['hostname']})" for w in report["workers"]))
    write_json(tmp / "report.json", {**report, "published_valid": tuned})
    plot_history(fitted["history"], tmp / "training.png")
    return {"steps": report["steps"], "best_valid_bleu": fitted["averaged"][0]["valid_bleu"], "restarts": report["restarts"],
            **budget_record(report, cfg.train),
            **{key: value for key, value in tuned.items() if key.startswith("blank_penalty_")}}


def tune_blank_penalty(model: REDER, cfg: PipelineConfig, data: Path, corpus: Path, spm_dir: Path) -> dict[str, float]:
    """Set `model.blank_penalty` to each trained direction's best of `evaluate.blank_penalties` on the validation
    split (the train stage's Validator, its sentences), on the GPU where the driver has one (as evaluate decodes);
    returns that validation's scores ({} when there is nothing to tune: a DAG model, or the grid [0])."""
    if not model.head.emits_blank or cfg.evaluate.blank_penalties == NO_BLANK_PENALTY:
        return {}
    import torch

    from pipeline.training.trainloop import Validator

    validator = Validator({"ids": str(data / "valid"), "text": str(corpus / "valid")},
                          (spm_dir / spm.MODEL_FILE).read_bytes(), cfg.train.valid_max_sentences,
                          cfg.loss.directions, cfg.evaluate.blank_penalties)
    try:
        scores = validator(model.to("cuda" if torch.cuda.is_available() else "cpu"))
    finally:
        model.cpu()
    for direction in cfg.loss.directions:
        model.blank_penalty[direction] = scores[f"blank_penalty_{direction}"]
    log.info("train: blank penalty %s (validation greedy BLEU %s, without it %s)", model.blank_penalty,
             {d: round(scores[f"bleu_{d}"], 2) for d in cfg.loss.directions},
             {d: round(scores.get(f"bleu_{d}_unpenalised", math.nan), 2) for d in cfg.loss.directions})
    return scores
