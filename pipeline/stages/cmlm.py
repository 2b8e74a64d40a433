"""CMLM stage: one conditional masked language model per direction (reder/cmlm.py), trained on Ray Train.

The CMLMs are a second non-autoregressive baseline (mask-predict with T iterations and l length candidates) and
the refiner of REDER's output (REDER's greedy translation, then K mask-predict iterations), both decoders of the
evaluate stage (`evaluate.cmlm_iterations`, `evaluate.refine_steps`): the stage runs when one of them is set, or
when named (`--stages cmlm`). Both directions are one Ray Train run of the training core with a cmlm task
(a `PairObjective` of two `CmlmObjective`s, reder/objectives/directional.py), like the teachers (`teacher.train_pair`), on
REDER's training split: the distill stage's KD pairs with `distill.enabled` (src2tgt learns x → teacher(x),
tgt2src y → teacher(y)), else the references; validated by mask-predict BLEU on the validation split. Sizes and budget come from the `cmlm`
section (`cmlm.model`, `cmlm.train`); the vocabulary is the run's joint SentencePiece model.

Output `<workdir>/cmlm-<hash>/`: `cmlms.json` (direction → model directory), per direction `<direction>/model/`
(a model directory of architecture cmlm: `python -m reder.translate --checkpoint` reads it, and
`--refine-model` takes it), and the run's `history.json`, `training.png`, `report.json`.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.stage import StageRun
from pipeline.stages.teacher import model_dirs as _model_dirs
from pipeline.stages.teacher import train_pair
from reder.config import CmlmConfig

CMLMS_FILE = "cmlms.json"


def model_dirs(out: Path) -> dict[str, Path]:
    """direction → CMLM model directory, from a finished cmlm stage's cmlms.json."""
    return _model_dirs(out, CMLMS_FILE)


def build(run: StageRun, tmp: Path) -> dict[str, Any]:
    """Train both CMLMs on input `data`'s train split (distill's or tokenize's), validated on `tokenize`'s valid
    split against `ingest`'s text."""
    from reder.cmlm import CMLM  # here: a driver that trains nothing loads no torch

    return train_pair(run, run.inputs["data"] / "train", run.inputs["tokenize"], tmp, "cmlm",
                               lambda: CMLM(CmlmConfig.from_dict(asdict(run.cfg.cmlm.model))), CMLMS_FILE)
