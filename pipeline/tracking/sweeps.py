"""A sweep's runs (`SweepTracker`): one parent run per sweep, one nested run per trial, named by its values."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import TrackingConfig
from pipeline.tracking.store import STAGE_TAG, TRIAL_METRICS, child_run, close_orphans, config_params, ensure_experiment, finish_child_run, numeric, open_client, owner_tags, run_name, tracking_uri, validation_metric

# Short names of common searched keys in trial run names; any other key goes by its last part.
SHORT_KEYS = {"loss.lambda_fba": "λfba", "loss.lambda_cc": "λcc", "model.upsample_ratio": "upsample",
              "loss.aux_start_step": "aux_start", "train.seed": "seed"}


def trial_name(params: dict[str, Any]) -> str:
    """A trial's run name from its sampled values, e.g. `lr=0.002 λfba=0.1` (4 significant digits)."""
    def value(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return " ".join(f"{SHORT_KEYS.get(k, k.rsplit('.', 1)[-1])}={value(v)}" for k, v in sorted(params.items())) or "trial"


@dataclass(frozen=True)
class SweepTracker:
    """The MLflow runs of a tune sweep: a parent run "tune" (the base config as params) and one nested run
    per trial, named by its values (`lr=0.002 λfba=0.1`; tag `trial_id`, its sampled values as params, its per-step training metrics and
    best validation). Trials stopped early are closed FINISHED with the tag `stopped_early`, failed ones
    FAILED with the tag `error`. Only strings inside: Ray ships it to the trials."""

    uri: str
    experiment_id: str
    parent_run_id: str

    @classmethod
    def open(cls, cfg: TrackingConfig, workdir: Path, name: str, config: dict[str, Any],
             config_yaml: str, resume: bool = False) -> SweepTracker | None:
        """Start the sweep's parent run (tag `tune_dir` = `name`); with `resume`, reopen the latest such run
        (an interrupted sweep's) instead. None when tracking is off."""
        if not cfg.enabled:
            return None
        uri = tracking_uri(cfg, workdir)
        client = open_client(uri)
        experiment_id = ensure_experiment(client, cfg.experiment, workdir)
        close_orphans(client, experiment_id)
        earlier = client.search_runs([experiment_id], f"tags.tune_dir = '{name}' and tags.`{STAGE_TAG}` = 'tune'",
                                     order_by=["attributes.start_time DESC"], max_results=1) if resume else []
        if earlier:
            parent = earlier[0].info.run_id
            client.update_run(parent, "RUNNING")
            for key, value in owner_tags().items():
                client.set_tag(parent, key, value)
            return cls(uri, experiment_id, parent)
        parent = client.create_run(experiment_id, run_name=run_name(cfg, name),
                                   tags={"tune_dir": name, STAGE_TAG: "tune", **owner_tags()}).info.run_id
        for key, value in config_params(config).items():
            client.log_param(parent, key, value)
        client.log_text(parent, config_yaml, "config.yaml")
        return cls(uri, experiment_id, parent)

    def trial_run(self, trial_id: str, params: dict[str, Any]) -> dict[str, str]:
        """The worker target ({"uri", "run_id"}) of trial `trial_id`'s run: created with `params` the first
        time, the same run again (RUNNING again) when Tune retries or a --resume continues the trial."""
        client = self._client()
        found = client.search_runs([self.experiment_id],
                                   f"tags.trial_id = '{trial_id}' and tags.mlflow.parentRunId = '{self.parent_run_id}'")
        if found:
            if found[0].info.status != "RUNNING":
                client.update_run(found[0].info.run_id, "RUNNING")
            return {"uri": self.uri, "run_id": found[0].info.run_id}
        target = child_run({"uri": self.uri, "run_id": self.parent_run_id}, trial_name(params),
                           {"trial_id": trial_id, STAGE_TAG: "trial"})
        for key, value in params.items():
            client.log_param(target["run_id"], key, value)
        return target

    def tag_error(self, target: dict[str, str], error: BaseException) -> None:
        """Tag a trial's run with the error that interrupted it; the run stays open (see `close_trials`)."""
        self._client().set_tag(target["run_id"], "error", f"{type(error).__name__}: {error}"[:5000])

    def finish_trial(self, target: dict[str, str], best: dict[str, Any] | None) -> None:
        """Close a trial's run FINISHED with the BLEU of its best validation report (if any)."""
        finish_child_run(target, {validation_metric(key): float(best[key]) for key in TRIAL_METRICS if best and key in best})

    def close_trials(self, rows: list[dict[str, Any]], failed: bool = False, killed: bool = False) -> None:
        """Close the trial runs still open by Tune's verdict, `rows` being the sweep's trials (trial_id, status
        "finished", "stopped early", "error", "unfinished" or "not run", TRIAL_METRICS): trials that Tune
        stopped never reach `finish_trial` (ASHA also stops the trials that reach max_t, on their last
        report). `failed` (the sweep itself failed): every open run and the parent are closed FAILED;
        `killed` (interrupted): the trials Tune did not end, and the parent, KILLED (a --resume reopens them)."""
        client = self._client()
        by_trial = {row["trial_id"]: row for row in rows}
        for run in client.search_runs([self.experiment_id], f"tags.mlflow.parentRunId = '{self.parent_run_id}'"):
            if run.info.status != "RUNNING":
                continue
            run_id = run.info.run_id
            row = by_trial.get(run.data.tags.get("trial_id", ""))
            if killed and (row is None or row["status"] in ("unfinished", "not run")):
                client.set_terminated(run_id, "KILLED")
                continue
            if row is not None:
                if row["status"] != "error" and "error" in run.data.tags:
                    client.delete_tag(run_id, "error")  # the interruption of a stopped trial
                if row["status"] == "stopped early":
                    client.set_tag(run_id, "stopped_early", "true")
                for key, value in numeric({validation_metric(key): row.get(key) for key in TRIAL_METRICS}).items():
                    client.log_metric(run_id, key, value)
            errored = failed or (row is not None and row["status"] == "error")
            client.set_terminated(run_id, "FAILED" if errored else "FINISHED")
        if failed or killed:
            client.set_terminated(self.parent_run_id, "KILLED" if killed else "FAILED")

    def publish(self, artifacts: list[Path], metrics: dict[str, Any]) -> None:
        """Log the sweep's files and numbers (best metric, trial counts) on the parent run and close it."""
        client = self._client()
        for path in artifacts:
            client.log_artifact(self.parent_run_id, str(path))
        for key, value in numeric(metrics).items():
            client.log_metric(self.parent_run_id, key, value)
        client.set_terminated(self.parent_run_id, "FINISHED")

    def _client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.uri)
