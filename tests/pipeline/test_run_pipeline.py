import json
from pathlib import Path

import pytest

import run_pipeline
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
    assert not (tmp_path / "mlflow.db").exists()  # failed before any stage ran: no tracking run opened
    assert [p for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_later_stage_alone_needs_earlier_ones(tmp_path, capsys):
    assert run_pipeline.main(["--config", str(SMOKE), f"workdir={tmp_path}", "--stages", "spm"]) == 2
    assert "stage 'ingest' has no finished output" in capsys.readouterr().err


@pytest.mark.slow
def test_smoke_config_end_to_end_with_tracking_then_skips(tmp_path, capsys, ray_session):
    workdir = tmp_path / "work"
    args = ["--config", str(SMOKE), f"workdir={workdir}", "tracking.enabled=true"]
    assert run_pipeline.main(args) == 0
    out = capsys.readouterr().out
    assert "[3/3] tokenize: running" in out and "vocab_size 256 (blank id 255)" in out
    last = json.loads((workdir / "last_run.json").read_text())
    assert [entry["status"] for entry in last["stages"].values()] == ["ran"] * 3
    assert last["stages"]["tokenize"]["counts"]["train"]["kept"] > 350

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{workdir}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
    by_name = {run.info.run_name: run for run in runs}
    assert set(by_name) == {"pipeline", "ingest", "spm", "tokenize"}
    parent = by_name["pipeline"].info.run_id
    assert parent == last["mlflow_run_id"] and by_name["pipeline"].info.status == "FINISHED"
    for stage in ("ingest", "spm", "tokenize"):
        assert by_name[stage].data.tags["mlflow.parentRunId"] == parent
    assert by_name["ingest"].data.metrics["train.kept"] == 400
    assert by_name["tokenize"].data.metrics["train.kept"] == last["stages"]["tokenize"]["counts"]["train"]["kept"]
    assert by_name["pipeline"].data.params["model.vocab_size"] == "256"

    assert run_pipeline.main(args) == 0  # second run: everything finished already
    assert capsys.readouterr().out.count("skipped (finished earlier)") >= 6
    assert len(mlflow.search_runs(experiment_names=["duplex"], output_format="list")) == 4
