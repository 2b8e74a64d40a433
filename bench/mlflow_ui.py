"""The MLflow UI in a real browser: `mlflow ui` on a run's store, four pages read by headless Chromium
(Debian's `chromium` package) after 15 s of virtual time, as text (`--dump-dom`) and as screenshots (1500x900),
and five more on what else the runs carry:

- runs: the experiment's runs table in the saved view "Test BLEU" that the pipeline tags the experiment with
  (pipeline/tracking.py `runs_view`, `runs_page`): columns test BLEU and chrF both ways, sorted by test BLEU
  (sorted by a metric, MLflow lists nested runs flat: the pipeline run and each stage run by name);
- pipeline: the pipeline run's page: its stage runs by name, its metrics `test_bleu_src2tgt` and
  `test_bleu_tgt2src` (a taller window: they are below the fold at 900 pixels);
- run: the train stage's run, its artifact `training.png` shown as an image;
- model: the registered model `reder-<src>-<tgt>` and its versions, the alias @champion on the best;
- translations: the evaluate run's table `translations/test.json` (mlflow.log_table): source, reference,
  hypotheses both ways with sentence BLEU and chrF, sortable;
- datasets: the runs table searched for the runs that trained (`dataset.context = 'training'`), its Dataset column
  naming what each read: the teachers the raw pairs, REDER the distilled ones;
- system: the train run's "System metrics" tab, MLflow's charts of CPU, memory (and GPU) over the run;
- models: the experiment's Models tab, its LoggedModels: the train run's kept checkpoints by name (each a model by
  reference, `Tracker.log_checkpoints`) and the pyfunc it registered, "translator";
- compare: with a sweep in the store (`run_pipeline.py tune`), its trials in MLflow's compare view, their values
  and both validation BLEUs.

    python -m bench.mlflow_ui --workdir runs/smoke [--out docs/] [--dom DIR] [--budget-ms 15000]

prints each page's URL and whether the texts it must show are in its DOM (JSON); with `--out`, also
writes `mlflow_<page>.png` (with `--dom`, its DOM `mlflow_<page>.html`). tests/pipeline/test_run_pipeline.py
reads the smoke run's pages the same way.

MLflow 3.17 opens an experiment on its GenAI overview unless the URL says `workflowType=machine_learning`
(or the user switched the "GenAI / Model training" toggle before): the experiment tag
`mlflow.experimentKind` is read only when that toggle is off. Hence the links below carry it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator

from bench import free_port
from cluster.head import JOB_EXECUTION_ENV
from pipeline.tracking.views import TEST_COLUMNS, runs_page

RUNS_VIEW = "workflowType=machine_learning"
WINDOWS = {"pipeline": "1500,1500"}  # the others 1500x900
TRAINING_RUNS = urllib.parse.quote("dataset.context = 'training'")  # MLflow's search syntax, URL-quoted
BY_VALID_BLEU = urllib.parse.quote("metrics.`valid_bleu`")


def chromium() -> str | None:
    """The Chromium executable, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def pages(experiment_id: str, pipeline_run_id: str, train_run_id: str, model: str,
          evaluate_run_id: str = "", trial_run_ids: tuple[str, ...] = ()) -> dict[str, str]:
    """The URL fragment of each page (after http://host:port/)."""
    runs = f"#/experiments/{experiment_id}/runs"
    links = {"runs": runs_page(experiment_id), "pipeline": f"{runs}/{pipeline_run_id}?{RUNS_VIEW}",
             "run": f"{runs}/{train_run_id}/artifacts/training.png?{RUNS_VIEW}", "model": f"#/models/{model}?{RUNS_VIEW}",
             # the runs that trained (a search on their datasets' context, sorted by a metric so that they
             # are listed flat, not folded under their pipeline run) with the Dataset column; the train run's
             # system metrics
             "datasets": f"{runs}?searchFilter={TRAINING_RUNS}&orderByKey={BY_VALID_BLEU}&orderByAsc=false&{RUNS_VIEW}",
             "system": f"{runs}/{train_run_id}/system-metrics?{RUNS_VIEW}",
             # the experiment's Models tab: the LoggedModels, each kept checkpoint and the published pyfunc
             "models": f"#/experiments/{experiment_id}/models?{RUNS_VIEW}"}
    if evaluate_run_id:
        links["translations"] = f"{runs}/{evaluate_run_id}/artifacts/translations/test.json?{RUNS_VIEW}"
    if trial_run_ids:  # a sweep's trials side by side
        links["compare"] = compare_link(experiment_id, trial_run_ids)
    return links


def compare_link(experiment_id: str, run_ids: tuple[str, ...]) -> str:
    """The URL fragment of MLflow's compare view of these runs."""
    ids = ",".join(f'"{run_id}"' for run_id in run_ids)
    return f"#/compare-runs?runs=[{ids}]&experiments=[\"{experiment_id}\"]&{RUNS_VIEW}"


def sweep_trials(runs: list) -> list:
    """The finished trials of the latest sweep (`run_pipeline.py tune`) among `runs`, [] without one."""
    runs = [run for run in runs if run.info.status == "FINISHED"]
    sweep = {run.data.tags.get("duplex.stage"): run for run in runs}.get("tune")
    return [run for run in runs if sweep is not None and run.data.tags.get("mlflow.parentRunId") == sweep.info.run_id]


def compare_texts(trials: list, metrics: tuple[str, ...] = ("valid_bleu_src2tgt", "valid_bleu_tgt2src")) -> list[str]:
    """What a sweep's compare view must show: each trial by name, the swept parameters and `metrics` (both BLEUs by
    default; the view lists only the metrics whose values differ between the trials, "Show diff only")."""
    return [*(run.info.run_name for run in trials), *sorted({k for run in trials for k in run.data.params}), *metrics]


def expected_texts(runs: list) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(pages, the texts each page's DOM must hold) for the MLflow runs of one pipeline run (`runs`: the
    experiment's runs, each tagged `duplex.stage`, in the store mlflow's tracking URI names)."""
    import mlflow

    runs = [run for run in runs if run.info.status == "FINISHED"]  # a failed invocation's runs are listed too
    by_stage = {run.data.tags.get("duplex.stage"): run for run in runs}
    pipeline, train = by_stage["pipeline"], by_stage["train"]
    model = train.data.tags["model_uri"].split("/")[1]
    evaluate = by_stage.get("evaluate")
    trials = sweep_trials(runs)
    models = mlflow.search_logged_models(experiment_ids=[train.info.experiment_id], output_format="list")
    links = pages(train.info.experiment_id, pipeline.info.run_id, train.info.run_id, model,
                  evaluate.info.run_id if evaluate is not None else "", tuple(run.info.run_id for run in trials))
    datasets = sorted({i.dataset.name for stage in ("train", "teacher") if stage in by_stage
                       for i in by_stage[stage].inputs.dataset_inputs
                       if {t.key: t.value for t in i.tags}.get("mlflow.data.context") == "training"})
    # the metrics table's text: name, then the value as JavaScript writes it (Python's repr: the same shortest digits)
    test_bleu = [(key, repr(pipeline.data.metrics[key])) for key in ("test_bleu_src2tgt", "test_bleu_tgt2src")]
    stages = [run.info.run_name for run in runs if run.data.tags.get("mlflow.parentRunId") == pipeline.info.run_id]
    runs_table = [*TEST_COLUMNS[:2], *(value for _, value in test_bleu)]  # the view's columns, the pipeline run's values
    return links, {"runs": [run.info.run_name for run in runs] + ["Sort: test_bleu_src2tgt", *runs_table],
                   "pipeline": [pipeline.info.run_name, *stages, *(f"{key}{value}" for key, value in test_bleu)],
                   "run": [train.info.run_name, 'alt="training.png"'],
                   "model": [model, "Version 1", "champion"],  # the alias on its version
                   # the evaluate run's translations table, its columns
                   "translations": ["translations/test.json", "hypothesis_src2tgt", "bleu_src2tgt", "chrf_tgt2src"],
                   # the Dataset column names what the train run read; its system metrics' charts
                   "datasets": ["Dataset", *datasets],
                   "system": [train.info.run_name, "System metrics", "system/node_0"],
                   # the train run's kept checkpoints by name, and the pyfunc it registered
                   "models": sorted(m.name for m in models if m.source_run_id == train.info.run_id),
                   "compare": compare_texts(trials)}


@contextlib.contextmanager
def mlflow_ui(store: str, timeout_s: float = 120.0) -> Iterator[str]:
    """`mlflow ui` on backend store `store` (a sqlite:/// URI) on a free loopback port; yields its base URL."""
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    log = tempfile.TemporaryFile()
    # One worker: uvicorn's supervisor of several kills a worker that answers its ping late, and on a loaded 2-core
    # machine every worker still importing MLflow did, again and again ("Child process died"); one page at a time
    # needs no more. MLflow's job execution (a job runner and Huey consumers, each importing MLflow: GenAI
    # scorers, nothing these pages show) off unless the environment turns it on, as the head's server runs.
    server = subprocess.Popen([str(mlflow), "ui", "--backend-store-uri", store, "--host", "127.0.0.1", "--port",
                               str(port), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True, env={JOB_EXECUTION_ENV: "false", **os.environ})
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(base + "health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"mlflow ui did not answer on {base}: {log.read()[-2000:].decode(errors='replace')}")
            time.sleep(0.5)
        yield base
    finally:
        os.killpg(server.pid, 15)  # its uvicorn workers too
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:  # a loaded machine: not stopped in 30 s
            os.killpg(server.pid, 9)
            server.wait(30)
        log.close()


def browse(url: str, screenshot: Path | None = None, budget_ms: int = 15000, window: str = "1500,900",
           cache: Path | None = None) -> str:
    """The page's DOM after `budget_ms` of virtual time in headless Chromium (and its screenshot). Each call starts
    from an empty profile (no page sees the UI state another stored); `cache`, a directory kept between calls
    (`browser_cache`), holds Chromium's HTTP and code caches, which spare the next page of the same server the
    loading and compiling of MLflow's scripts."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("chromium is not installed (Debian: apt-get install -y chromium)")
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={window}",
              f"--virtual-time-budget={budget_ms}", *([f"--disk-cache-dir={cache}"] if cache is not None else [])]
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=True).stdout
    if screenshot is not None:
        subprocess.run([*common, f"--screenshot={screenshot}", url], capture_output=True, timeout=180, check=True)
    return dom


@contextlib.contextmanager
def browser_cache() -> Iterator[Path]:
    """A temporary cache directory for the pages of one `mlflow ui` (`browse`'s `cache`): on a loaded 2-core machine
    a page took 2.6-3.5 s and 1.6-1.8 CPU-s with MLflow's scripts cached, 4.6-6.4 s and 2.2-2.3 CPU-s without."""
    with tempfile.TemporaryDirectory(prefix="chromium-cache-") as directory:
        yield Path(directory)


def missing_texts(dom: str, texts: list[str]) -> list[str]:
    """The `texts` found neither in the DOM nor in its text (tags removed: a table cell's name and value meet)."""
    text = re.sub(r"<[^>]+>", "", dom)
    return [t for t in texts if t not in dom and t not in text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="a finished run's workdir (its mlflow.db)")
    parser.add_argument("--out", default="", help="write mlflow_<page>.png screenshots here")
    parser.add_argument("--dom", default="", help="write each page's DOM here as mlflow_<page>.html")
    parser.add_argument("--budget-ms", type=int, default=15000)
    args = parser.parse_args(argv)
    import mlflow

    store = f"sqlite:///{Path(args.workdir).resolve() / 'mlflow.db'}"
    mlflow.set_tracking_uri(store)
    links, expected = expected_texts(mlflow.search_runs(experiment_names=["duplex"], output_format="list"))
    report = {}
    with mlflow_ui(store) as base, browser_cache() as cache:
        for page, fragment in links.items():
            started = time.monotonic()
            shot = Path(args.out) / f"mlflow_{page}.png" if args.out else None
            dom = browse(base + fragment, shot, args.budget_ms, WINDOWS.get(page, "1500,900"), cache)
            if args.dom:
                Path(args.dom, f"mlflow_{page}.html").write_text(dom, encoding="utf-8")
            report[page] = {"url": base + fragment, "seconds": round(time.monotonic() - started, 1),
                            "missing": missing_texts(dom, expected[page])}
    if args.out:  # 64-colour palettes: a third of the bytes, the same page to the eye
        from PIL import Image

        for page in links:
            shot = Path(args.out) / f"mlflow_{page}.png"
            Image.open(shot).convert("RGB").quantize(colors=64).save(shot, optimize=True)
    print(json.dumps(report, indent=1))
    return 0 if not any(entry["missing"] for entry in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
