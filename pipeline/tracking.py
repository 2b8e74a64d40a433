"""MLflow tracking for the stages run so far: one parent run per invocation, one nested run per stage.

The store defaults to an embedded sqlite file in the workdir (`sqlite:///<workdir>/mlflow.db`, artifacts
beside it); `tracking.uri` or $MLFLOW_TRACKING_URI point at a server instead. Browse the local store with
`mlflow ui --backend-store-uri sqlite:///<workdir>/mlflow.db`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipeline.config import TrackingConfig


def tracking_uri(cfg: TrackingConfig, workdir: Path) -> str:
    return cfg.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(workdir).resolve()}/mlflow.db"


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and scalars stay leaves."""
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in value.items():
        flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


class Tracker:
    """Records stage counts. The parent run starts at the first stage that actually ran, so a run that
    fails on its input (or skips everything) does not open MLflow at all; disabled: does nothing."""

    def __init__(self, cfg: TrackingConfig, workdir: Path, config: dict[str, Any]) -> None:
        self.cfg = cfg
        self.uri = tracking_uri(cfg, workdir)
        self.artifacts = (Path(workdir).resolve() / "mlartifacts").as_uri()
        self.config = config
        self.run_id: str | None = None

    def log_stage(self, stage: str, output: Path, counts: dict[str, Any], artifacts: list[Path]) -> None:
        """A nested run for `stage`: numeric counts as metrics, the output dir as a tag, reports attached."""
        if not self.cfg.enabled:
            return
        import mlflow

        if self.run_id is None:
            mlflow.set_tracking_uri(self.uri)
            if mlflow.get_experiment_by_name(self.cfg.experiment) is None:
                local = self.uri.startswith("sqlite:")
                mlflow.create_experiment(self.cfg.experiment, artifact_location=self.artifacts if local else None)
            mlflow.set_experiment(self.cfg.experiment)
            self.run_id = mlflow.start_run(run_name="pipeline").info.run_id
            mlflow.log_params({k: str(v)[:500] for k, v in flatten(self.config).items()})
        with mlflow.start_run(run_name=stage, nested=True):
            mlflow.set_tag("output", str(output))
            metrics = {k: float(v) for k, v in flatten(counts).items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            mlflow.log_metrics(metrics)
            for path in artifacts:
                if path.is_file():
                    mlflow.log_artifact(str(path))

    def close(self, failed: bool = False) -> None:
        if self.run_id is not None:
            import mlflow

            mlflow.end_run(status="FAILED" if failed else "FINISHED")
