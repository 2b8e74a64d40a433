"""What the MLflow UI shows: the runs table's saved view "Test BLEU" and the link that opens it."""
from __future__ import annotations

import json

# The runs table's saved view "Test BLEU": MLflow 3.17's experiment page restores the view saved as the
# experiment tag `mlflow.sharedViewState.<key>` when its URL says `?viewStateShareKey=<key>` (`runs_page`), and
# lists it under "Views". Its state: the metric columns TEST_COLUMNS (the table's default columns — Source,
# Models, Dataset — left out: four metric columns fit beside the run names) and the sort, by test BLEU src2tgt,
# best first (sorted by a metric, the table lists the stage runs flat, each with its name, instead of folded
# under their pipeline run). The tag's value is the UI's envelope {name, createdAt, updatedAt, state}, `state`
# being the JSON of the view's search facets and UI state (the UI also reads it deflated: "deflate;<base64>").
RUNS_VIEW_KEY = "duplex-test-bleu"
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
TEST_COLUMNS = ("test_bleu_src2tgt", "test_bleu_tgt2src", "test_chrf_src2tgt", "test_chrf_tgt2src")


def runs_view(created_ms: int) -> dict[str, str]:
    """The experiment tag of the saved view "Test BLEU" ({tag: value}), saved at `created_ms` (Unix ms)."""
    state = {"orderByKey": f"metrics.`{TEST_COLUMNS[0]}`", "orderByAsc": False,
             "selectedColumns": [f"metrics.`{key}`" for key in TEST_COLUMNS]}
    envelope = {"name": "Test BLEU", "createdAt": created_ms, "updatedAt": created_ms, "state": json.dumps(state)}
    return {SHARED_VIEW_PREFIX + RUNS_VIEW_KEY: json.dumps(envelope)}


def runs_page(experiment_id: str) -> str:
    """The URL fragment (after `http://host:port/`) of the experiment's runs table in the saved view "Test BLEU",
    in the "Model training" pages (`workflowType`: without it 3.17 opens the GenAI overview)."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={RUNS_VIEW_KEY}&workflowType=machine_learning"
