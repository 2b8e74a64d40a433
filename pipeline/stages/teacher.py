"""Teacher stage: one autoregressive Transformer per direction (reder.autoregressive), trained on Ray Train.

The teachers distill the training split for REDER (pipeline/stages/distill.py, sequence-level KD as in the paper)
and are the quality and latency baseline of the evaluate stage (and, optionally, rerank REDER's beam).
Both directions are one Ray Train run of REDER's training core (`raytrain.make_trainer` with a teacher task,
`train_pair`; pipeline/training/harness.py): one worker group start for both, every update training both teachers on the
same batch (src2tgt reads it forwards, tgt2src backwards), each clipped on its own; token-bucketed batches,
inverse-sqrt warm-up, label-smoothed cross-entropy, validation BLEU (greedy) and validation NLL per direction,
checkpoints by the mean validation BLEU, resume, averaging of the best `teacher.train.average_best`. Sizes and
budget come from the `teacher` section (`teacher.model`, `teacher.train`); the vocabulary is the run's joint
SentencePiece model.

With `teacher.src2tgt_checkpoint` and `teacher.tgt2src_checkpoint` set, nothing is trained: the two model
directories are checked (a transformer, the right direction, the run's vocabulary — size and the very same
spm.model) and used as they are.

Output `<workdir>/teacher-<hash>/`: `teachers.json` (direction → model directory), and for trained teachers
`<direction>/model/` (a model directory: `python -m reder.translate --checkpoint` reads it), and the run's
`history.json`, `training.png`, `report.json`. MLflow: a run per direction nested under the stage's run, with
that direction's per-step metrics (`train_nll_<direction>`, `grad_norm_<direction>`, `valid_bleu_<direction>`,
`valid_nll_<direction>`); the pair's own (total loss, lr, tokens/s, the mean `valid_bleu`) on the stage's run.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeline.config import PipelineConfig
from pipeline.stage import StageError, StageRun, write_json
from pipeline.stages import spm
from pipeline.tracking.plots import plot_history
from pipeline.tracking.store import STAGE_TAG, child_run, finish_child_run, run_name
from pipeline.training import raytrain, runfiles
from reder.config import DIRECTIONS, TransformerConfig

if TYPE_CHECKING:  # the models are imported where they are made: a driver that trains nothing loads no torch
    import torch

    from reder.autoregressive import Transformer

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
    from reder.autoregressive import Transformer

    data = run.inputs["data"]
    return train_pair(run, data / "train", data, tmp, "teacher", lambda: Transformer(
        TransformerConfig.from_dict(asdict(run.cfg.teacher.model))), TEACHERS_FILE)


def summary(output: Path, counts: dict[str, Any]) -> list[str]:
    """Per direction: the steps and best validation BLEU of its training, or that its checkpoint was given."""
    return [f"{direction}: " + (f"{counts[direction]['steps']} steps, best validation BLEU {counts[direction]['best_valid_bleu']:.2f}"
                                if "steps" in counts[direction] else "given checkpoint") for direction in DIRECTIONS]


def check_teacher(directory: Path, direction: str, cfg: PipelineConfig, spm_model: Path) -> Transformer:
    """Load a teacher model directory for `direction`, failing clearly on a missing or incompatible one
    (not a transformer, another direction, another vocabulary)."""
    from reder.checkpoint import SPM_FILE, load_teacher_dir

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


def train_pair(run: StageRun, train_data: Path, data: Path, tmp: Path, kind: str,
               make_model: Callable[[], torch.nn.Module], index_file: str) -> dict[str, Any]:
    """Both directions' models of the `kind` task (teacher, cmlm: trainloop.build_task, with the config section of
    that name) trained by one Ray Train run (named as the stage's directory: one worker group, one start) on
    `train_data`, validated on `data`/valid against input `ingest`'s text, checkpoints ranked by the mean of both
    directions' BLEU; each direction's averaged model saved as `<direction>/model/` in `tmp`, listed in
    `index_file` (direction → model directory), the run's history, training.png and report.json beside them.
    MLflow: one run per direction under the stage's (its direction-named metrics), the pair's own (total loss,
    lr, tokens/s, mean BLEU) on the stage's run."""
    from pipeline.training import trainloop
    from reder.checkpoint import save_model_dir

    cfg, name, tracker = run.cfg, run.out.name, run.tracker
    section = getattr(cfg, kind)
    raytrain.check_resources(section.train, section.train.start_timeout_s, f"{kind}.train")
    storage = raytrain.storage_path(section.train, run.workdir)
    raytrain.run_storage(storage, name, run.force)  # with --force, no resume of a finished run
    target = tracker.worker_target() if tracker is not None else None
    # A failure or interruption leaves the children open: the tracker closes them with the stage's run.
    children = {d: child_run(target, run_name(cfg.tracking, f"{name}-{d}"), {STAGE_TAG: f"{kind} {d}"})
                for d in DIRECTIONS}
    worker_target = {**target, "runs": {d: child["run_id"] for d, child in children.items()}} if target else None
    spm_dir = run.inputs["spm"]
    trainer = raytrain.make_trainer(cfg, name, storage, train_data, data, run.inputs["ingest"], spm_dir / spm.MODEL_FILE, worker_target,
                                    task={"kind": kind}, time_cap_s=run.time_cap_s)
    pair = trainloop.ModelPair({d: make_model() for d in DIRECTIONS})
    fitted = raytrain.fit_and_average(trainer, storage / name, section.train.average_best, pair, f"{kind}.train")
    if tracker is not None:
        tracker.log_checkpoints(fitted["kept"])
    report = raytrain.run_report(fitted, storage / name)
    best = fitted["averaged"][0]
    at_best = next(h for h in fitted["history"] if h["step"] == best["step"] and "valid_bleu" in h)
    counts = {}
    for direction in DIRECTIONS:
        save_model_dir(tmp / direction / runfiles.MODEL_DIR, pair[direction], spm_dir / spm.MODEL_FILE, cfg.data.src_lang,
                       cfg.data.tgt_lang, extra={"direction": direction, "averaged_checkpoints": fitted["averaged"]})
        # the direction's BLEU at the best checkpoint (ranked by both directions' mean)
        counts[direction] = {"steps": report["steps"], "best_valid_bleu": at_best[f"bleu_{direction}"],
                             "restarts": report["restarts"], **raytrain.budget_record(report, section.train)}
        finish_child_run(children[direction], counts[direction])
        log.info("%s %s: %d steps, validation BLEU %.2f at the best checkpoint (step %d)", kind, direction,
                 report["steps"], at_best[f"bleu_{direction}"], best["step"])
    write_json(tmp / runfiles.HISTORY_FILE, fitted["history"])
    plot_history(fitted["history"], tmp / "training.png")
    write_json(tmp / "report.json", report)
    write_json(tmp / index_file, {d: f"{d}/{runfiles.MODEL_DIR}" for d in DIRECTIONS})
    return counts
