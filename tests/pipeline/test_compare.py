"""duplex-compare: sacreBLEU's paired tests of two runs' hypotheses, read back from MLflow."""
import json

from mlflow.tracking import MlflowClient

from pipeline import compare


def _evaluate_run(client, experiment, tmp_path, name, hypotheses, sources, references, parent=None):
    """An evaluate run as the pipeline logs it: results.json, the greedy hypotheses, the translations tables."""
    tags = {"duplex.stage": "evaluate", **({"mlflow.parentRunId": parent} if parent else {})}
    run = client.create_run(experiment, run_name=name, tags=tags).info.run_id
    files = tmp_path / name
    files.mkdir()
    (files / "results.json").write_text(json.dumps({"split": "test", "sets": {"test": {}, "t17": {}}}))
    for split in ("test", "t17"):
        for direction in ("src2tgt", "tgt2src"):
            (files / f"{split}.{direction}.greedy.txt").write_text("".join(h + "\n" for h in hypotheses[direction]))
    client.log_artifacts(run, str(files))
    for split in ("test", "t17"):  # as Tracker.log_tables logs them
        client.log_table(run, {"source": sources, "reference": references}, f"translations/{split}.json")
    client.set_terminated(run)
    return run


def test_two_runs_are_compared_by_sacrebleus_paired_bootstrap_per_set_and_direction(tmp_path, capsys):
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("duplex", artifact_location=(tmp_path / "mlartifacts").as_uri())  # not ./mlruns
    sources = [f"the {w} sat on the mat number {i}" for i, w in enumerate(["cat", "dog", "bird", "cow"] * 5)]
    references = [f"el {w} se sentó en la alfombra número {i}" for i, w in enumerate(["gato", "perro", "pájaro", "vaca"] * 5)]
    weak = {"src2tgt": [r.split(" se ")[0] for r in references], "tgt2src": [s.split(" on ")[0] for s in sources]}
    strong = {"src2tgt": [r.replace("alfombra", "manta") for r in references], "tgt2src": sources}
    pipeline = client.create_run(experiment, tags={"duplex.stage": "pipeline"}).info.run_id
    a = _evaluate_run(client, experiment, tmp_path, "a", weak, sources, references, parent=pipeline)
    b = _evaluate_run(client, experiment, tmp_path, "b", strong, sources, references)
    assert compare.main([pipeline, b, "--tracking-uri", uri, "--samples", "200"]) == 0  # A by its pipeline run
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines() if line.startswith(("test ", "t17 "))]
    assert [(line[0], line[1], line[2]) for line in lines] == [(s, d, m) for s in ("test", "t17")  # results.json's order
                                                             for d in ("src2tgt", "tgt2src") for m in ("BLEU", "chrF2")]
    _, expected = PairedTest([("A", weak["src2tgt"]), ("B", strong["src2tgt"])], {"BLEU": BLEU(), "chrF": CHRF()},
                             [references], test_type="bs", n_samples=200)()
    row = next(line for line in lines if line[:3] == ["test", "src2tgt", "BLEU"])
    assert row[3:5] == [f"{expected['BLEU'][0].score:.2f}", f"{expected['BLEU'][1].score:.2f}"]
    assert row[9] == f"{expected['BLEU'][1].p_value:.4f}" and " ".join(row[10:]) == "B better"
    assert "BLEU: nrefs:1|bs:200|seed:12345|case:mixed|eff:no|tok:13a|smooth:exp|version:" in out

    assert compare.main([a, b, "--tracking-uri", uri, "--test", "ar", "--samples", "100", "--sets", "t17"]) == 0
    out = capsys.readouterr().out
    assert "approximate randomisation" in out and "\ntest " not in out and out.count("\nt17 ") == 4
    assert compare.main([a, a, "--tracking-uri", uri, "--sets", "t17", "--samples", "100"]) == 0  # a run against itself
    assert capsys.readouterr().out.count("no significant difference") == 4
    other = client.create_run(experiment, tags={"duplex.stage": "train"}).info.run_id
    assert compare.main([a, other, "--tracking-uri", uri]) == 2
    assert "is a train run: give a pipeline run or an evaluate run" in capsys.readouterr().err
