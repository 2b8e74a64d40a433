"""Connect the driver to Ray — a running cluster (`ray.address`) or a local instance started here — and
pick up the cluster file the head node writes (cluster/head.py), so that on a cluster `run_pipeline.py`
finds the Ray address, the MLflow server and the shared workdir without any option."""
from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError, PipelineConfig, RayConfig

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_FILE_ENV = "DUPLEX_CLUSTER_FILE"


def cluster_file_path() -> Path:
    """$DUPLEX_CLUSTER_FILE, else ~/.duplex/cluster.json."""
    return Path(os.environ.get(CLUSTER_FILE_ENV) or Path.home() / ".duplex" / "cluster.json").expanduser()


def read_cluster_file() -> dict[str, Any] | None:
    """The head's cluster file (keys `ray_address`, `tracking_uri`, `shared_dir`), or None off a cluster."""
    path = cluster_file_path()
    if not path.is_file():
        return None
    info = json.loads(path.read_text(encoding="utf-8"))
    missing = [key for key in ("ray_address", "tracking_uri", "shared_dir") if not info.get(key)]
    if missing:
        raise ConfigError(f"{path}: cluster file lacks {missing}; rewrite it with `python -m cluster.head start`")
    return info


def cluster_overrides(cfg: PipelineConfig) -> list[str]:
    """`key=value` overrides that put a run on the cluster described by the cluster file: its Ray address,
    its MLflow server and a workdir under the shared directory — each only where the config (after the
    user's own overrides) left it unset or relative. Empty off a cluster."""
    info = read_cluster_file()
    if info is None:
        return []
    overrides = []
    if not cfg.ray.address:
        overrides.append(f"ray.address={info['ray_address']}")
    if cfg.tracking.enabled and not cfg.tracking.uri and not os.environ.get("MLFLOW_TRACKING_URI"):
        overrides.append(f"tracking.uri={info['tracking_uri']}")
    if not Path(cfg.workdir).is_absolute():
        overrides.append(f"workdir={Path(info['shared_dir']) / cfg.workdir}")
    return overrides


def ensure_ray(cfg: RayConfig, dashboard: bool = False) -> None:
    """Initialise Ray once per process; a no-op when the caller (or a test fixture) already did.
    `dashboard`: start the dashboard with a local instance (Tune sweeps need it, see below)."""
    import ray

    if ray.is_initialized():
        return
    if cfg.address:
        # Workers on other machines import `pipeline` from the shipped working directory.
        ray.init(address=cfg.address, runtime_env={
            "working_dir": str(REPO_ROOT), "excludes": [".venv/", ".git/", "runs/", "*.parquet"]})
    else:
        # The dashboard serves the State API, through which Ray Train V2's PlacementGroupCleaner sees a
        # dead controller: without it, a Tune trial stopped by ASHA leaks its workers' placement group and
        # the next trials wait for CPUs forever. A plain run does without its processes.
        kwargs = {"include_dashboard": dashboard}
        if cfg.num_cpus:
            kwargs["num_cpus"] = cfg.num_cpus
        if cfg.object_store_memory_mb:
            kwargs["object_store_memory"] = cfg.object_store_memory_mb * 1024 * 1024
        ray.init(**kwargs)
    log.info("ray: %s CPUs available", ray.available_resources().get("CPU", 0))


def check_shared_storage(workdir: Path, timeout_s: float = 120.0) -> int:
    """Fail fast unless every alive node sees `workdir` (stage outputs and Ray Train checkpoints are read
    back by other nodes; Ray no longer syncs them). Writes a probe file, reads it from a zero-CPU task
    pinned to each node, removes it. Returns the number of nodes checked."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from pipeline.stage import StageError

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    probe = workdir / f".shared-probe-{token}"
    probe.write_text(token, encoding="utf-8")
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        reader = ray.remote(num_cpus=0)(_read_probe)
        pending = {reader.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                   .remote(str(probe)): n for n in nodes}
        ready, late = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
        blind = [pending[ref]["NodeManagerAddress"] for ref in ready if ray.get(ref) != token]
        blind += [f"{pending[ref]['NodeManagerAddress']} (no answer in {timeout_s:.0f} s)" for ref in late]
    finally:
        probe.unlink(missing_ok=True)
    if blind:
        raise StageError(f"workdir {workdir} is not on storage every node shares: nodes {blind} cannot read "
                         f"it. Put the workdir on the cluster's shared file system (docs/cluster.md).")
    return len(nodes)


def _read_probe(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as error:
        return f"unreadable: {error}"


def prepare_cluster_run(cfg: PipelineConfig) -> None:
    """On a running cluster (`ray.address` set): connect, then check the workdir is shared storage."""
    if cfg.ray.address:
        ensure_ray(cfg.ray)
        nodes = check_shared_storage(Path(cfg.workdir))
        log.info("cluster: %d nodes see the workdir %s", nodes, Path(cfg.workdir).resolve())
