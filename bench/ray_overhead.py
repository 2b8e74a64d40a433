"""Ray's overhead on the train stage: the same training budget through the training core alone.

    python -m bench.ray_overhead --workdir W --config C [key=value ...] [--out ray_overhead.json]

After `run_pipeline.py --config C [key=value ...] workdir=W` has finished its train stage, this trains the same
model (the `model`, `loss` and `train` sections of the same config and overrides) on the same training split
(the stage's manifest names its inputs), in this process, on this machine's device, with pipeline/training/harness.py's
Harness: the same updates, the same validation (trainloop.Validator with `evaluate.blank_penalties`, every
`train.validate_every` updates) and the same checkpoint files written at each validation (trainloop's checkpoint
writer, into its temporary directory, then removed) — what the stage's one worker does, without Ray Train's
controller and worker group, the report round trips, storage copies and MLflow logging.

Prints and writes JSON: the stage's wall time (its manifest's `seconds`: start to published model, averaging
included) and its fit's (the driver's), the harness's (model built, data read, fit), both updates/s over the
fit, and the overhead `stage_seconds / harness_seconds - 1` (the target: at most 10 %). A stage
of several workers (`stage_workers`) is compared with one process all the same: then it is not Ray's cost alone.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from pipeline.config import load_config
from pipeline.stage import MANIFEST, SUCCESS
from pipeline.stages import spm
from pipeline.training.harness import Harness
from pipeline.training.trainloop import Validator, _save, build_task, read_shard


def _finished(workdir: Path, stage: str) -> Path:
    """The one finished output of `stage` in `workdir` (the newest when several configs ran there)."""
    done = sorted((p for p in workdir.glob(f"{stage}-*") if (p / SUCCESS).exists()), key=lambda p: p.stat().st_mtime)
    if not done:
        raise SystemExit(f"{workdir}: no finished {stage} stage (run the pipeline there first)")
    return done[-1]


def _mean(values) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return round(sum(kept) / len(kept), 1) if kept else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: print only)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    stage = _finished(args.workdir, "train")
    manifest = json.loads((stage / MANIFEST).read_text(encoding="utf-8"))
    inputs = {name: Path(path) for name, path in manifest["inputs"].items()}
    history = json.loads((stage / "history.json").read_text(encoding="utf-8"))
    device = "cuda" if cfg.train.use_gpu and torch.cuda.is_available() else "cpu"

    started = time.perf_counter()
    torch.manual_seed(cfg.train.seed)
    model, objective, directions = build_task({"task": {"kind": "reder"}, "model": asdict(cfg.model),
                                               "loss": asdict(cfg.loss)})
    model.to(device)
    validate = Validator({"ids": str(inputs["tokenize"] / "valid"), "text": str(inputs["ingest"] / "valid")},
                         (inputs["spm"] / spm.MODEL_FILE).read_bytes(), cfg.train.valid_max_sentences, directions,
                         tuple(cfg.evaluate.blank_penalties))

    def report(metrics: dict, checkpoint: dict | None) -> None:
        if checkpoint is not None:  # the worker's checkpoint files, written and dropped (Ray copies them away)
            shutil.rmtree(_save(checkpoint), ignore_errors=True)

    harness = Harness(model, objective, cfg.train, device, validate=validate, on_report=report)
    examples, _ = read_shard(inputs["data"] / "train", 0, 1)  # as the stage's one worker reads it
    fitted = harness.fit_examples(examples)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    steps = fitted["steps"]
    stage_steps = max(entry["step"] for entry in history)
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "workdir": str(args.workdir), "train_stage": str(stage), "steps": steps, "stage_steps": stage_steps,
        "stage_workers": len(json.loads((stage / "report.json").read_text(encoding="utf-8"))["workers"]),
        "stage_seconds": manifest["seconds"],
        "harness_seconds": round(seconds, 2), "harness_fit_seconds": fitted["seconds"],
        "harness_validation_seconds": round(harness.validation_seconds, 2),
        "harness_updates_per_s": round(steps / max(fitted["seconds"], 1e-9), 2),
        "overhead": round(manifest["seconds"] / round(seconds, 2) - 1.0, 4),
        # Training throughput alone (validation and checkpoints excluded: the harness's windows), mean over reports.
        "stage_tokens_per_s": _mean(h.get("tokens_per_s") for h in history),
        "harness_tokens_per_s": _mean(h.get("tokens_per_s") for h in harness.history),
        "harness_valid_bleu": [{"step": h["step"], "valid_bleu": h.get("valid_bleu")} for h in harness.history
                               if "valid_bleu" in h],
        "stage_valid_bleu": [{"step": h["step"], "valid_bleu": h.get("valid_bleu")} for h in history
                             if "valid_bleu" in h],
    }
    result["target_overhead_le_10pct"] = result["overhead"] <= 0.10
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
