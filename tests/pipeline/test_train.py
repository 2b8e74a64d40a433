"""The train stage's pieces: schedule, batching, resource check; resume through Ray Train (slow)."""
import json
import math
import random
from pathlib import Path

import pytest

import run_pipeline
from pipeline import train
from pipeline.config import TrainConfig
from pipeline.stage import StageError

SMOKE = Path(run_pipeline.__file__).resolve().parent / "configs" / "smoke.yaml"


def test_inverse_sqrt_warms_up_linearly_then_decays_as_fairseq():
    lr, warmup, init = 1e-3, 100, 1e-7
    assert train.inverse_sqrt(0, lr, warmup, init) == pytest.approx(init + (lr - init) / warmup)  # step 0 acts as 1
    assert train.inverse_sqrt(50, lr, warmup, init) == pytest.approx(init + 50 * (lr - init) / warmup)
    assert train.inverse_sqrt(100, lr, warmup, init) == pytest.approx(lr)
    assert train.inverse_sqrt(400, lr, warmup, init) == pytest.approx(lr / 2)  # lr * sqrt(100 / 400)
    assert train.inverse_sqrt(10_000, lr, 0, init) == pytest.approx(lr / 100)  # no warm-up: lr / sqrt(step)
    values = [train.inverse_sqrt(s, lr, warmup, init) for s in range(1, 300)]
    assert max(values) == pytest.approx(lr) and values.index(max(values)) == warmup - 1


def test_token_batches_cover_every_pair_once_within_the_budget():
    rng = random.Random(3)
    src = [rng.randint(1, 60) for _ in range(500)]
    tgt = [rng.randint(1, 60) for _ in range(500)]
    src[7], tgt[7] = 300, 280  # longer than the budget on its own: a batch of one
    batches = train.token_batches(src, tgt, max_tokens=400, seed=5)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for batch in batches:
        cost = len(batch) * (max(src[i] + 1 for i in batch) + max(tgt[i] + 1 for i in batch))
        assert cost <= 400 or len(batch) == 1
    assert [7] in batches
    assert train.token_batches(src, tgt, 400, seed=5) == batches  # deterministic
    assert train.token_batches(src, tgt, 400, seed=6) != batches  # the seed reshuffles
    sizes = sorted(len(b) for b in batches)
    assert sizes[-1] >= 3 and sum(sizes) / len(sizes) > 2  # buckets fill up: not one pair per batch


def test_an_unsatisfiable_request_fails_fast_with_the_numbers(ray_session):
    with pytest.raises(StageError, match=r"GPU: need 2, cluster has 0.*use_gpu=false"):
        train.check_resources(TrainConfig(num_workers=2, use_gpu=True), timeout_s=0.5)
    with pytest.raises(StageError, match=r"CPU: need 12, cluster has 2"):
        train.check_resources(TrainConfig(num_workers=3, cpus_per_worker=4), timeout_s=0.5)
    train.check_resources(TrainConfig(num_workers=2), timeout_s=0.5)  # fits: returns


@pytest.mark.slow
def test_an_interrupted_run_continues_from_its_checkpoint(tmp_path, capsys, ray_session):
    """A run that dies after the step-10 checkpoint (no restarts allowed) publishes nothing; started
    again it resumes at step 10 with the optimizer state and reaches max_steps, not 10 + max_steps."""
    args = ["--config", str(SMOKE), f"workdir={tmp_path}", "train.num_workers=1", "train.max_steps=20",
            "loss.aux_start_step=15"]
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
    assert after["lr"] == pytest.approx(train.inverse_sqrt(15, 0.002, 10, 1e-7))
