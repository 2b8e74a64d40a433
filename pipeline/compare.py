"""`duplex-compare RUN_A RUN_B`: is run B better than run A? sacreBLEU's paired significance test per test set and
direction, on the two runs' hypotheses as MLflow keeps them.

    duplex-compare RUN_A RUN_B [--tracking-uri URI] [--test bs|ar] [--samples N] [--decoder greedy] [--sets test,...]

RUN_A (the baseline) and RUN_B are MLflow run ids of pipeline runs (their evaluate stage's run is read) or of
evaluate runs. From each: results.json, the hypotheses `<set>.<direction>.<decoder>.txt` and the references of
the translations tables (`translations/<set>.json`, MLflow tables). Every set both runs scored on the same references
is compared both ways with `sacrebleu.significance.PairedTest` — paired bootstrap resampling (`bs`, sacreBLEU's
`--paired-bs`, 1000 resamples) or approximate randomisation (`ar`, `--paired-ar`, 10000 trials) — for BLEU and
chrF, with sacreBLEU's defaults (signatures printed). A line per set, direction and metric: A's score, B's (with
the bootstrap's mean ± 95% CI), the difference and its p-value; "B better" / "B worse" when p < 0.05.
The store is --tracking-uri, else $MLFLOW_TRACKING_URI (`sqlite:///runs/<name>/mlflow.db` for a local run).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipeline.tracking.store import STAGE_TAG
from reder import DIRECTIONS

SIGNIFICANCE = 0.05


class CompareError(RuntimeError):
    """A run that cannot be compared; the message says why."""


def evaluate_run(client: Any, run_id: str) -> Any:
    """The evaluate run that `run_id` names: itself, or a pipeline run's latest finished evaluate run."""
    run = client.get_run(run_id)
    stage = run.data.tags.get(STAGE_TAG, "")
    if stage == "evaluate":
        return run
    if stage != "pipeline":
        raise CompareError(f"run {run_id} is a {stage or 'foreign'} run: give a pipeline run or an evaluate run")
    found = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}' and "
                               f"tags.`{STAGE_TAG}` = 'evaluate' and attributes.status = 'FINISHED'",
                               order_by=["attributes.start_time DESC"], max_results=1)
    if not found:
        raise CompareError(f"pipeline run {run_id} has no finished evaluate run (its evaluation was skipped or "
                           f"failed: give the run that evaluated)")
    return found[0]


def read_run(client: Any, run: Any, decoder: str, directory: Path) -> dict[str, dict[str, Any]]:
    """{set: {"references": {direction: lines}, "hypotheses": {direction: lines}}} of an evaluate run."""
    import pandas
    from mlflow.artifacts import download_artifacts

    run_id = run.info.run_id

    def fetch(path: str) -> Path:
        return Path(download_artifacts(run_id=run_id, artifact_path=path, dst_path=str(directory / run_id),
                                       tracking_uri=client.tracking_uri))

    results = json.loads(fetch("results.json").read_text(encoding="utf-8"))
    logged = {artifact.path for artifact in client.list_artifacts(run_id)}
    sets = {}
    for name in results.get("sets", {results["split"]: None}):
        table_path = f"translations/{name}.json"
        hypotheses = {d: f"{name}.{d}.{decoder}.txt" for d in DIRECTIONS}
        if not all(path in logged for path in hypotheses.values()):
            continue  # another decoder set
        try:  # the set's MLflow table (mlflow.log_table writes pandas' "split" JSON): its source and reference columns
            table = pandas.read_json(io.StringIO(fetch(table_path).read_text(encoding="utf-8")), orient="split")
        except Exception as error:  # a run from before the tables: no references kept
            raise CompareError(f"run {run_id} has no table {table_path} (evaluated before the pipeline kept its translations as tables?): {error}") from error
        sets[name] = {"references": {"src2tgt": table["reference"].tolist(), "tgt2src": table["source"].tolist()},
                      "hypotheses": {d: fetch(path).read_text(encoding="utf-8").splitlines() for d, path in hypotheses.items()}}
    return sets


def compare(baseline: dict[str, dict], system: dict[str, dict], test: str, samples: int,
            sets: list[str] | None = None) -> tuple[list[dict[str, Any]], dict[str, str], list[str]]:
    """Paired tests of `system` against `baseline` (`read_run`'s) on every common set both ways: (rows, sacreBLEU's
    signatures, notes on sets left out)."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    rows, signatures, notes = [], {}, []
    names = [name for name in baseline if name in system and (not sets or name in sets)]
    for name in sorted(set(baseline) ^ set(system)):
        notes.append(f"{name}: scored by one run only")
    for name in names:
        if baseline[name]["references"] != system[name]["references"]:
            notes.append(f"{name}: the runs scored different references; not compared")
            continue
        for direction in DIRECTIONS:
            references = baseline[name]["references"][direction]
            pair = [("A", baseline[name]["hypotheses"][direction]), ("B", system[name]["hypotheses"][direction])]
            signature, results = PairedTest(pair, {"BLEU": BLEU(), "chrF": CHRF()}, [references], test_type=test,
                                            n_samples=samples)()
            signatures.update({metric: str(value) for metric, value in signature.items()})
            for metric, (a, b) in ((m, r) for m, r in results.items() if m != "System"):  # System: the names
                rows.append({"set": name, "direction": direction, "metric": metric, "a": a.score, "b": b.score,
                             "b_mean": b.mean, "b_ci": b.ci, "delta": b.score - a.score, "p_value": b.p_value,
                             "sentences": len(references)})
    return rows, signatures, notes


def verdict(row: dict[str, Any]) -> str:
    """B better / B worse where p < SIGNIFICANCE and the scores differ (sacreBLEU's p-value counts resamples whose
    difference exceeds the observed one, so two equal systems get p = 1/(n+1): no difference is none)."""
    if row["p_value"] is None or row["p_value"] >= SIGNIFICANCE or row["delta"] == 0:
        return "no significant difference"
    return "B better" if row["delta"] > 0 else "B worse"


def print_rows(rows: list[dict[str, Any]], signatures: dict[str, str], notes: list[str], test: str) -> None:
    print(f"{'set':<18} {'direction':<9} {'metric':<6} {'A':>7} {'B':>7} {'B mean ± 95% CI':>17} {'B-A':>7} "
          f"{'p':>7}  verdict (p < {SIGNIFICANCE})")
    for row in rows:
        spread = f"{row['b_mean']:.2f} ± {row['b_ci']:.2f}" if row["b_mean"] is not None else ""
        print(f"{row['set']:<18} {row['direction']:<9} {row['metric']:<6} {row['a']:>7.2f} {row['b']:>7.2f} "
              f"{spread:>17} {row['delta']:>+7.2f} {row['p_value']:>7.4f}  {verdict(row)}")
    print(f"test: {'paired bootstrap resampling' if test == 'bs' else 'paired approximate randomisation'} (sacreBLEU)")
    for metric, signature in signatures.items():
        print(f"{metric}: {signature}")
    for note in notes:
        print(f"note: {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="duplex-compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", help="the baseline: a pipeline run's or an evaluate run's MLflow id")
    parser.add_argument("run_b", help="the candidate, compared with A")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", ""),
                        help="the MLflow store (default: $MLFLOW_TRACKING_URI)")
    parser.add_argument("--test", choices=("bs", "ar"), default="bs",
                        help="paired bootstrap (bs, default) or approximate randomisation (ar)")
    parser.add_argument("--samples", type=int, default=0,
                        help="resamples (bs) or trials (ar); 0: sacreBLEU's defaults, 1000 and 10000")
    parser.add_argument("--decoder", default="greedy", help="whose hypotheses (default: greedy)")
    parser.add_argument("--sets", default="", help="comma-separated test sets (default: every set both runs scored)")
    args = parser.parse_args(argv)
    if not args.tracking_uri:
        print("error: no MLflow store: --tracking-uri sqlite:///runs/<name>/mlflow.db (or set MLFLOW_TRACKING_URI)",
              file=sys.stderr)
        return 2
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per downloaded file
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(args.tracking_uri)
    try:
        with tempfile.TemporaryDirectory() as directory:
            runs = [read_run(client, evaluate_run(client, run_id), args.decoder, Path(directory))
                    for run_id in (args.run_a, args.run_b)]
        rows, signatures, notes = compare(*runs, args.test, args.samples,
                                          [s for s in args.sets.split(",") if s] or None)
    except (CompareError, MlflowException) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not rows:
        print(f"error: no test set to compare ({'; '.join(notes) or 'no hypotheses of decoder ' + args.decoder})",
              file=sys.stderr)
        return 2
    print_rows(rows, signatures, notes, args.test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
