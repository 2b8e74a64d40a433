import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

import run_pipeline
from pipeline import evaluate
from pipeline.config import ConfigError

SMOKE = Path(run_pipeline.__file__).resolve().parent / "configs" / "smoke.yaml"


def test_unknown_stage_and_bad_key_fail_fast(tmp_path, capsys):
    assert run_pipeline.main(["--config", str(SMOKE), f"workdir={tmp_path}", "--stages", "ingest,train2"]) == 2
    assert "unknown stage(s) ['train2']" in capsys.readouterr().err
    assert run_pipeline.main(["--config", str(SMOKE), f"workdir={tmp_path}", "data.sauce=files"]) == 2
    assert "data.sauce" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        run_pipeline.select_stages(",")
    assert run_pipeline.select_stages("tokenize,ingest") == ["ingest", "tokenize"]  # always in run order


def test_default_run_without_the_sword_packages_says_what_to_install(tmp_path, capsys):
    code = run_pipeline.main([f"workdir={tmp_path}", f"data.sword_path={tmp_path / 'no-sword'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "apt-get install -y sword-text-web sword-text-sparv" in err
    assert not list(tmp_path.glob("ingest-*"))  # nothing published
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")  # the failure is on record in MLflow
    runs = {r.info.run_name: r for r in mlflow.search_runs(experiment_names=["duplex"], output_format="list")}
    assert set(runs) == {"pipeline", "ingest"}
    assert {r.info.status for r in runs.values()} == {"FAILED"}
    assert "apt-get install" in runs["ingest"].data.tags["error"] and "error" in runs["pipeline"].data.tags


def test_later_stage_alone_needs_earlier_ones(tmp_path, capsys):
    assert run_pipeline.main(["--config", str(SMOKE), f"workdir={tmp_path}", "--stages", "spm"]) == 2
    assert "stage 'ingest' has no finished output" in capsys.readouterr().err


@pytest.mark.slow
def test_smoke_config_end_to_end_with_tracking_then_skips(tmp_path, capsys, ray_session):
    """All five stages through Ray (2 training workers, gloo DDP), tracked in MLflow; then the translate
    CLI reproduces the evaluate stage's hypotheses, a second run skips everything, and a GPU request on
    this CPU-only cluster fails fast."""
    workdir = tmp_path / "work"
    args = ["--config", str(SMOKE), f"workdir={workdir}", "tracking.enabled=true"]
    assert run_pipeline.main(args) == 0
    out = capsys.readouterr().out
    assert "[5/5] evaluate: running" in out and "vocab_size 256 (blank id 255)" in out
    last = json.loads((workdir / "last_run.json").read_text())
    assert [entry["status"] for entry in last["stages"].values()] == ["ran"] * 5
    assert last["stages"]["tokenize"]["counts"]["train"]["kept"] > 350
    assert last["stages"]["train"]["counts"]["steps"] == 30

    evaluate_dir = Path(last["stages"]["evaluate"]["output"])
    results = json.loads((evaluate_dir / "results.json").read_text())
    for key in ("bleu_src2tgt", "bleu_tgt2src", "chrf_src2tgt", "chrf_tgt2src", "roundtrip_bleu_src",
                "roundtrip_bleu_tgt"):
        assert math.isfinite(results[key]), key
    assert results["chrf_src2tgt"] > 5 and results["chrf_tgt2src"] > 5  # 30 steps learn some characters
    assert results["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert results["mlflow_run_id"] == last["mlflow_run_id"]
    assert set(results["scores"]) == {f"{split}.{d}.{decoder}" for split in ("test", "valid")
                                      for d in ("src2tgt", "tgt2src") for decoder in ("greedy", "beam4")}
    assert results["speed"]["greedy_latency_ms"] > 0 and results["speed"]["beam4_sentences_per_s"] > 0
    hypotheses = (evaluate_dir / "test.src2tgt.greedy.txt").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == 50

    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{workdir}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
    by_name = {run.info.run_name: run for run in runs}
    assert set(by_name) == {"pipeline", "ingest", "spm", "tokenize", "train", "evaluate"}
    parent = by_name["pipeline"]
    assert parent.info.run_id == last["mlflow_run_id"] and parent.info.status == "FINISHED"
    for stage in ("ingest", "spm", "tokenize", "train", "evaluate"):
        assert by_name[stage].data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert by_name[stage].info.status == "FINISHED"
    assert parent.data.metrics["bleu_src2tgt"] == pytest.approx(results["bleu_src2tgt"])
    assert parent.data.metrics["bleu_tgt2src"] == pytest.approx(results["bleu_tgt2src"])
    assert parent.data.params["model.vocab_size"] == "256" and parent.data.params["train.num_workers"] == "2"
    assert parent.data.tags["bleu_signature"] == results["bleu_signature"]
    assert by_name["ingest"].data.metrics["train.kept"] == 400

    def artifacts(stage: str, path: str = "") -> set[str]:
        return {a.path for a in client.list_artifacts(by_name[stage].info.run_id, path)}

    assert "config.yaml" in artifacts("pipeline")
    assert "spm.model" in artifacts("spm")
    assert {"training.png", "history.json", "model"} <= artifacts("train")
    assert {"model/model.pt", "model/config.json", "model/spm.model"} <= artifacts("train", "model")
    assert {"results.json", "test.src2tgt.greedy.txt", "test.tgt2src.beam4.txt"} <= artifacts("evaluate")
    train_run = by_name["train"].info.run_id
    per_step = client.get_metric_history(train_run, "train_total")
    assert [m.step for m in per_step] == [5, 10, 15, 20, 25, 30]  # logged by rank 0 every log_every steps
    for name in ("train_ctc_src2tgt", "train_ctc_tgt2src", "train_fba_src2tgt", "train_cc_tgt2src", "lr",
                 "tokens_per_s", "grad_norm"):
        assert len(client.get_metric_history(train_run, name)) == 6, name
    assert [m.step for m in client.get_metric_history(train_run, "bleu_src2tgt")] == [10, 20, 30]

    model_dir = Path(last["stages"]["train"]["output"]) / "model"
    test_src, _ = evaluate.read_text_split(Path(last["stages"]["ingest"]["output"]), "test", 50)
    translated = subprocess.run([sys.executable, "-m", "reder.translate", "--checkpoint", str(model_dir),
                                 "--direction", "src2tgt"], input="".join(s + "\n" for s in test_src),
                                capture_output=True, text=True, check=True, cwd=Path(run_pipeline.__file__).parent)
    assert translated.stdout.splitlines() == hypotheses

    assert run_pipeline.main(args) == 0  # second run: everything finished already
    assert capsys.readouterr().out.count("skipped (finished earlier)") == 10  # progress lines + summary
    assert len(mlflow.search_runs(experiment_names=["duplex"], output_format="list")) == 6  # no run opened

    started = time.monotonic()
    assert run_pipeline.main(args + ["train.use_gpu=true", "train.start_timeout_s=1", "--stages", "train"]) == 2
    assert "GPU: need 2, cluster has 0" in capsys.readouterr().err
    assert time.monotonic() - started < 30
