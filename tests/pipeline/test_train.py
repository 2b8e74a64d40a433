"""The train stage through Ray Train (slow): an interrupted run resumes from its checkpoint."""
import json
import math
from pathlib import Path

import pytest

import run_pipeline
from pipeline.harness import inverse_sqrt

SMOKE = Path(run_pipeline.__file__).resolve().parent / "configs" / "smoke.yaml"


@pytest.mark.slow
def test_an_interrupted_run_continues_from_its_checkpoint(tmp_path, capsys, ray_session):
    """A run that dies after the step-10 checkpoint (no restarts allowed) publishes nothing; started
    again it resumes at step 10 with the optimizer state and reaches max_steps, not 10 + max_steps."""
    args = ["--config", str(SMOKE), f"workdir={tmp_path}", "train.num_workers=1", "train.max_steps=20",
            "loss.aux_start_step=15", "distill.enabled=false", "evaluate.teacher_baseline=false"]
    failing = args + ["train.fail_at_step=12", "train.max_failures=0", "--stages", "ingest,spm,tokenize,train"]
    assert run_pipeline.main(failing) == 2
    assert "fault drill: train.fail_at_step=12" in capsys.readouterr().err
    assert not list(tmp_path.glob("train-*"))  # nothing half-published

    assert run_pipeline.main(args + ["--stages", "train"]) == 0
    out = list(tmp_path.glob("train-*"))
    assert len(out) == 1  # fail_at_step and max_failures are not part of the stage's identity
    history = json.loads((out[0] / "history.json").read_text())
    resumed = [entry for entry in history if "resumed_from" in entry]
    assert resumed == [{"step": 10, "resumed_from": 10}]
    steps = [entry["step"] for entry in history]
    assert steps == sorted(steps) and steps[-1] == 20 and steps.count(10) == 2  # 10 logged, then resumed at 10
    report = json.loads((out[0] / "report.json").read_text())
    assert report["steps"] == 20 and report["restarts"] == 1
    after = history[history.index(resumed[0]) + 1]
    assert after["step"] == 15 and math.isfinite(after["train_total"])
    # the schedule went on from step 10 rather than restarting its warm-up
    assert after["lr"] == pytest.approx(inverse_sqrt(15, 0.002, 10, 1e-7))
