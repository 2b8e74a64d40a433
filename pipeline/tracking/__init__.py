"""MLflow tracking, by what it does: `store` (the store, runs opened and closed, names and params), `runs` (a
pipeline invocation's runs, `Tracker`), `registry` (the published model and its alias), `sweeps` (a sweep's runs,
`SweepTracker`), `plots` (training curves) and `views` (what the MLflow UI opens on).

 one parent run per pipeline invocation, one nested run per stage that runs.

The parent run carries the whole config flattened as params, the resolved config YAML and the headline
test results (`test_bleu_src2tgt`, `test_bleu_tgt2src`, chrF, round-trip BLEU). Each stage's nested run
carries its counts as metrics and its reports as artifacts; the train stage's run also gets the per-step
metrics (logged by rank 0 of the Ray Train worker group straight into that run; validation BLEU as
`valid_bleu_*`), the SentencePiece model, a PNG of the loss terms and validation BLEU, and the final averaged
model as a registered MLflow model that translates (`log_translator`, pipeline/mlflow_model.py); each checkpoint a
training stage kept is a LoggedModel by reference with its validation scores (`Tracker.log_checkpoints`); the evaluate
stage's run gets the hypotheses and results.json. Runs are named `<run_prefix>-<stage directory>` and tagged
`duplex.stage` (`run_name`, `STAGE_TAG`).

A tune sweep has its own parent run `<run_prefix>-tune-<hash>` with one nested run per trial (`SweepTracker`).

The store defaults to an embedded sqlite file in the workdir (`sqlite:///<workdir>/mlflow.db`, artifacts
in `<workdir>/mlartifacts`); `tracking.uri` or $MLFLOW_TRACKING_URI point at a server instead. Browse the
local store with `mlflow ui --backend-store-uri sqlite:///<workdir>/mlflow.db`; the experiment carries a saved
view of its runs table, "Test BLEU" (`runs_view`, opened by `runs_page`'s link, which a run's summary prints).
"""
