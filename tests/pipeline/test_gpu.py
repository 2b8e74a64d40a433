"""The pipeline's GPU paths (`gpu`: skipped without CUDA, run on the lent GPU machine as
bench/README.md's "The GPU machine" says): the train stage's Ray Train worker on one GPU (NCCL, bf16
autocast), a distill Ray Data actor on one GPU against the teacher called directly on the GPU, and bf16
through the harness. What the Ray workers ran with is recorded by tests/pipeline/gpu_probe.py."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

import run_pipeline
from cluster.connect import init_local
from pipeline.config import DistillConfig
from pipeline.stages import distill, tokenize
from pipeline.training.harness import Harness
from reder import DuplexLoss, LossConfig
from reder.checkpoint import load_teacher_dir
from tests.pipeline import test_distill, test_harness
from tests.pipeline.conftest import RAY_SESSION
from tests.pipeline.gpu_probe import PROBE_ENV
from tests.reder.helpers import tiny_model

ROOT = Path(run_pipeline.__file__).resolve().parent
SMOKE = ROOT / "configs" / "smoke.yaml"

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ray_gpu(tmp_path_factory: pytest.TempPathFactory):
    """A local Ray instance that sees the GPU, with gpu_probe installed in its workers; yields the probe file.

    The session's instance (ray_session) declares no GPU, and a Ray driver holds one instance at a time: that
    one is shut down first and started again afterwards with its own arguments, so tests after these find
    it as before. In-process rather than in a subprocess so that the pipeline runs and the assertions here
    see the same objects, as in the CPU tests."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray

    had_session = ray.is_initialized()
    if had_session:
        ray.shutdown()
    probe = tmp_path_factory.mktemp("gpu-probe") / "probe.jsonl"
    probe.touch()
    pythonpath = os.environ.get("PYTHONPATH")
    # The workers import the probe (tests.*) and the pipeline from this checkout, installed or not.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), pythonpath) if p)
    try:
        init_local({
            "address": "local", "num_cpus": min(8, os.cpu_count() or 1), "num_gpus": 1,
            "object_store_memory": 1024 * 1024 * 1024, "log_to_driver": False,
            "runtime_env": {"env_vars": {PROBE_ENV: str(probe)},
                            "worker_process_setup_hook": "tests.pipeline.gpu_probe.install"}})
        assert ray.cluster_resources().get("GPU") == 1
        yield probe
    finally:
        ray.shutdown()
        if pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = pythonpath
        if had_session:
            init_local(RAY_SESSION)


def _probed(probe: Path, path: str) -> list[dict]:
    return [entry for entry in map(json.loads, probe.read_text(encoding="utf-8").splitlines()) if entry["path"] == path]


@pytest.mark.slow
def test_the_train_stage_trains_on_one_gpu_in_bf16(tmp_path, ray_gpu):
    """train.use_gpu=true: Ray Train gives the one worker the GPU; one worker runs without a process group
    (raytrain.trainer_class: nothing to synchronise, so no NCCL communicator to build); the worker's Harness runs
    every forward on cuda under bf16 autocast (train.bf16) with fp32 parameters; checkpoints hold cuda tensors; rank 0's metrics reach
    MLflow (sqlite in the workdir); the stage publishes the averaged model."""
    args = ["--config", str(SMOKE), f"workdir={tmp_path}", "train.num_workers=1", "train.use_gpu=true",
            "train.bf16=true", "train.max_steps=10", "train.validate_every=5", "loss.aux_start_step=5",
            "distill.enabled=false", "evaluate.teacher_baseline=false", "--stages", "ingest,spm,tokenize,train"]
    assert run_pipeline.main(args) == 0

    [worker] = _probed(ray_gpu, "train")  # one worker process, no restart
    assert worker["device"].startswith("cuda") and worker["backend"] is None
    assert worker["autocast"] is True and worker["autocast_dtype"] == "torch.bfloat16"
    assert worker["parameter_dtypes"] == ["torch.float32"] and worker["total_finite"]

    [out] = tmp_path.glob("train-*")
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] == 10
    history = json.loads((out / "history.json").read_text())
    assert [h["step"] for h in history if "train_total" in h] == [5, 10]
    assert all(math.isfinite(h["train_total"]) and math.isfinite(h["grad_norm"]) for h in history if "train_total" in h)
    checkpoint = max((tmp_path / "ray_results").glob("train-*/checkpoint_*/model.pt"))
    saved = torch.load(checkpoint, weights_only=True)  # no map_location: tensors come back where they were saved
    assert {t.device.type for t in saved.values()} == {"cuda"}
    assert {t.dtype for t in saved.values() if t.is_floating_point()} == {torch.float32}

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    steps = {m.step for run in runs for m in client.get_metric_history(run.info.run_id, "train_total")}
    assert steps == {5, 10}


@pytest.mark.slow
def test_a_gpu_distill_actor_decodes_as_the_teacher_called_directly_on_the_gpu(tmp_path, ray_gpu):
    """distill.use_gpu=true: one actor holding the GPU (num_gpus=1) decodes on cuda, and its KD output equals
    the teachers' beam search called directly on the GPU. Batches of one sentence on both sides: a batch's
    padding changes the GPU's reduction order, and a random tiny teacher has near-ties that such bitwise
    differences can flip (the batched search on the GPU is checked against the CPU in
    tests/reder/test_autoregressive.py)."""
    teachers = test_distill._teachers(tmp_path)
    references = tokenize.read_split(test_distill._train_split(tmp_path / "train"))
    decoding = {"beam_size": 3, "length_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 4}
    table, actors = distill.distill_on_ray(references, teachers, test_distill.VOCAB,
                                           DistillConfig(use_gpu=True, max_tokens=0, batch_size=1, **decoding))
    assert actors == 1
    [actor] = _probed(ray_gpu, "distill")
    assert actor["device"] == "cuda" and actor["parameter_devices"] == ["cuda:0"]
    assert actor["cuda_visible_devices"] not in (None, "")  # Ray assigned it the GPU

    rows = table.to_pylist()
    assert [row["id"] for row in rows] == references.column("id").to_pylist()
    for direction, column, kd in (("src2tgt", "src_ids", "kd_tgt_ids"), ("tgt2src", "tgt_ids", "kd_src_ids")):
        model = load_teacher_dir(Path(teachers[direction]), direction, test_distill.VOCAB, "cuda")
        direct = distill.decode(model, references.column(column).to_pylist(), direction, batch_size=1, **decoding)
        assert any(direct) and [row[kd] for row in rows] == direct


class _Recording(torch.nn.Module):
    """The objective, noting whether each forward ran under CUDA bf16 autocast."""

    def __init__(self, objective: torch.nn.Module) -> None:
        super().__init__()
        self.objective, self.autocast = objective, []

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        self.autocast.append((torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")))
        return self.objective(*args, **kwargs)


def _harness_run(bf16: bool) -> tuple[Harness, _Recording, list[dict]]:
    torch.manual_seed(0)
    model = tiny_model(vocab_size=32, dropout=0.0, attention_dropout=0.0).cuda()
    objective, reports = _Recording(DuplexLoss(model, LossConfig(aux_start_step=0))), []
    cfg = test_harness._config(bf16=bf16, max_steps=6)
    run = Harness(model, objective, cfg, "cuda", on_report=lambda metrics, _: reports.append(metrics))
    run.fit_examples(test_harness._examples())
    return run, objective, reports


def test_bf16_autocast_through_the_harness_keeps_fp32_parameters_and_finite_losses():
    """The harness's updates on cuda with train.bf16: every forward (CTC, FBA and CC from step 0, through the
    reversible backward) under bf16 autocast, finite losses and gradient norms, fp32 parameters and
    optimizer moments; the first loss close to the fp32 run's but not equal to it (bf16 did the matmuls)."""
    run, objective, reports = _harness_run(bf16=True)
    assert run.bf16 and len(objective.autocast) == 6
    assert set(objective.autocast) == {(True, torch.bfloat16)}
    assert len(reports) == 6 and all(math.isfinite(r["train_total"]) and math.isfinite(r["grad_norm"]) for r in reports)
    assert all(r["train_fba_src2tgt"] > 0 for r in reports)
    assert {(p.dtype, p.device.type) for p in run.model.parameters()} == {(torch.float32, "cuda")}
    moments = [s["exp_avg"] for s in run.optimizer.state_dict()["state"].values()]
    assert moments and {m.dtype for m in moments} == {torch.float32}

    full, objective32, reports32 = _harness_run(bf16=False)
    # autocast off for every forward (its dtype inside a disabled region is the one the harness names, bfloat16:
    # seen on an H100 with torch 2.11, where the default cuda autocast dtype is float16)
    assert not full.bf16 and {enabled for enabled, _ in objective32.autocast} == {False}
    first, first32 = reports[0]["train_total"], reports32[0]["train_total"]
    assert first != first32 and first == pytest.approx(first32, rel=0.05)
