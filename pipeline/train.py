"""Train stage: the duplex model on Ray Train (TorchTrainer, DDP), both directions in every update.

`run` checks that the requested resources exist, fits a `TorchTrainer` over the training split (the
distill stage's KD pairs with `distill.enabled`, else the tokenized references) and publishes the average of
the best `train.average_best` checkpoints (by validation BLEU, the mean of both directions) as the stage's
`model/` directory, with `history.json`, `report.json` and `training.png`. The Ray Train driver and worker
code live in pipeline/raytrain.py, the training loop itself in pipeline/harness.py (the same one trains the
teachers, pipeline/teacher.py, and the tune stage's trials).
"""
from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline import distill, ingest, spm, tokenize
from pipeline.config import PipelineConfig
from pipeline.raytrain import (HISTORY_FILE, MODEL_DIR, NOT_HASHED, check_resources, fit_and_average, make_trainer,
                               run_report, storage_path)
from pipeline.stage import require_done, run_stage, stage_dir, write_json
from pipeline.tracking import plot_history
from reder import REDER, ModelConfig
from reder.checkpoint import save_model_dir

log = logging.getLogger(__name__)

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
