"""The train stage through Ray Train (slow): an interrupted run resumes from its checkpoint; --force does not."""
import json
import math
from pathlib import Path

import pytest

import run_pipeline
from pipeline.config import load_config
from pipeline.stage import StageRun
from pipeline.stages import train
from pipeline.tracking.store import STAGE_TAG
from pipeline.training import raytrain
from pipeline.training.harness import inverse_sqrt

SMOKE = Path(run_pipeline.__file__).resolve().parent / "configs" / "smoke.yaml"


@pytest.mark.slow
def test_an_interrupted_run_continues_from_its_checkpoint(smoke_data, capsys, caplog, ray_session):
    """A run that dies after the step-10 checkpoint (no restarts allowed) publishes nothing; started
    again it resumes at step 10 with the optimizer state and reaches max_steps, not 10 + max_steps, even with Ray
    Train's record of its checkpoints gone (it resumes from the newest whole checkpoint on disk)."""
    tmp_path = smoke_data  # with the smoke config's data stages finished (tests/pipeline/conftest.py)
    args = ["--config", str(SMOKE), f"workdir={tmp_path}", "train.num_workers=1", "train.max_steps=20",
            "loss.aux_start_step=15", "distill.enabled=false", "evaluate.teacher_baseline=false", "tracking.enabled=false"]
    failing = args + ["train.fail_at_step=12", "train.max_failures=0", "--stages", "ingest,spm,tokenize,train"]
    assert run_pipeline.main(failing) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # one line: the worker's own error, no traceback
    assert last == "error: train: Ray Train failed: rank 0: RuntimeError: fault drill: train.fail_at_step=12 (rank 0)"
    assert not list(tmp_path.glob("train-*"))  # nothing half-published

    # The latest checkpoint corrupted: the resume refuses it in one line naming the file.
    state = max((tmp_path / "ray_results").glob("train-*/checkpoint_*/train_state.pt"), key=lambda f: f.stat().st_mtime)
    intact = state.read_bytes()
    state.write_bytes(intact[: len(intact) // 2])
    assert run_pipeline.main(args + ["train.max_failures=0", "--stages", "train"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: train: Ray Train failed: rank 0: ValueError: {state}: corrupt or truncated"), last
    state.write_bytes(intact)

    # Ray Train's record of the checkpoints lost too (a kill while Ray rewrote it, no usable copy): the run resumes
    # from the newest whole checkpoint on disk all the same
    for record in (raytrain.SNAPSHOT, raytrain.KEPT_SNAPSHOT):
        (state.parent.parent / record).unlink(missing_ok=True)
    assert run_pipeline.main(args + ["--stages", "train"]) == 0
    assert f"no record of them (a kill before Ray Train wrote it); the run resumes from {state.parent.name} (step 10)" \
        in caplog.text
    out = list(tmp_path.glob("train-*"))
    assert len(out) == 1  # fail_at_step and max_failures are not part of the stage's identity
    history = json.loads((out[0] / "history.json").read_text())
    resumed = [entry for entry in history if "resumed_from" in entry]
    assert resumed == [{"step": 10, "resumed_from": 10}]
    steps = [entry["step"] for entry in history]
    assert steps == sorted(steps) and steps[-1] == 20 and steps.count(10) == 2  # 10 logged, then resumed at 10
    report = json.loads((out[0] / "report.json").read_text())
    assert report["steps"] == 20 and report["restarts"] == 1
    timeline = report["timeline"]  # the resumed worker group's fit, phase by phase, within the fit's seconds
    assert set(timeline) == {"group_start_s", "setup_s", "updates_s", "validation_s", "end_s"}, timeline
    assert all(value >= 0 for value in timeline.values()) and timeline["updates_s"] > 0, timeline
    assert sum(timeline[k] for k in ("group_start_s", "setup_s", "updates_s", "end_s")) <= report["fit_seconds"] + 0.3
    after = history[history.index(resumed[0]) + 1]
    assert after["step"] == 15 and math.isfinite(after["train_total"])
    # the schedule went on from step 10 rather than restarting its warm-up
    assert after["lr"] == pytest.approx(inverse_sqrt(15, 0.002, 10, 1e-7))


@pytest.mark.slow
def test_a_stage_budgeted_by_time_stops_on_time_publishes_its_best_and_a_restart_keeps_its_clock(smoke_data, ray_session):
    """train.max_time=8 s and max_steps far away; the worker dies after update 3 (the fault drill) and Ray Train
    restarts it from the step-2 checkpoint. The schedule warms up over the first half of the budget by time
    spent: the restarted worker goes on from the checkpoint's clock, so its learning rate goes on rising from
    where it was (had the clock restarted, it would fall back to the start of the warm-up). The stage stops by
    time, publishes its averaged model, and its manifest and MLflow run say why, on which card, with which seed."""
    tmp_path = smoke_data  # with the smoke config's data stages finished (tests/pipeline/conftest.py)
    from mlflow.tracking import MlflowClient

    args = ["--config", str(SMOKE), f"workdir={tmp_path}", "train.num_workers=1", "train.max_steps=100000",
            "train.max_time=8", "train.warmup_fraction=0.5", "train.lr_scheduler=linear", "train.fail_at_step=3",
            "train.validate_every=2", "train.log_every=1", "distill.enabled=false", "evaluate.teacher_baseline=false",
            "--stages", "ingest,spm,tokenize,train"]
    assert run_pipeline.main(args) == 0
    out, = tmp_path.glob("train-*")
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert counts["stopped_by"] == "max_time" and counts["budgeted_by_time"] is True and counts["seed"] == 1
    assert counts["device"].startswith("cpu (") and counts["restarts"] == 1 and counts["steps"] > 3
    assert counts["too_long"] == 0  # examples over the model's max_positions, left out (none here)
    assert counts["train_seconds"] >= 8.0
    history = json.loads((out / "history.json").read_text())
    assert {"step": 2, "resumed_from": 2} in history
    lr = {h["step"]: h["lr"] for h in history if "lr" in h}  # the last entry of a step: after the restart
    assert lr[1] < lr[2] < lr[3], lr  # still warming up, from the checkpoint's time on
    assert history[-1]["step"] == counts["steps"] and "valid_bleu" in history[-1]  # the last update validated
    assert (out / "model" / "config.json").is_file()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    stage, = [r for r in client.search_runs(client.get_experiment_by_name("duplex").experiment_id)
              if r.data.tags.get(STAGE_TAG) == "train"]
    assert stage.data.tags["stopped_by"] == "max_time" and stage.data.tags["device"] == counts["device"]
    assert stage.data.metrics["steps"] == counts["steps"] and stage.data.metrics["seed"] == 1


@pytest.mark.slow
def test_a_stage_share_of_the_run_budget_is_spent_by_its_worker_groups_start_too(smoke_data, ray_session):
    """budget.max_time is wall-clock: the train stage's share (`graph.time_cap`, here about 2 s: the run's 1,000 s
    less a reserve of 998) counts from the stage's start, so Ray Train's start of the worker group (longer than
    2 s) spends it all and the worker trains one update (a run stops at one at least), validates it and stops
    with `time_cap`. Counted from the worker's first update instead, it would train 2 s of updates (a GPU run
    overran its budget so: 46 s of the REDER stage's 198 were its start and its end)."""
    tmp_path = smoke_data  # with the smoke config's data stages finished (tests/pipeline/conftest.py)
    args = ["--config", str(SMOKE), f"workdir={tmp_path}", "train.num_workers=1", "train.max_steps=100000",
            "distill.enabled=false", "evaluate.teacher_baseline=false", "tracking.enabled=false"]
    assert run_pipeline.main(args + ["--stages", "ingest,spm,tokenize"]) == 0
    assert run_pipeline.main(args + ["budget.max_time=1000", "budget.reserve=998", "--stages", "train"]) == 0
    out, = tmp_path.glob("train-*")
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert counts["stopped_by"] == "time_cap" and counts["steps"] == 1
    history = json.loads((out / "history.json").read_text())
    assert history[-1]["step"] == 1 and "valid_bleu" in history[-1]
    # What the start no longer pays: Ray Train's DatasetManager actor (a process importing Ray Data, which
    # the workers' train context waited for), although no run here takes Ray Datasets, and its per-run
    # PlacementGroupCleaner (a process polling the State API); a worker group did start.
    from ray.util.state import list_actors

    started = {a.class_name for a in list_actors(address=ray_session.get_runtime_context().gcs_address, limit=10000)}
    assert "RayTrainWorker" in started and not started & {"DatasetManager", "PlacementGroupCleaner"}, started


def test_one_worker_trains_without_a_process_group_and_a_group_under_ddp():
    """The Ray Train trainer of a run: both are Ray Train's `DataParallelTrainer`; a group of workers
    gets a torch process group (`ProcessGroupConfig`, DDP), one worker needs none. Neither takes Ray Datasets
    (each worker reads its own shard), so neither starts the DatasetManager actor; neither starts Ray Train's
    PlacementGroupCleaner either."""
    from ray.train import BackendConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from pipeline.training.process_group import ProcessGroupConfig

    one, group = raytrain.trainer_class(True), raytrain.trainer_class(False)
    assert not issubclass(one, TorchTrainer) and not issubclass(group, TorchTrainer)
    assert type(one(lambda: None).backend_config) is BackendConfig  # no torch, no process group
    assert type(group(lambda: None).backend_config) is ProcessGroupConfig
    for trainer in (one(lambda: None), group(lambda: None)):
        callbacks = trainer._create_default_callbacks()
        assert callbacks and not any(isinstance(c, (DatasetsCallback, PlacementGroupCleanerCallback)) for c in callbacks)
    assert raytrain.trainer_class(True) is one  # one class per kind: built once
    assert raytrain.worker_count(load_config(SMOKE, ["train.num_workers=1"]).train) == 1  # what make_trainer asks


def test_reders_workers_are_told_to_train_on_the_references_beside_the_kd_pairs_and_the_teachers_never(tmp_path):
    """distill.references reaches REDER's workers (trainloop.read_shard adds the reference rows); a teacher pair
    trains on the references already, and REDER without the option on the KD pairs alone."""
    (tmp_path / "spm.model").write_bytes(b"spm")

    def loop_config(overrides: list[str], task: dict | None = None) -> dict:
        cfg = load_config(SMOKE, overrides)
        return raytrain.make_trainer(cfg, "run", tmp_path, tmp_path / "train", tmp_path, tmp_path, tmp_path / "spm.model", None,
                                     task=task).train_loop_config

    assert loop_config(["distill.references=true"])["references"] is True
    assert loop_config([])["references"] is False
    assert loop_config(["distill.references=true"], {"kind": "teacher"})["references"] is False


def test_a_groups_controller_unpickles_its_backend_without_importing_torch(tmp_path):
    """What a group's Ray Train controller (a process of its own) receives of the backend, unpickled in a fresh
    interpreter as the controller does: no torch import (Ray's `TorchConfig` cost the controller ~1.2 s of a
    two-worker start's 7.5 s on the 2-core box)."""
    import subprocess
    import sys

    import cloudpickle

    trainer = raytrain.trainer_class(False)(lambda: None)  # its backend, and the callbacks that hold it
    (tmp_path / "callback.pkl").write_bytes(cloudpickle.dumps((trainer.backend_config,
                                                               trainer._create_default_callbacks())))
    code = "import pickle, sys; pickle.loads(open(sys.argv[1], 'rb').read()); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "callback.pkl")], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.strip() == "False", "unpickling the group's backend imported torch"


def test_a_group_of_two_workers_gets_a_gloo_process_group_of_both(ray_session, tmp_path):
    """`ProcessGroupConfig` as Ray's `TorchConfig` sets it up: each worker in one gloo process group of the
    group's size, its rank Ray Train's, an all-reduce across both; then shut down in order."""
    import ray.train

    out = tmp_path / "ranks"
    out.mkdir()

    def loop() -> None:
        import torch
        import torch.distributed as dist

        rank = ray.train.get_context().get_world_rank()
        total = torch.ones(1) * (rank + 1)
        dist.all_reduce(total)
        (out / f"{rank}.json").write_text(json.dumps({"backend": dist.get_backend(), "world": dist.get_world_size(),
                                                      "rank": dist.get_rank(), "total": float(total)}))

    trainer = raytrain.trainer_class(False)(
        loop, scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(name="group", storage_path=str(tmp_path)))
    trainer.fit()
    ranks = [json.loads((out / f"{rank}.json").read_text()) for rank in range(2)]
    # 1 + 2 = 3 on both: both ranks took part
    assert ranks == [{"backend": "gloo", "world": 2, "rank": rank, "total": 3.0} for rank in range(2)]


def test_workers_on_fractions_of_a_gpu_share_it_under_gloo_and_on_whole_gpus_under_nccl(tmp_path):
    """`train.gpus_per_worker=0.5 train.num_workers=2` (accepted by the config): Ray places both workers on the one
    GPU of a Ray instance that declares one (no CUDA here: a CPU places and synchronises as far as it can), and
    their process group is gloo (NCCL refuses two ranks on one GPU), an all-reduce across both; whole GPUs keep
    NCCL. A Ray instance of its own, in a process of its own: the tests' shared one declares no GPU."""
    import os
    import subprocess
    import sys

    from cluster.connect import LOCAL_ENV
    from pipeline.training.process_group import default_backend

    assert [default_backend(g) for g in (0, 0.25, 0.5, 1, 2)] == ["gloo", "gloo", "gloo", "nccl", "nccl"]
    train_cfg = load_config(SMOKE, ["train.use_gpu=true", "train.num_workers=2", "train.gpus_per_worker=0.5"]).train
    resources = raytrain.worker_resources(train_cfg)
    assert resources == {"CPU": 1.0, "GPU": 0.5}
    root = Path(__file__).resolve().parents[2]
    code = f"""
import json, sys
from pathlib import Path
import ray, ray.train
from pipeline.training import raytrain

out = Path(sys.argv[1])

def loop():
    import torch
    import torch.distributed as dist
    rank = ray.train.get_context().get_world_rank()
    total = torch.ones(1) * (rank + 1)
    dist.all_reduce(total)
    (out / f"{{rank}}.json").write_text(json.dumps({{"backend": dist.get_backend(), "world": dist.get_world_size(),
        "total": float(total), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}}))

ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False,
         object_store_memory=100 * 1024 * 1024)
try:
    raytrain.trainer_class(False)(loop, scaling_config=ray.train.ScalingConfig(
        num_workers=2, use_gpu=True, resources_per_worker={resources!r}),
        run_config=ray.train.RunConfig(name="halves", storage_path=str(out))).fit()
finally:
    ray.shutdown()
"""
    env = {**os.environ, **LOCAL_ENV, "PYTHONPATH": str(root), "RAY_AUTH_MODE": "disabled"}  # as a local run's
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert ranks == [{"backend": "gloo", "world": 2, "total": 3.0, "gpu_ids": ["0"]}] * 2  # one GPU, both ranks


class _Fitting(Exception):
    """Raised by the stand-in trainer: the test stops where Ray Train would start."""


@pytest.mark.parametrize("force", [False, True])
def test_force_trains_from_scratch_and_a_plain_run_resumes(tmp_path, monkeypatch, force):
    """--force must not resume the finished stage's Ray Train run (same name, same storage): its directory is
    gone before the trainer is built; without --force it is kept (resume after an interruption)."""
    cfg = load_config(None, [f"workdir={tmp_path}"])
    previous = tmp_path / "ray_results" / "train-abc" / "checkpoint_000003"
    previous.mkdir(parents=True)
    seen = {}

    def make_trainer(cfg, name, storage, *args, **kwargs):
        seen[name] = (storage / name).exists()
        raise _Fitting

    monkeypatch.setattr(train, "check_resources", lambda *args: None)
    monkeypatch.setattr(train, "make_trainer", make_trainer)
    run = StageRun(cfg=cfg, workdir=tmp_path, out=tmp_path / "train-abc", force=force,
                   inputs={label: tmp_path / label for label in ("data", "tokenize", "ingest", "spm")})
    with pytest.raises(_Fitting):
        train.build(run, tmp_path / "tmp")
    assert seen == {"train-abc": not force}


def test_the_shared_data_stages_are_reused_by_a_training_test_s_config(smoke_data, capsys):
    """`smoke_data` (tests/pipeline/conftest.py) holds the smoke config's data stages: the training tests' configs
    (their overrides are train, loss, distill, evaluate and tracking keys) reuse them rather than tokenize again."""
    argv = ["--config", str(SMOKE), f"workdir={smoke_data}", "train.num_workers=1", "train.max_steps=20",
            "loss.aux_start_step=15", "distill.enabled=false", "evaluate.teacher_baseline=false", "--dry-run"]
    assert run_pipeline.main(argv) == 0
    out = capsys.readouterr().out
    for stage in ("ingest", "spm", "tokenize"):
        assert f"] {stage}: reuse -> {smoke_data}/{stage}-" in out, out
    assert "] train: run" in out
