"""A pipeline invocation's runs (`Tracker`): one parent run, one nested run per stage that runs, and the datasets
each training run read."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import TrackingConfig
from pipeline.metrics import HEADLINE, shown, test_splits
from pipeline.stage import read_manifest
from pipeline.tracking.registry import ALIAS_TAGS, TRAIN_DIR_TAG, beats, log_translator
from pipeline.tracking.store import (STAGE_TAG, close_orphans, close_tree, config_params, ensure_experiment, numeric,
                                     open_client, owner_tags, run_name, tracking_uri, words)

log = logging.getLogger(__name__)

CHECKPOINT_MODEL_TYPE = "checkpoint"  # the LoggedModels of a training stage's kept checkpoints (`log_checkpoints`)


class Tracker:
    """Opens the parent run at the first stage that actually runs (a run that skips everything opens
    nothing); a stage that fails leaves both runs FAILED with the error. The parent run is tagged with this
    process's host and pid: the next invocation closes KILLED what a killed process left RUNNING
    (`close_orphans`). Disabled: every method does nothing."""

    def __init__(self, cfg: TrackingConfig, workdir: Path, config: dict[str, Any], config_yaml: str = "",
                 target: str = "") -> None:
        """`target`: the directory name of the invocation's last stage (`evaluate-<hash>`), whose hash names
        the parent run."""
        self.cfg = cfg
        self.workdir = Path(workdir).resolve()
        self.uri = tracking_uri(cfg, workdir)
        self.config = config
        self.config_yaml = config_yaml
        self.target = target
        self.run_id: str | None = None
        self.stage_run_id: str | None = None
        self.stage: str = ""
        self.directory: str = ""  # the stage's output directory's name
        self.validation: Any = None  # the stage run's validation dataset, as MLflow logged it (`log_datasets`)

    def begin_stage(self, stage: str, directory: str = "") -> None:
        """Start the nested run of `stage`, named by its output `directory` (and the parent run, the first time)."""
        if not self.cfg.enabled:
            return
        import mlflow

        if self.run_id is None:
            mlflow.set_tracking_uri(self.uri)
            client = open_client(self.uri)
            close_orphans(client, ensure_experiment(client, self.cfg.experiment, self.workdir))
            mlflow.set_experiment(self.cfg.experiment)
            digest = self.target.rsplit("-", 1)[-1] if "-" in self.target else ""
            self.run_id = mlflow.start_run(run_name=run_name(self.cfg, "pipeline", digest),
                                           tags={STAGE_TAG: "pipeline", **owner_tags()}).info.run_id
            mlflow.log_params(config_params(self.config))
            if self.config_yaml:
                mlflow.log_text(self.config_yaml, "config.yaml")
        self.stage, self.directory, self.validation = stage, directory or stage, None
        self.stage_run_id = mlflow.start_run(run_name=run_name(self.cfg, directory or stage), nested=True,
                                             tags={STAGE_TAG: stage}).info.run_id

    def worker_target(self) -> dict[str, Any] | None:
        """Where Ray workers log their per-step metrics (absolute URI, the current stage's run), and how often the
        first worker of each node samples the system metrics into it (`system_metrics_s`, 0: never)."""
        if not self.cfg.enabled or self.stage_run_id is None:
            return None
        interval = self.cfg.system_metrics_interval_s if self.cfg.system_metrics else 0
        return {"uri": self.uri, "run_id": self.stage_run_id, "system_metrics_s": interval}

    def log_checkpoints(self, kept: list[dict[str, Any]]) -> list[str]:
        """Each checkpoint the stage's fit kept (`raytrain.kept_checkpoint`) as an MLflow LoggedModel by reference
        (`mlflow.create_external_model`: its files stay where Ray Train keeps them, param `checkpoint` names them),
        named `<stage directory>-step-<step>`, of model type "checkpoint", its step a param, an output of the stage's
        run at that step; its validation scores are linked to it and to the run's validation dataset: the very
        points the workers logged into the run at that step (logged again with their timestamps, which MLflow's
        store keeps once: the run's history is unchanged), or new points where the run has none (a teacher's
        direction's scores, which its direction's run holds). `mlflow.search_logged_models` ranks them (by
        `valid_bleu`, the mean of both directions); the experiment's Models tab lists them. Returns their ids."""
        if self.stage_run_id is None or not kept:
            return []
        import mlflow
        from mlflow.entities import LoggedModelOutput, Metric

        client = mlflow.MlflowClient(self.uri)
        logged = {key: {point.step: point for point in client.get_metric_history(self.stage_run_id, key)}
                  for key in {key for record in kept for key in record["validation"]}}
        dataset = {"dataset_name": self.validation.name, "dataset_digest": self.validation.digest} \
            if self.validation is not None else {}
        ids = []
        for record in sorted(kept, key=lambda r: r["step"]):
            step = record["step"]
            model = mlflow.create_external_model(
                name=f"{self.directory}-step-{step}", source_run_id=self.stage_run_id,
                params={"step": str(step), "checkpoint": record["uri"]}, tags={STAGE_TAG: self.stage},
                model_type=CHECKPOINT_MODEL_TYPE)
            points = []
            for key, value in record["validation"].items():
                point = logged[key].get(step)
                same = point is not None and math.isclose(point.value, value, rel_tol=1e-9, abs_tol=1e-12)
                points.append(Metric(key, point.value if same else value,
                                     point.timestamp if same else int(time.time() * 1000), step,
                                     model_id=model.model_id, **dataset))
            client.log_batch(self.stage_run_id, metrics=points)
            client.log_outputs(self.stage_run_id, [LoggedModelOutput(model.model_id, step)])
            ids.append(model.model_id)
        return ids

    def end_stage(self, output: Path, counts: dict[str, Any], artifacts: list[Path], model: Path | None = None) -> None:
        """Close the stage's nested run with its config (the manifest's: what its hash covers) as params, its
        counts as metrics and files/directories as artifacts; `model`, a model directory, is logged as the
        pyfunc that translates (`log_translator`: a LoggedModel, whose version `tracking.registered_model`
        registers)."""
        if self.stage_run_id is None:
            return
        import mlflow

        mlflow.set_tag("output", str(output))
        mlflow.log_params(config_params(read_manifest(output)["config"]))  # what this stage's hash covers
        mlflow.log_metrics(numeric(counts))
        mlflow.set_tags(words(counts))
        for path in artifacts:
            if path.is_file():
                mlflow.log_artifact(str(path))
            elif path.is_dir():
                mlflow.log_artifacts(str(path), artifact_path=path.name)
        if model is not None:
            languages = (self.config["data"]["src_lang"], self.config["data"]["tgt_lang"])
            registered = self.cfg.registered_model.format(src=languages[0], tgt=languages[1])
            with contextlib.redirect_stderr(io.StringIO()):  # MLflow prints "Successfully registered model ..."
                info = log_translator(model, languages, registered)
            uri = f"models:/{registered}/{info.registered_model_version}" if registered else info.model_uri
            if registered:  # which version this train stage's model is, for the alias after its evaluation
                mlflow.MlflowClient(self.uri).set_model_version_tag(registered, str(info.registered_model_version),
                                                                    TRAIN_DIR_TAG, str(output))
            mlflow.set_tag("model_uri", uri)
            log.info("%s: model logged to MLflow as %s (a pyfunc that translates both ways)", self.stage, uri)
        mlflow.end_run(status="FINISHED")
        self.stage_run_id = None

    def log_datasets(self, datasets: list[Dataset]) -> None:
        """Log `datasets` as the current stage run's inputs (mlflow.log_input of a metadata-only dataset: its name,
        digest and source, the runs table's Dataset column; the data stays in the workdir)."""
        if self.stage_run_id is None:
            return
        import warnings

        import mlflow
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        for dataset in datasets:
            with warnings.catch_warnings():  # "can be interpreted in multiple ways": both are the local source
                warnings.simplefilter("ignore", UserWarning)
                source = resolve_dataset_source(str(dataset.source))
            logged = MetaDataset(source, name=dataset.name, digest=dataset.digest)
            mlflow.log_input(logged, context=dataset.context)
            if dataset.context == "validation":
                self.validation = logged

    def log_tables(self, directory: Path) -> None:
        """Log every `<name>.json` of `directory` (a dict of columns) into the current stage's run as an MLflow table
        `<directory name>/<name>.json` (the evaluate stage's translations: the UI shows them sortable)."""
        if self.stage_run_id is None or not directory.is_dir():
            return
        import mlflow

        for path in sorted(directory.glob("*.json")):
            mlflow.log_table(json.loads(path.read_text(encoding="utf-8")), f"{directory.name}/{path.name}",
                             run_id=self.stage_run_id)

    def log_results(self, results: dict[str, Any]) -> None:
        """Headline metrics on the parent run (the current stage run gets them from its counts)."""
        if self.run_id is None:
            return
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.uri)
        sets = results.get("sets", {results["split"]: results})  # a results.json from before the named test sets: one split
        for split in test_splits(results):
            for key in HEADLINE:
                if sets[split].get(key) is not None:
                    client.log_metric(self.run_id, f"{split}_{key}", shown(key, float(sets[split][key])))
        for key in ("bleu_signature", "chrf_signature"):
            if key in results:
                client.set_tag(self.run_id, key, results[key])

    def promote(self, results: dict[str, Any], train_dir: Path) -> str:
        """Record an evaluation's test scores on the registered version of `train_dir`'s model and move
        `tracking.alias` to it when it beats the holder (`beats`); returns what was done, "" when there is no
        registered version or no alias."""
        if self.run_id is None or not self.cfg.alias or not self.cfg.registered_model:
            return ""
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        name = self.cfg.registered_model.format(src=results["src_lang"], tgt=results["tgt_lang"])
        client = MlflowClient(self.uri)
        try:
            versions = [v for v in client.search_model_versions(f"name = '{name}'")
                        if v.tags.get(TRAIN_DIR_TAG) == str(train_dir)]
        except MlflowException:  # no such registered model
            return ""
        if not versions:
            return ""
        version = max(versions, key=lambda v: int(v.version))
        split = results["split"]
        row = results.get("sets", {}).get(split, results)
        scores = {ALIAS_TAGS[0]: row["bleu_src2tgt"], ALIAS_TAGS[1]: row["bleu_tgt2src"],
                  ALIAS_TAGS[2]: row.get("references_sha256", ""), "test_split": split}
        for key, value in scores.items():
            client.set_model_version_tag(name, version.version, key, str(value))
        try:
            holder = client.get_model_version_by_alias(name, self.cfg.alias)
        except MlflowException:
            holder = None
        if holder is not None and holder.version == version.version:
            return f"models:/{name}@{self.cfg.alias} is version {version.version} already"
        better, why = beats({k: str(v) for k, v in scores.items()}, holder.tags if holder is not None else None)
        where = f"models:/{name}@{self.cfg.alias}"
        if not better:
            message = f"{where} stays version {holder.version}: version {version.version} {why}"
        else:
            client.set_registered_model_alias(name, self.cfg.alias, version.version)
            message = f"{where} moved to version {version.version}: {why}"
        client.set_tag(self.run_id, "alias", message)
        log.info("%s", message)
        return message

    def abandon(self) -> None:
        """Forget the open runs without a word to the store, whose server is gone (`TrackingLost`): the next run
        closes them (`close_orphans`). MLflow's exit hook would otherwise end them, retrying the dead server."""
        if self.run_id is None:
            return
        from mlflow.environment_variables import MLFLOW_RUN_ID
        from mlflow.tracking import fluent

        fluent._active_run_stack.get().clear()  # private: MLflow's fluent API has no way to drop a run unended
        MLFLOW_RUN_ID.unset()
        self.run_id = self.stage_run_id = None

    def close(self, failed: bool = False, error: str = "", killed: bool = False) -> None:
        """End the open runs; a failure marks them FAILED (`killed`, an interruption: KILLED) with the error
        text as the `error` tag."""
        if self.run_id is None:
            return
        import mlflow

        status = "KILLED" if killed else "FAILED" if failed else "FINISHED"
        if error:
            mlflow.set_tag("error", error[:5000])  # the innermost open run: the failing stage's
            if self.stage_run_id is not None:
                mlflow.MlflowClient(self.uri).set_tag(self.run_id, "error", error[:5000])
        if self.stage_run_id is not None:
            if failed or killed:  # with the runs the stage opened under its own (a teacher direction's)
                close_tree(mlflow.MlflowClient(self.uri), mlflow.active_run().info.experiment_id,
                           self.stage_run_id, status, error or status)
            mlflow.end_run(status=status)
            self.stage_run_id = None
        mlflow.end_run(status=status)


@dataclass(frozen=True)
class Dataset:
    """A corpus a run read, as MLflow records it (`Tracker.log_datasets`): `name` (`multi30k-en-de-train-distilled`),
    `digest` (of its files), `source` (its directory or file) and `context` (training, validation, evaluation)."""

    name: str
    digest: str
    source: Path
    context: str


def stage_datasets(cfg: Any, stage: str, inputs: dict[str, Path]) -> list[Dataset]:
    """What a training stage's run read (`inputs`: its input directories by label): the train split, `raw` (the
    tokenized corpus) or `distilled` (the teachers' KD pairs), and the validation split; none for other stages."""
    from pipeline.stage import split_digest

    if stage not in ("teacher", "train", "cmlm") or stage == "teacher" and cfg.teacher.src2tgt_checkpoint:
        return []  # not a training stage, or teachers given, not trained
    corpus = f"{cfg.data.source}-{cfg.data.src_lang}-{cfg.data.tgt_lang}"
    data = inputs["data"]
    kind = "distilled" if data.name.startswith("distill-") else "raw"
    valid = inputs.get("tokenize", data)  # teacher: its data is tokenize's
    return [Dataset(f"{corpus}-train-{kind}", split_digest(data, "train"), data / "train", "training"),
            Dataset(f"{corpus}-valid", split_digest(valid, "valid"), valid / "valid", "validation")]
