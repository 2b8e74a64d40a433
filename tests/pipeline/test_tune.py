"""Ray Tune sweeps: the space, trial configs, and (slow) real sweeps of the smoke config through Ray."""
import csv
import math
import random
from pathlib import Path

import pytest

import run_pipeline
from pipeline import tune
from pipeline.config import ConfigError, load_config

SMOKE = Path(run_pipeline.__file__).resolve().parent / "configs" / "smoke.yaml"


def test_the_space_is_checked_when_the_config_loads():
    with pytest.raises(ConfigError, match=r"tune.space.loss.lambda_cc: expected one of"):
        load_config(SMOKE, ["tune.space={loss.lambda_cc: {between: [0, 1]}}"])
    with pytest.raises(ConfigError, match=r"low must be > 0 \(use zero: p for 0\)"):
        load_config(SMOKE, ["tune.space={loss.lambda_cc: {loguniform: [0, 1]}}"])
    with pytest.raises(ConfigError, match="not a training key"):
        load_config(SMOKE, ["tune.space={data.max_chars: {choice: [10, 20]}}"])
    with pytest.raises(ConfigError, match=r"^tune\.space\.model: not a training key"):  # a section, not a key
        load_config(SMOKE, ["tune.space={model: {choice: [1]}}"])
    with pytest.raises(ConfigError, match="unknown key 'loss.lambda_xyz'"):
        load_config(SMOKE, ["tune.space={loss.lambda_xyz: {choice: [1]}}"])
    with pytest.raises(ConfigError, match="tokenize filtered"):
        load_config(SMOKE, ["tune.space={model.upsample_ratio: {choice: [1, 2]}}"])
    cfg = load_config(SMOKE, ["tune.space={model.upsample_ratio: {choice: [2, 3]}, loss.lambda_fba: "
                              "{loguniform: [0.01, 1.0], zero: 0.25}}"])
    assert set(cfg.tune.space) == {"model.upsample_ratio", "loss.lambda_fba"}


def test_trial_config_applies_dotted_values_and_validates():
    base = load_config(SMOKE)
    cfg = tune.trial_config(base, {"model.upsample_ratio": 3, "loss.lambda_cc": 0.5, "train.lr": 1e-3})
    assert (cfg.model.upsample_ratio, cfg.loss.lambda_cc, cfg.train.lr) == (3, 0.5, 1e-3)
    assert cfg.model.d_model == base.model.d_model and base.loss.lambda_cc == 0.1  # the base is untouched
    with pytest.raises(ConfigError, match=r"^loss\.lambda_fba: must be >= 0, got -1\.0$"):
        tune.trial_config(base, {"loss.lambda_fba": -1.0})


def test_log_uniform_with_zero_samples_zero_at_its_rate_and_log_uniformly_otherwise():
    random.seed(0)
    values = [tune._log_uniform_or_zero(0.01, 1.0, 0.25) for _ in range(20_000)]
    zeros = sum(v == 0.0 for v in values)
    assert abs(zeros / len(values) - 0.25) < 0.015
    rest = sorted(v for v in values if v)
    assert 0.01 <= rest[0] and rest[-1] <= 1.0
    assert abs(math.log10(rest[len(rest) // 2]) - (-1.0)) < 0.05  # median of log-uniform: geometric mean
    below = sum(v < 0.1 for v in rest) / len(rest)
    assert abs(below - 0.5) < 0.02  # half the mass in each decade


@pytest.mark.slow
def test_three_trial_sweep_tracks_every_trial_and_writes_a_trainable_best_yaml(tmp_path, capsys, ray_session):
    """One trial at a time, in grid order, with ASHA on a configured metric that separates the trials
    even on the tiny smoke data (validation BLEU there is noise around 0.3): the training CTC loss. The
    third trial (an lr that cannot learn in 20 steps) is worse than both others at the step-20 rung and
    is stopped there; the first always runs to the end."""
    args = ["tune", "--config", str(SMOKE), f"workdir={tmp_path}", "distill.enabled=false", "tracking.enabled=true",
            "train.num_workers=1",
            "tune.space={train.lr: {grid: [0.001, 0.002, 0.000001]}}", "tune.max_concurrent=1",
            "tune.grace_period=20", "tune.metric=train_ctc_src2tgt", "tune.mode=min"]
    assert run_pipeline.main(args) == 0
    out = capsys.readouterr().out
    assert "tune: 3 trials (0 failed, " in out
    tune_dir = next(tmp_path.glob("tune-*"))
    with open(tune_dir / "trials.csv", newline="") as handle:
        rows = {float(r["train.lr"]): r for r in csv.DictReader(handle)}
    assert set(rows) == {0.002, 0.001, 0.000001}
    assert rows[0.000001]["status"] == "stopped early" and 20 <= int(rows[0.000001]["steps"]) < 30
    assert rows[0.001]["status"] == "finished"
    best_row = min(rows.values(), key=lambda r: float(r["train_ctc_src2tgt"]))
    best = load_config(tune_dir / "best.yaml")
    assert best.train.lr == float(best_row["train.lr"]) and best.train.lr > 0.000001
    assert best.model == load_config(SMOKE).model and best.workdir == str(tmp_path)
    assert (tune_dir / "bleu_vs_params.png").stat().st_size > 1000

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
    parents = [r for r in runs if r.info.run_name == "tune"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(trials) == 3
    for run in trials:
        assert run.info.status == "FINISHED", run.data.tags  # stopped trials are closed too
        assert {"bleu_src2tgt", "bleu_tgt2src", "valid_bleu"} <= set(run.data.metrics)
        assert "train.lr" in run.data.params
        assert len(mlflow.MlflowClient().get_metric_history(run.info.run_id, "train_total")) >= 2  # per step
    assert parents[0].data.metrics["best_train_ctc_src2tgt"] == pytest.approx(float(best_row["train_ctc_src2tgt"]))
    stopped = [r for r in trials if r.data.tags.get("stopped_early") == "true"]
    assert 1 <= len(stopped) == parents[0].data.metrics["stopped_early"] <= 2
    assert "1e-06" in {r.data.params["train.lr"] for r in stopped}

    assert run_pipeline.main(args) == 0  # finished: not swept again
    assert next(tmp_path.glob("tune-*")) == tune_dir


@pytest.mark.slow
def test_a_failing_trial_does_not_stop_the_sweep(tmp_path, capsys, ray_session):
    args = ["tune", "--config", str(SMOKE), f"workdir={tmp_path}", "distill.enabled=false", "tracking.enabled=false",
            "train.num_workers=1",
            "train.max_steps=10", "train.validate_every=5", "train.max_failures=0", "tune.grace_period=5",
            "tune.space={train.fail_at_step: {grid: [0, 3]}}"]
    assert run_pipeline.main(args) == 0
    out = capsys.readouterr().out
    assert "tune: 2 trials (1 failed" in out and "fault drill" in out
    with open(next(tmp_path.glob("tune-*")) / "trials.csv", newline="") as handle:
        rows = {r["train.fail_at_step"]: r for r in csv.DictReader(handle)}
    assert rows["3"]["status"] == "error" and "fault drill" in rows["3"]["error"]
    assert rows["0"]["status"] == "finished" and float(rows["0"]["valid_bleu"]) >= 0
